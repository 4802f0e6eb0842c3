"""What a pod says of its execution, and how the history records it.

A record per execution, keyed by (A, J, JobSet UID): every pod of one
execution has the same A (from the pod template), J (JobSet's
restart-attempt label) and JobSet (its jobset-uid label). The UID is part of
the key because a reset can repeat A and J exactly: a recreated JobSet starts
J at 0 again under the same A.

`from_pod` reads a trainer pod into an `Observation` (with the epoch and
attempt token the prologue builds for its A and J, `identity_of`); `observe`
folds it into the history. A record only moves one way: how it ended goes
from running to `succeeded`, `stopped` or `failed` (`failed` wins over
`stopped`, which wins over `succeeded`), a `foreign` verdict stays, the
earliest creation and stop and the latest creation seen are kept.

Writes are never blind: `observe` returns the new history and the caller
writes it in one update preconditioned on the resourceVersion it read (a 409
re-reads and recomputes). It returns None when nothing changed, so a job's
many ranks cost one write per execution and state, not one per pod event.

No I/O: standard library and the other pure modules only.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from toolkit import derive, detect, identity, marks, names
from toolkit.history import stored

Obj = dict[str, Any]

_ENDED_RANK = {None: 0, "succeeded": 1, "stopped": 2, "failed": 3}


@dataclasses.dataclass(frozen=True)
class Observation:
    a: int
    j: int
    jobset_uid: str | None
    epoch: str | None
    attempt: str | None
    pod: str
    time: str
    ended: str | None
    verdict: str
    created: str | None = None  # the pod's creationTimestamp
    stopped: str | None = None  # when the apiserver was first asked to delete the pod
    unsuspend: tuple[str, int, str] | None = None  # the TrainJob's unsuspend as read (raising.unsuspend_seen)


_POD_ANNOTATION = re.compile(r"metadata\.annotations\['([^']+)'\]")


def _env_value(trainjob: Obj, key: str) -> str | None:
    """The value the trainer container gets for KEY: written in the env (`toolkit start`), or
    through the Downward API from an annotation our runtime patch gives the pods (a TrainJob the
    admission policy wrapped, `toolkit.derive`)."""
    for var in ((trainjob.get("spec") or {}).get("trainer") or {}).get("env") or []:
        if not isinstance(var, dict) or var.get("name") != key:
            continue
        if "value" in var:
            return str(var["value"])
        path = (((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"))
        found = _POD_ANNOTATION.fullmatch(path) if isinstance(path, str) else None
        return derive.pod_annotation(trainjob, found.group(1)) if found else None
    return None


def identity_of(trainjob: Obj, *, admission: int, restart: int) -> tuple[str | None, str | None]:
    """The epoch and attempt token an execution with this A and J sees, as the
    prologue builds them; (None, None) where the prologue would refuse to run
    (A = 0, R at the bound) or the TrainJob has no prefixes."""
    try:
        r = identity.check_r(admission=admission, restart=restart)
    except identity.BoundError:
        return None, None
    prefix = _env_value(trainjob, names.ENV_EPOCH_PREFIX)
    token = _env_value(trainjob, names.ENV_TOKEN_PREFIX)
    epoch: str | None = None
    if prefix is not None:
        try:
            epoch = str(identity.epoch_from_prefix(prefix=prefix, r=r))
        except identity.BoundError:
            epoch = None
    return epoch, (f"{token}.{admission}.{restart}" if token else None)


def from_pod(pod: Obj, trainjob: Obj, *, now: str, verdict: str) -> Observation | None:
    """What a trainer pod says about its execution; None when it carries no
    usable A or J, or A = 0 (the prologue runs nothing then)."""
    meta = pod.get("metadata") or {}
    a = detect.parse_count((meta.get("annotations") or {}).get(names.ADMISSION_ANNOTATION))
    j = detect.parse_count((meta.get("labels") or {}).get(names.RESTART_LABEL))
    if a is None or j is None or a == 0:
        return None
    phase = (pod.get("status") or {}).get("phase")
    ended = {"Succeeded": "succeeded", "Failed": "failed"}.get(str(phase))
    if ended is None and not marks.is_live(pod):
        ended = "stopped"
    epoch, attempt = identity_of(trainjob, admission=a, restart=j)
    uid = (meta.get("labels") or {}).get(names.JOBSET_UID_LABEL)
    created = meta.get("creationTimestamp")
    return Observation(a=a, j=j, jobset_uid=uid, epoch=epoch, attempt=attempt, pod=str(meta.get("name")), time=now,
                       ended=ended, verdict=verdict,
                       created=created if isinstance(created, str) and detect.is_timestamp(created) else None,
                       stopped=detect.stop_requested(meta))


# -- recording it --------------------------------------------------------


def with_unsuspend(history: stored.History, unsuspend: tuple[str, int, str] | None) -> stored.History:
    """The history with an unsuspend seen kept: for a (manager, generation) already kept, the earlier
    of the two times (a later write of the same manager to another field moves its managedFields time,
    never the generation), else a new entry (the last `stored.MAX_UNSUSPENDS`)."""
    if unsuspend is None:
        return history
    manager, generation, time = unsuspend
    kept = list(history.unsuspends)
    for i, (m, g, t) in enumerate(kept):
        if (m, g) == (manager, generation):
            if time >= t:
                return history
            kept[i] = (m, g, time)
            return dataclasses.replace(history, unsuspends=tuple(kept))
    return dataclasses.replace(history, unsuspends=(*kept, unsuspend)[-stored.MAX_UNSUSPENDS:])


def unsuspend_time(history: stored.History, *, manager: str, generation: int | None, time: str) -> str:
    """The earliest time known of the unsuspend by `manager` at `generation`: the history's, when it
    kept an earlier one, else `time` (the managedFields time read now)."""
    for m, g, t in history.unsuspends:
        if (m, g) == (manager, generation) and t < time:
            return t
    return time


def observe(history: stored.History, obs: Observation) -> stored.History | None:
    """The history with this observation recorded, or None when it adds
    nothing (see the module docstring)."""
    before = history
    history = with_unsuspend(history, obs.unsuspend)
    changed = _observe(history, obs)
    if changed is None and history != before:
        return history
    return changed


def _observe(history: stored.History, obs: Observation) -> stored.History | None:
    r = obs.a + obs.j
    for i, e in enumerate(history.executions):
        if (e.a, e.j, e.jobset_uid) != (obs.a, obs.j, obs.jobset_uid):
            continue
        ended = obs.ended if _ENDED_RANK.get(obs.ended, 0) > _ENDED_RANK.get(e.ended, 0) else e.ended
        verdict = e.verdict if e.verdict != "ok" else obs.verdict
        created = min(filter(None, (e.created, obs.created)), default=None)
        latest = max(filter(None, (e.latest, e.created, obs.created)), default=None)
        stopped = min(filter(None, (e.stopped, obs.stopped)), default=None)
        if (ended, verdict, created, latest, stopped) == (e.ended, e.verdict, e.created, e.latest, e.stopped):
            return None
        changed = dataclasses.replace(e, ended=ended, verdict=verdict, created=created, latest=latest,
                                      stopped=stopped, last_seen=obs.time)
        return dataclasses.replace(
            history, executions=history.executions[:i] + (changed,) + history.executions[i + 1:]
        )
    full = len(history.executions) >= stored.MAX_EXECUTIONS
    if full and history.executions and r < history.executions[0].r:
        return None  # a late pod of an execution already dropped
    new = stored.Execution(a=obs.a, j=obs.j, jobset_uid=obs.jobset_uid, r=r, epoch=obs.epoch, attempt=obs.attempt,
                           first_pod=obs.pod, first_seen=obs.time, last_seen=obs.time, ended=obs.ended,
                           verdict=obs.verdict, created=obs.created, latest=obs.created, stopped=obs.stopped)
    executions = sorted((*history.executions, new), key=lambda e: (e.r, e.a))
    dropped = max(0, len(executions) - stored.MAX_EXECUTIONS)
    return dataclasses.replace(
        history,
        executions=tuple(executions[dropped:]),
        dropped=history.dropped + dropped,
        high_water=max(history.high_water, r),
        unreadable=False,
    )

