"""`python -m controller.uninstall_guard`: the Helm chart's pre-delete hook (docs/install.md,
"Uninstalling").

Kueue admits nothing of a ClusterQueue that lists an AdmissionCheck nobody answers: with our
controller gone, every Workload of a queue that still lists one of our checks waits for ever. So
`helm uninstall` runs this first, as a Job, and it refuses while a ClusterQueue lists one of our
checks (`spec.admissionChecksStrategy.admissionChecks`) or an
unfinished Workload still carries one in its status (a finished one waits on nothing): exit 1, one line naming each such queue and the count of
such Workloads, which the Job's log keeps and Helm reports as its failed hook. It changes nothing:
the queues are the platform team's, and which of them admitted training through our check is
theirs to decide. Exit 0 when none does; 2 when the cluster cannot be read.

Our checks are the AdmissionChecks whose `spec.controllerName` is the one our controller serves.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from toolkit import admission_checks, clusterconfig, kube, paths



def listed(queue: dict[str, Any]) -> set[str]:
    """The AdmissionChecks a ClusterQueue lists (Kueue's v1beta2, which serves v1beta1's
    `spec.admissionChecks` list as this strategy's entries)."""
    strategy = (queue.get("spec") or {}).get("admissionChecksStrategy") or {}
    return {str(entry.get("name")) for entry in strategy.get("admissionChecks") or []}


def finished(workload: dict[str, Any]) -> bool:
    """A Workload Kueue has finished: it waits on nothing, whatever checks its status still names."""
    return any(c.get("type") == "Finished" and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


def blockers(checks: set[str], queues: Iterable[dict[str, Any]], workloads: Iterable[dict[str, Any]]) -> list[str]:
    """Why an uninstall would leave queues waiting on CHECKS, a line each; empty when nothing would."""
    lines = [f"ClusterQueue {q['metadata']['name']} lists {', '.join(sorted(listed(q) & checks))}: "
             "remove it from the queue first" for q in queues if listed(q) & checks]
    waiting = sum(1 for w in workloads if not finished(w)
                  and any(e.get("name") in checks for e in (w.get("status") or {}).get("admissionChecks") or []))
    if waiting:
        lines.append(f"{waiting} unfinished Workload(s) still carry {', '.join(sorted(checks))} in their status: "
                     "wait until Kueue has removed it")
    return lines


def main() -> int:
    try:
        client = clusterconfig.load(retries=3)
        checks = admission_checks.ours(client)
        queues, _ = client.list(paths.CLUSTER_QUEUE)
        workloads, _ = client.list(paths.WORKLOAD) if checks else ([], None)
    except (clusterconfig.ConfigError, kube.ApiError) as exc:
        print(f"uninstall guard: cannot read the cluster: {exc}", file=sys.stderr)
        return 2
    found = blockers(checks, queues, workloads)
    for line in found:
        print(f"uninstall guard: {line}", file=sys.stderr)
    if found:
        print("uninstall guard: refused, nothing changed (docs/install.md, \"Uninstalling\")", file=sys.stderr)
        return 1
    print(f"uninstall guard: no ClusterQueue lists {', '.join(sorted(checks)) or 'a check of ours'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
