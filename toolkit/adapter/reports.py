"""What `toolkit status` and `toolkit executions` show, read from the cluster.

`compute_status` is pure: the status from a TrainJob, its JobSet and (Kueue
mode) its Workloads, so the CLI, the tests and the identity model compute it
the same way. `status` reads them first, and records the JobSet UID if it
was not yet (flagging a different one), as open and release do
(`records.check_jobset`); a caller that may only read gets the status
without the record. `executions` is the history as the controller recorded
it, with the foreign causes and their fingerprint (what `adopt --reviewed`
takes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit import causes, detect, flagmark, history, kube, marks, names, raising
from toolkit.adapter import holds, records, trainjobs

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Status:
    """What `toolkit status` shows. `execution` says which execution A, J, R,
    epoch and attempt describe: the one running now ("current"), or, while
    suspended, the one the next admission starts ("next": A as that
    admission's raise will write it, J as the JobSet has it now)."""

    namespace: str
    name: str
    state: str  # "suspended", "running", or HELD (Kueue mode: a Workload of it has spec.active false)
    execution: str  # "current" when running, "next" when suspended
    admission: int  # A of that execution
    restarts: int  # J of that execution (the JobSet's status.restarts; 0 without a JobSet)
    r: int  # R = A + J of that execution
    epoch: str | None  # its DISPATCH_EPOCH; None without the prefix or past a bound
    attempt: str | None  # its DISPATCH_ATTEMPT; None past a bound
    bound: str | None  # why there is no epoch or token, when R is past its bound
    last_admission: int  # the A last written (the larger of our patch and the floor)
    floor: int | None
    high_water: int  # the highest R the history has recorded (0: none yet)
    jobset_uid: str | None  # the recorded JobSet UID
    jobset_uid_seen: str | None
    jobset_uid_mismatch: bool  # a JobSet is there and its UID is not the recorded one
    foreign: bool
    foreign_cause: str | None
    foreign_dropped: int  # causes counted but not kept (the list is bounded)
    # What `adopt --reviewed` takes: the fingerprint of the causes shown (causes.fingerprint); None unflagged.
    foreign_fingerprint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


HELD = "held (Workload spec.active false)"


def compute_status(trainjob: Obj, jobset: Obj | None, *, workloads: list[Obj] | None = None) -> Status:
    """Pure: the status of a TrainJob from it, its JobSet and (Kueue mode) its Workloads. Held
    by Kueue's own hold (a Workload inactive) reads HELD once Kueue has suspended it; until then
    its execution still runs, and the state says that."""
    meta = trainjob["metadata"]
    annotations = meta.get("annotations") or {}
    counts = raising.counts(trainjob)
    suspended = raising.is_suspended(trainjob)
    restarts = trainjobs.restarts_of(jobset)
    # Suspended: the next admission raises first. Running: the pods run with
    # the A in the patch (the floor equals it unless the patch was rewritten).
    admission = counts.next if suspended else (counts.patch if counts.patch is not None else counts.current)
    r = admission + restarts
    epoch, attempt = history.identity_of(trainjob, admission=admission, restart=restarts)
    bound = None
    if r >= 10**6:
        bound = f"R {r} is not below the bound 10^6: the prologue refuses to run this execution"
    foreign = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
    recorded = annotations.get(names.JOBSET_UID_ANNOTATION)
    seen = ((jobset or {}).get("metadata") or {}).get("uid")
    return Status(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        state=_state(suspended=suspended, held=any(not holds.is_active(w) for w in workloads or [])),
        execution="next" if suspended else "current",
        admission=admission,
        restarts=restarts,
        r=r,
        epoch=epoch,
        attempt=attempt,
        bound=bound,
        last_admission=counts.current,
        floor=counts.floor,
        high_water=history.of(trainjob).high_water,
        jobset_uid=recorded,
        jobset_uid_seen=seen,
        jobset_uid_mismatch=bool(recorded and seen and recorded != seen),
        foreign=flagmark.is_flagged(trainjob),
        foreign_cause="\n".join(foreign.kept) or None,
        foreign_dropped=foreign.dropped,
        foreign_fingerprint=causes.fingerprint(foreign) if flagmark.is_flagged(trainjob) else None,
    )


def _state(*, suspended: bool, held: bool) -> str:
    if held:
        return HELD if suspended else "running (Workload spec.active false: Kueue is stopping it)"
    return "suspended" if suspended else "running"


def status(client: kube.Client, *, namespace: str, name: str) -> Status:
    """The status, after recording the JobSet UID if it was not yet (and
    flagging a different one), as open and release do; a caller that may
    only read gets the status without the record."""
    trainjob = trainjobs.get_trainjob(client, namespace=namespace, name=name)
    jobset = trainjobs.jobset_of(client, trainjob=trainjob)
    if marks.is_ours(trainjob) and jobset is not None:
        recorded = (trainjob["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION)
        if recorded != jobset["metadata"]["uid"] and not is_flagged_with(trainjob, jobset):
            try:
                records.check_jobset(client, namespace=namespace, name=name, jobset=jobset)
            except kube.Forbidden:
                pass  # a reader without update rights: the mismatch is still shown, not recorded
            trainjob = trainjobs.get_trainjob(client, namespace=namespace, name=name)
    workloads = None
    if holds.is_kueue_mode(trainjob):
        try:
            workloads = holds.workloads_of(client, trainjob=trainjob)
        except kube.Forbidden:
            pass  # a reader who may not list Workloads: the state as the TrainJob shows it
    return compute_status(trainjob, jobset, workloads=workloads)


def is_flagged_with(trainjob: Obj, jobset: Obj) -> bool:
    """The JobSet's UID mismatch is already among the causes (no write needed)."""
    annotations = trainjob["metadata"].get("annotations") or {}
    violation = detect.jobset_uid(recorded=annotations.get(names.JOBSET_UID_ANNOTATION), seen=jobset["metadata"]["uid"])
    kept = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), None).kept
    return violation is not None and violation.detail in kept


@dataclasses.dataclass(frozen=True)
class Executions:
    """What `toolkit executions` shows: the recorded executions (oldest
    first), the high-water mark of R, the adoptions, and the foreign causes."""

    namespace: str
    name: str
    state: str  # "suspended" or "running"
    history: history.History
    foreign_causes: list[str]
    foreign_dropped: int
    foreign_fingerprint: str | None = None  # what `adopt --reviewed` takes; None unflagged

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def executions(client: kube.Client, *, namespace: str, name: str) -> Executions:
    """The TrainJob's execution history, as the controller recorded it."""
    trainjob = trainjobs.get_trainjob(client, namespace=namespace, name=name)
    annotations = trainjob["metadata"].get("annotations") or {}
    foreign = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
    return Executions(
        namespace=namespace,
        name=name,
        state="suspended" if raising.is_suspended(trainjob) else "running",
        history=history.of(trainjob),
        foreign_causes=foreign.kept,
        foreign_dropped=foreign.dropped,
        foreign_fingerprint=causes.fingerprint(foreign) if flagmark.is_flagged(trainjob) else None,
    )
