"""The start deadline: a driver container that never starts (pure).

With `backoffLimit: 0` and no deadline of its own, a driver pod whose image
is never pulled (ErrImagePull, ImagePullBackOff, InvalidImageName) or whose
container cannot be configured (CreateContainerConfigError) stays Pending
forever: the Job never fails, nothing reports the run, and its in-flight
slot never comes back. The main loop asks `stuck` about each Pending driver
pod on a tick; past TCAB_DISPATCHER_DRIVER_START_DEADLINE it reports the
run failed with the kubelet's waiting reason and message and deletes the
Job. The tick lists pods (a page at a time) only once some unfinished Job
is older than the deadline less a clock-skew margin (`Ledger.oldest_age`):
a pod cannot have waited longer than its Job has existed.

Only a container the kubelet holds in `waiting` is judged: a pod that is not
on a node yet (no container status) is waiting for capacity, which is the
cluster's queue and not a failure. The wait is counted from the pod's
PodScheduled=True transition (else its creation), in the apiserver's
timestamps against this host's clock: a skew of seconds against a deadline
of minutes. Nothing here raises on a malformed object: it is not stuck.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from dispatcher import names

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Stuck:
    pod: str
    reason: str
    message: str
    waited: float  # seconds since the pod was scheduled (or created)


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Obj]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _waiting_since(pod: Obj) -> float | None:
    for condition in _list(_dict(pod.get("status")).get("conditions")):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            since = timestamp(condition.get("lastTransitionTime"))
            if since is not None:
                return since
    return timestamp(_dict(pod.get("metadata")).get("creationTimestamp"))


def stuck(pod: Obj, *, now: float, deadline: float) -> Stuck | None:
    """The driver container has waited to start for longer than `deadline` seconds; else None."""
    status = _dict(pod.get("status"))
    if status.get("phase") not in (None, "", "Pending"):
        return None
    for cs in _list(status.get("containerStatuses")):
        if cs.get("name") != names.DRIVER_CONTAINER:
            continue
        state = _dict(cs.get("state"))
        waiting = state.get("waiting")
        if not isinstance(waiting, dict) or state.get("running") or state.get("terminated"):
            return None
        since = _waiting_since(pod)
        if since is None or now - since < deadline:
            return None
        return Stuck(pod=str(_dict(pod.get("metadata")).get("name")),
                     reason=str(waiting.get("reason") or "ContainerNotStarted"),
                     message=str(waiting.get("message") or ""), waited=now - since)
    return None
