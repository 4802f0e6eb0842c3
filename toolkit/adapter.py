"""The adapter operations (DESIGN.md §4, §6, §7): start, open, release, hold,
status, plus the raise loop and the foreign flag the controller shares.

Each operation is a small function over a `kube.Client`; the rules it
applies are pure and live elsewhere (`raising` for the raise, `detect` for
resets, `render` for the TrainJob, `runtime_check` for §5, `identity` for
the epoch). The CLI (`toolkit.cli_cluster`) and the controller are shells
around these.

Invariants:
- Every write that changes A goes through `raise_admission`: one update
  preconditioned on the resourceVersion it was computed from; a 409 is
  re-read and recomputed, never re-sent.
- Open and Release unsuspend in the same update that raises, so no pod can
  start with the previous A.
- Start never changes an existing TrainJob: the name is a function of the
  job and submission, so AlreadyExists means "already started".
- Flagging foreign only adds annotations and an Event; nothing here stops,
  suspends or deletes a workload because of a detected reset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from toolkit import detect, kube, names, paths, raising

Obj = dict[str, Any]

# Which Workload admission the last raise was for: "<workload uid>/<resourceVersion>"
# (see controller.admission for why that pair).
RAISED_FOR_ANNOTATION = f"{names.DOMAIN}/raised-for"
COMPONENT = "dispatch-adapter"


class AdapterError(Exception):
    """A refusal for the user: one line naming the object and the field."""


@dataclasses.dataclass(frozen=True)
class Raised:
    admission: int  # A after the update (or as found, when nothing was written)
    conflicts: int  # 409s re-read and recomputed
    written: bool = True


def raise_admission(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    unsuspend: bool = False,
    record: tuple[str, str] | None = None,
    skip_if: Callable[[Obj], int | None] | None = None,
    on_conflict: Callable[[], None] | None = None,
    first: Obj | None = None,
) -> Raised:
    """Raise A on the TrainJob (§6) and return the A written.

    `skip_if(trainjob)` returning an A means "already done for this
    purpose, write nothing" (the controller's crash-safe re-run); it is
    evaluated on every fresh read, like the raise itself.
    """

    def compute(trainjob: Obj) -> tuple[Obj | None, Raised]:
        if skip_if is not None:
            found = skip_if(trainjob)
            if found is not None:
                return None, Raised(found, 0, written=False)
        try:
            new, admission = raising.raised(trainjob, unsuspend=unsuspend, record=record)
        except raising.RaiseRefused as exc:
            raise AdapterError(str(exc)) from None
        return new, Raised(admission, 0)

    try:
        result, conflicts = client.read_modify_write(
            paths.TRAINJOB, name=name, namespace=namespace, compute=compute, on_conflict=on_conflict, first=first
        )
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    return dataclasses.replace(result, conflicts=conflicts)


# -- start ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Started:
    namespace: str
    name: str
    created: bool


def _runtime(client: kube.Client, *, namespace: str, ref: Obj) -> Obj:
    kind = ref.get("kind") or "ClusterTrainingRuntime"
    name = ref.get("name") or ""
    try:
        if kind == "TrainingRuntime":
            return client.get(paths.TRAINING_RUNTIME, name=name, namespace=namespace)
        return client.get(paths.CLUSTER_TRAINING_RUNTIME, name=name)
    except kube.NotFound:
        raise AdapterError(f"spec.runtimeRef: {kind} {name!r} not found on the cluster") from None


def start(
    client: kube.Client,
    *,
    trainjob: Obj,
    allow_rank_restart: bool = False,
) -> Started:
    """Create the rendered TrainJob suspended with A = 0, after checking its
    runtime on the cluster. An existing TrainJob of that name is left as is."""
    from toolkit import runtime_check  # the teammate's §5 rules, pure

    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        client.get(paths.TRAINJOB, name=name, namespace=namespace)
        return Started(namespace, name, created=False)
    except kube.NotFound:
        pass
    runtime = _runtime(client, namespace=namespace, ref=trainjob["spec"].get("runtimeRef") or {})
    refusals = runtime_check.check(runtime, allow_rank_restart=allow_rank_restart)
    if refusals:
        raise AdapterError(
            f"runtime {runtime['metadata']['name']}: " + "; ".join(str(r) for r in refusals)
        )
    if not raising.is_suspended(trainjob) or raising.patch_admission(trainjob) != 0:
        raise AdapterError(
            f"TrainJob {name}: must be rendered with spec.suspend true and admission 0 in our runtime patch"
        )
    try:
        client.create(paths.TRAINJOB, trainjob, namespace=namespace)
    except kube.AlreadyExists:
        return Started(namespace, name, created=False)
    except kube.Invalid as exc:
        raise AdapterError(f"TrainJob {name}: refused by the apiserver: {exc.message}") from None
    return Started(namespace, name, created=True)


# -- open / release / hold --------------------------------------------


def open_(client: kube.Client, *, namespace: str, name: str) -> Raised:
    """Plain mode: raise A and unsuspend, in one preconditioned update."""
    return raise_admission(client, namespace=namespace, name=name, unsuspend=True)


def live_pods(client: kube.Client, *, namespace: str, name: str) -> list[str]:
    """The TrainJob's pods that still run: not finished and not terminating
    (the pods the controller's detector judges), sorted by name."""
    pods, _ = client.list(paths.POD, namespace=namespace, label_selector=f"{names.JOBSET_NAME_LABEL}={name}")
    return sorted(
        str(p["metadata"]["name"])
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )


def release(client: kube.Client, *, namespace: str, name: str) -> Raised:
    """Plain mode: a held TrainJob resumes with A raised, as open does; but
    not while pods of the held execution still run. Right after a hold,
    Trainer, JobSet and the Job controller have not yet stopped them; a
    raise then would leave them running below the new floor, where the
    detector (and their sidecars) would flag the TrainJob foreign for
    nothing. Terminating pods do not count: nothing judges them."""
    try:
        trainjob = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    if raising.is_suspended(trainjob):
        live = live_pods(client, namespace=namespace, name=name)
        if live:
            more = f" and {len(live) - 1} more" if len(live) > 1 else ""
            raise AdapterError(
                f"TrainJob {namespace}/{name}: pod {live[0]}{more} of the held execution still running; "
                "release once the hold has stopped them (they would run below the raised floor)"
            )
    return raise_admission(client, namespace=namespace, name=name, unsuspend=True, first=trainjob)


def hold(client: kube.Client, *, namespace: str, name: str) -> bool:
    """Suspend; True when it was running. A is not touched (the next open or
    release raises it)."""

    def compute(trainjob: Obj) -> tuple[Obj | None, bool]:
        if raising.is_suspended(trainjob):
            return None, False
        trainjob["spec"]["suspend"] = True
        return trainjob, True

    try:
        changed, _ = client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=compute)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    return changed


# -- foreign flag -----------------------------------------------------


def flag_foreign(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    violation: detect.Violation,
    component: str = COMPONENT,
) -> bool:
    """Keep the cause detail on the TrainJob and emit a Warning Event.

    Idempotent: a cause already recorded is not recorded or announced again.
    Only annotations change; the workload is left running. True when the
    cause was new.
    """

    def compute(trainjob: Obj) -> tuple[Obj | None, Obj | None]:
        annotations = trainjob["metadata"].setdefault("annotations", {}) or {}
        trainjob["metadata"]["annotations"] = annotations
        previous = annotations.get(names.FOREIGN_ANNOTATION) or ""
        if violation.detail in previous.split("\n"):
            return None, None
        # Annotation values are bounded (256 KiB for all of them together):
        # keep the first causes, which are the ones a person must see.
        joined = f"{previous}\n{violation.detail}" if previous else violation.detail
        annotations[names.FOREIGN_ANNOTATION] = joined[:8192]
        return trainjob, trainjob

    try:
        flagged, _ = client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=compute)
    except kube.NotFound:
        return False
    if flagged is None:
        return False
    client.warn(involved=flagged, reason=names.FOREIGN_REASON, message=violation.detail, component=component)
    return True


def record_jobset_uid(client: kube.Client, *, namespace: str, name: str, uid: str) -> detect.Violation | None:
    """Record the JobSet UID the first time it is seen; a different one later
    is the jobset-uid violation (returned, for the caller to flag)."""

    def compute(trainjob: Obj) -> tuple[Obj | None, detect.Violation | None]:
        annotations = trainjob["metadata"].get("annotations") or {}
        recorded = annotations.get(names.JOBSET_UID_ANNOTATION)
        if recorded:
            return None, detect.jobset_uid(recorded=recorded, seen=uid)
        annotations[names.JOBSET_UID_ANNOTATION] = uid
        trainjob["metadata"]["annotations"] = annotations
        return trainjob, None

    try:
        violation, _ = client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=compute)
    except kube.NotFound:
        return None
    return violation


# -- status -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Status:
    namespace: str
    name: str
    state: str  # "suspended" or "running"
    admission: int  # A of the current execution (running) or the last one
    floor: int | None
    restarts: int  # J, the JobSet's status.restarts (0 without a JobSet)
    next_or_current: str  # "next" when suspended, "current" when running
    r: int  # R of the next or current execution
    epoch: str | None  # DISPATCH_EPOCH of that execution (None without the prefix or past a bound)
    attempt: str | None  # DISPATCH_ATTEMPT of that execution
    jobset_uid: str | None  # the recorded JobSet UID
    jobset_uid_seen: str | None
    foreign: bool
    foreign_cause: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _env_value(trainjob: Obj, key: str) -> str | None:
    for var in ((trainjob.get("spec") or {}).get("trainer") or {}).get("env") or []:
        if var.get("name") == key and "value" in var:
            return str(var["value"])
    return None


def compute_status(trainjob: Obj, jobset: Obj | None) -> Status:
    """Pure: the status of a TrainJob from it and its JobSet."""
    from toolkit import identity

    meta = trainjob["metadata"]
    annotations = meta.get("annotations") or {}
    counts = raising.counts(trainjob)
    suspended = raising.is_suspended(trainjob)
    restarts = int(((jobset or {}).get("status") or {}).get("restarts") or 0)
    # Suspended: the next admission raises first. Running: the pods run with
    # the A in the patch (the floor equals it unless the patch was rewritten).
    admission = counts.next if suspended else (counts.patch if counts.patch is not None else counts.current)
    r = admission + restarts
    prefix = _env_value(trainjob, names.ENV_EPOCH_PREFIX)
    token = _env_value(trainjob, names.ENV_TOKEN_PREFIX)
    epoch: str | None = None
    if prefix is not None:
        try:
            epoch = str(identity.epoch_from_prefix(prefix=prefix, r=r))
        except identity.BoundError:
            epoch = None  # past a bound: the prologue would refuse to run
    attempt = f"{token}.{admission}.{restarts}" if token else None
    foreign = annotations.get(names.FOREIGN_ANNOTATION)
    return Status(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        state="suspended" if suspended else "running",
        admission=admission if not suspended else counts.current,
        floor=counts.floor,
        restarts=restarts,
        next_or_current="next" if suspended else "current",
        r=r,
        epoch=epoch,
        attempt=attempt,
        jobset_uid=annotations.get(names.JOBSET_UID_ANNOTATION),
        jobset_uid_seen=((jobset or {}).get("metadata") or {}).get("uid"),
        foreign=bool(foreign),
        foreign_cause=foreign or None,
    )


def status(client: kube.Client, *, namespace: str, name: str) -> Status:
    try:
        trainjob = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    try:
        jobset: Obj | None = client.get(paths.JOBSET, name=name, namespace=namespace)
    except kube.NotFound:
        jobset = None
    return compute_status(trainjob, jobset)
