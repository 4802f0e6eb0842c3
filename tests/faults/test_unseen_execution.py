"""Our controller down while an outsider lowers A, and the execution below the floor ends before the
controller is back: it is flagged by the floor as it stood when its pod was created.

Plain mode. The first execution (A = 1) runs until it is held and is recorded by the controller.
Then the controller is stopped, A is raised to 2 while the TrainJob is suspended (the floor is 2),
an outsider rewrites our runtime patch back to 1 and unsuspends: the second execution runs with
A = 1, J = 0 and the same JobSet, the first one's identity exactly, and exits 0 on its own. Once
the controller is back, all it finds is an ended pod; the floor as it stands no longer judges ended
pods (the preempted execution's pods end after every raise), but the floor set by a raise more than
the clock margin before the pod's creation does (docs/adapter.md, "What detection cannot see"): the TrainJob
is flagged `below-floor`, naming the pod, the floor and the time of the raise.

The outsider may lower the floor annotation back to 1 too, in the same update: then no floor judges
the twin, but its pods and the first execution's, one key, were created on both sides of the raise
to 2, which no execution's pods ever are: the TrainJob is flagged `r-repeat`, naming that raise.
"""

from __future__ import annotations

import pathlib
import time

import pytest

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, detect, history, names, paths, raising

# The first execution (the one that makes /marks/first) runs until it is stopped; later ones exit 0
# at once. `env` first: the scenario reads the identity from its lines.
COMMAND = ["/bin/sh", "-c",
           'env; if mkdir /marks/first 2>/dev/null; then trap "exit 0" TERM; '
           'while :; do sleep 1 & wait $!; done; fi; exit 0']


def _active(sc: Scenario) -> int:
    jobset = sc.jobset() or {}
    return sum(int(r.get("active") or 0) for r in (jobset.get("status") or {}).get("replicatedJobsStatus") or [])


def _rewrite_patch(sc: Scenario, admission: int, *, floor: bool) -> None:
    """The outsider: our runtime-patch entry replaced by one carrying ADMISSION (suspended), and
    with `floor` the floor annotation set to it in the same update."""
    tj = sc.trainjob()
    tj["spec"]["runtimePatches"] = [
        raising.patch_entry(admission) if entry.get("manager") == names.PATCH_MANAGER else entry
        for entry in tj["spec"]["runtimePatches"]]
    if floor:
        tj["metadata"]["annotations"][names.FLOOR_ANNOTATION] = str(admission)
    sc.client.replace(paths.TRAINJOB, tj)


@pytest.mark.parametrize("lowered", ["patch", "patch and floor"])
def test_an_execution_below_the_floor_that_ends_while_our_controller_is_down_is_flagged(
        stack: stack_mod.Stack, namespace: str, tmp_path: pathlib.Path, lowered: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("unseen", host_dirs={"/marks": tmp_path}))
        sc.start("unseen", job_id="fault.unseen", command=COMMAND)
        adapter.open_(sc.client, namespace=namespace, name=sc.name)
        [first_pod] = sc.new_pods()
        first = sc.run(first_pod)
        sc.wait("the first execution in the history", lambda: history.of(sc.trainjob()).executions)
        adapter.hold(sc.client, namespace=namespace, name=sc.name)
        # Trainer's webhook refuses a runtime-patch change while the JobSet counts the replicated job
        # active (its status), which lasts until the held execution's pods are gone.
        sc.wait("the held execution's pods to be gone", lambda: not sc.pods() and not _active(sc))

        stack.ours.stop()
        assert adapter.raise_admission(sc.client, namespace=namespace, name=sc.name).admission == 2
        # The outsider comes more than the clock margin after the raise: a pod created within it is not
        # judged by the raise's floor (docs/adapter.md, "Clocks").
        time.sleep(detect.SKEW_SECONDS + 1.1)
        _rewrite_patch(sc, 1, floor=lowered == "patch and floor")
        sc.client.merge_patch(paths.TRAINJOB, {"spec": {"suspend": False}}, name=sc.name, namespace=namespace)
        [twin_pod] = sc.new_pods()
        twin = sc.run(twin_pod, until_exit=True)
        assert twin.exit_code == 0 and (twin.epoch, twin.attempt) == (first.epoch, first.attempt)
        assert raising.counts(sc.trainjob()).floor == (2 if lowered == "patch" else 1)
        assert sc.foreign() is None  # nobody has judged it yet
        raised_at = raising.last_raise(sc.trainjob())[1]

        stack.ours.start()
        if lowered == "patch":
            cause, rule = f"pod {twin_pod['metadata']['name']} had admission 1, below the floor 2 raised at ", "below-floor"
        else:
            cause, rule = f"the execution A=1 J=0, R 1, has pods created before and after the raise at {raised_at}", "r-repeat"
        sc.wait("the flag naming the ended pod's execution", lambda: any(
            line.startswith(cause) for line in (sc.foreign() or "").split("\n")))
        sc.check_identities(resets=[twin])
        # The twin shares the first execution's key (A, J, JobSet): one record, with the verdict. The
        # detector records it in the update after the flag's, so it is waited for, not read at once.
        def record() -> history.Execution:
            [found] = [e for e in history.of(sc.trainjob()).executions if (e.a, e.j) == (1, 0)]
            return found
        sc.wait("the record's verdict", lambda: record().verdict != "ok")
        assert record().verdict == f"foreign: {rule}", record()
        # The raise's own record: the next raise goes above 2 whatever the outsider wrote.
        assert history.of(sc.trainjob()).raised == 2
