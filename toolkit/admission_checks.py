"""Our Kueue AdmissionChecks: which checks are ours and how a Workload's entry
for them is set, one definition for the controller (Ready, Rejected, the
untouched approval) and for `toolkit adopt` (Retry).

A check is ours when its spec.controllerName is the name our controller
serves (`CONTROLLER_NAME` unless the controller is configured otherwise: a CLI
that cannot read the controller's settings takes the names it is given, or
the name it is told the controller serves).

`with_checks` is pure: it copies the status list and sets the state, the
message (bounded as Kueue bounds it) and the transition time of our entries.
"""

from __future__ import annotations

from typing import Any

from toolkit import detect, kube, names, paths

Obj = dict[str, Any]

# The AdmissionCheck spec.controllerName our controller serves by default.
CONTROLLER_NAME = f"{names.DOMAIN}/admission-check"
MESSAGE_LIMIT = 1024


def ours(client: kube.Client, *, controller_name: str = CONTROLLER_NAME) -> set[str]:
    """The names of the AdmissionChecks whose spec.controllerName is `controller_name`."""
    checks, _ = client.list(paths.ADMISSION_CHECK)
    return {c["metadata"]["name"] for c in checks if (c.get("spec") or {}).get("controllerName") == controller_name}


def with_checks(workload: Obj, *, checks: set[str] | list[str], state: str, message: str) -> Obj:
    """The Workload with the entries of `checks` in `state`; pure (copies the status list)."""
    out = dict(workload)
    status = dict(out.get("status") or {})
    entries = []
    for entry in status.get("admissionChecks") or []:
        entry = dict(entry)
        if entry.get("name") in checks:
            entry["state"] = state
            entry["message"] = message[:MESSAGE_LIMIT]
            entry["lastTransitionTime"] = detect.now()
        entries.append(entry)
    status["admissionChecks"] = entries
    out["status"] = status
    return out
