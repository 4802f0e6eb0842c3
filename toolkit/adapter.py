"""The adapter operations (docs/toolkit.md, docs/adapter.md): start, open, release, hold,
status, executions and adopt, plus the raise loop, the foreign flag and the
execution record the controller shares.

Each operation is a small function over a `kube.Client`; the rules it
applies are pure and live elsewhere (`raising` for the raise, `detect` for
resets, `render` for the TrainJob, `runtime_check` for the runtime requirements, `identity` for
the epoch). The CLI (`toolkit.cli_cluster`) and the controller are shells
around these.

Invariants:
- Every write that changes A goes through `raise_admission`: one update
  preconditioned on the resourceVersion it was computed from; a 409 is
  re-read and recomputed, never re-sent.
- Plain mode: open and release unsuspend in the same update that raises, so
  no pod can start with the previous A.
- Kueue mode (the TrainJob's queue label): nothing here unsuspends or raises.
  Hold and release set the Workload's spec.active (Kueue's own hold), and the
  admission check raises A at the next admission; a spec.suspend of ours
  would be undone by Kueue while the Workload is admitted.
- Start never changes an existing TrainJob: the name is a function of the
  job and submission, so AlreadyExists means "already started".
- Flagging foreign only adds annotations, a label and an Event; nothing here stops,
  suspends or deletes a workload because of a detected reset. Only a
  person's `adopt` clears the flag, and it keeps the causes in the history.
- Open and release check the runtime again (it may have been edited since
  start) and record the JobSet UID the first time they see it, as the
  controller does; a different UID is flagged, not refused (detection, not
  prevention). Status records and reports it the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from toolkit import admission_checks, causes, detect, flagmark, history, kube, marks, names, paths, raising, runtime_check

Obj = dict[str, Any]

# Which Workload admission the last raise was for (see controller.admission).
RAISED_FOR_ANNOTATION = names.RAISED_FOR_ANNOTATION
# Written by start when the request allows a failed rank to be replaced
# (docs/toolkit.md), so the runtime's later checks apply the same rule.
ALLOW_RANK_RESTART_ANNOTATION = f"{names.DOMAIN}/allow-rank-restart"
# The AdmissionCheck controllerName of our Kueue check (controller.admission).
CHECK_CONTROLLER_NAME = admission_checks.CONTROLLER_NAME
ADOPTED_REASON = "DispatchAdopted"
COMPONENT = "dispatch-adapter"


class AdapterError(Exception):
    """A refusal for the user: one line naming the object and the field."""


class AnnotationsRefused(AdapterError):
    """Our annotations could not be written: the apiserver refused them (422: all of the object's
    annotations pass its limit, ours kept within `history.BUDGET`), or ours alone would pass the
    budget. Retrying at once cannot help: a caller that loops backs off."""


def _refused(*, namespace: str, name: str, trainjob: Obj | None, detail: str) -> AnnotationsRefused:
    annotations = ((trainjob or {}).get("metadata") or {}).get("annotations") or {}
    total = sum(causes.encoded(k) + causes.encoded(v) for k, v in annotations.items() if isinstance(v, str))
    return AnnotationsRefused(
        f"TrainJob {namespace}/{name}: annotations not written ({history.ours(annotations)} bytes of ours, budget "
        f"{history.BUDGET}; {total} bytes in all): {detail}")


def _write_annotations(client: kube.Client, *, namespace: str, name: str,
                       compute: Callable[[Obj], tuple[Obj | None, Any]], **options: Any) -> tuple[Any, int]:
    """`client.read_modify_write` of a TrainJob for a write of our annotations, whose refusal by the
    apiserver (422) is `AnnotationsRefused`, one line, instead of an error retried as it was."""
    seen: list[Obj] = []

    def remember(trainjob: Obj) -> tuple[Obj | None, Any]:
        seen[:] = [trainjob]
        return compute(trainjob)

    try:
        return client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=remember, **options)
    except kube.Invalid as exc:
        raise _refused(namespace=namespace, name=name, trainjob=seen[0] if seen else None,
                       detail=f"the apiserver refused: {exc.message}") from None


@dataclasses.dataclass(frozen=True)
class Raised:
    admission: int  # A after the update (or as found, when nothing was written)
    conflicts: int  # 409s re-read and recomputed
    written: bool = True
    jobset_reset: str | None = None  # a JobSet UID mismatch seen (and flagged) before the raise
    generation: int | None = None  # the TrainJob's metadata.generation after the write (or as found)
    # Kueue mode's release: the Workloads set spec.active true (A untouched: the check raises it
    # at their next admission).
    requeued: tuple[str, ...] = ()


def raise_admission(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    unsuspend: bool = False,
    record: tuple[str, str] | Callable[[Obj], tuple[str, str]] | None = None,
    skip_if: Callable[[Obj], int | None] | None = None,
    on_conflict: Callable[[], None] | None = None,
    first: Obj | None = None,
) -> Raised:
    """Raise A on the TrainJob (`raising`) and return the A written.

    `skip_if(trainjob)` returning an A means "already done for this
    purpose, write nothing" (the controller's crash-safe re-run); it is
    evaluated on every fresh read, like the raise itself. `record` is an
    (annotation, value) written with the raise, or a function of the
    TrainJob read that gives it (evaluated on every fresh read too).
    """

    def compute(trainjob: Obj) -> tuple[Obj | None, Raised]:
        if skip_if is not None:
            found = skip_if(trainjob)
            if found is not None:
                return None, Raised(found, 0, written=False, generation=_generation(trainjob))
        try:
            mark = record(trainjob) if callable(record) else record
            new, admission = raising.raised(trainjob, unsuspend=unsuspend, record=mark)
        except raising.RaiseRefused as exc:
            raise AdapterError(str(exc)) from None
        return new, Raised(admission, 0)

    written: list[Obj] = []
    try:
        result, conflicts = client.read_modify_write(
            paths.TRAINJOB, name=name, namespace=namespace, compute=compute, on_conflict=on_conflict, first=first,
            field_manager=names.RAISE_FIELD_MANAGER, on_written=written.append,
        )
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    if written:
        result = dataclasses.replace(result, generation=_generation(written[0]))
    return dataclasses.replace(result, conflicts=conflicts)


def _generation(trainjob: Obj) -> int | None:
    generation = (trainjob.get("metadata") or {}).get("generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else None


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


def check_runtime(client: kube.Client, *, trainjob: Obj, allow_rank_restart: bool | None = None) -> None:
    """The runtime requirements (docs/toolkit.md) against the runtime the TrainJob names, read now: a
    (Cluster)TrainingRuntime can be edited after start, and a JobSet rebuilt
    later uses the edited one. AdapterError names the field and the value.
    `allow_rank_restart` None: as start recorded it on the TrainJob."""
    meta = trainjob.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if allow_rank_restart is None:
        allow_rank_restart = (meta.get("annotations") or {}).get(ALLOW_RANK_RESTART_ANNOTATION) == "true"
    runtime = _runtime(client, namespace=namespace, ref=(trainjob.get("spec") or {}).get("runtimeRef") or {})
    refusals = runtime_check.check(runtime, allow_rank_restart=allow_rank_restart)
    if refusals:
        raise AdapterError(
            f"runtime {runtime['metadata']['name']}: " + "; ".join(str(r) for r in refusals)
        )


def start(
    client: kube.Client,
    *,
    trainjob: Obj,
    allow_rank_restart: bool = False,
) -> Started:
    """Create the rendered TrainJob suspended with A = 0, after checking its
    runtime on the cluster. An existing TrainJob of that name is left as is."""
    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        client.get(paths.TRAINJOB, name=name, namespace=namespace)
        return Started(namespace, name, created=False)
    except kube.NotFound:
        pass
    check_runtime(client, trainjob=trainjob, allow_rank_restart=allow_rank_restart)
    if allow_rank_restart:
        trainjob = {**trainjob, "metadata": {**meta, "annotations": {
            **(meta.get("annotations") or {}), ALLOW_RANK_RESTART_ANNOTATION: "true"}}}
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


def _get_trainjob(client: kube.Client, *, namespace: str, name: str) -> Obj:
    try:
        return client.get(paths.TRAINJOB, name=name, namespace=namespace)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None


def restarts_of(jobset: Obj | None) -> int:
    """J as the JobSet has it now: its status.restarts (0 without a JobSet or before JobSet writes
    it; a value that is not a count reads as 0, as JobSet never writes one)."""
    value = ((jobset or {}).get("status") or {}).get("restarts")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _jobset(client: kube.Client, *, trainjob: Obj) -> Obj | None:
    """Trainer's one JobSet of the TrainJob (named like it and owned by its UID), if any. A JobSet
    of that name owned by another UID is a deleted predecessor's, not yet collected: not this one."""
    meta = trainjob["metadata"]
    try:
        jobset = client.get(paths.JOBSET, name=meta["name"], namespace=meta["namespace"])
    except kube.NotFound:
        return None
    return jobset if marks.owned_by(jobset, trainjob) else None


def check_jobset(client: kube.Client, *, namespace: str, name: str, jobset: Obj | None,
                 component: str = COMPONENT) -> str | None:
    """Record the JobSet's UID the first time it is seen (docs/adapter.md, by the
    adapter as by the controller); a different one is flagged foreign. The
    cause, or None."""
    if jobset is None or (jobset.get("metadata") or {}).get("deletionTimestamp"):
        return None
    violation = record_jobset_uid(client, namespace=namespace, name=name, uid=jobset["metadata"]["uid"])
    if violation is None:
        return None
    flag_foreign(client, namespace=namespace, name=name, violation=violation, component=component)
    return violation.detail


def _admit(client: kube.Client, *, namespace: str, name: str, trainjob: Obj) -> Raised:
    """Plain mode's admission: the runtime checked again, the JobSet UID
    recorded (or its change flagged), then the raise that unsuspends."""
    check_runtime(client, trainjob=trainjob)
    reset = check_jobset(client, namespace=namespace, name=name, jobset=_jobset(client, trainjob=trainjob))
    raised = raise_admission(client, namespace=namespace, name=name, unsuspend=True,
                             first=None if reset else trainjob)
    return dataclasses.replace(raised, jobset_reset=reset)


def is_kueue_mode(trainjob: Obj) -> bool:
    """Kueue admits it (its queue label): Kueue, not a raise of ours, unsuspends it."""
    return names.KUEUE_QUEUE_LABEL in ((trainjob.get("metadata") or {}).get("labels") or {})


def workloads_of(client: kube.Client, *, trainjob: Obj) -> list[Obj]:
    """The Workloads Kueue made for this very TrainJob (`marks.owned_by`: its UID), not being
    deleted, sorted by name. Kueue keeps one per job; a predecessor's lingers until collected."""
    meta = trainjob["metadata"]
    listed, _ = client.list(paths.WORKLOAD, namespace=meta["namespace"])
    return sorted((w for w in listed if marks.owned_by(w, trainjob) and not w["metadata"].get("deletionTimestamp")),
                  key=lambda w: str(w["metadata"]["name"]))


def is_active(workload: Obj) -> bool:
    """Kueue's reading of spec.active: unset is active."""
    return (workload.get("spec") or {}).get("active") is not False


def _queued_workloads(client: kube.Client, *, trainjob: Obj) -> list[Obj]:
    found = workloads_of(client, trainjob=trainjob)
    if not found:
        meta = trainjob["metadata"]
        raise AdapterError(
            f"TrainJob {meta['namespace']}/{meta['name']}: not yet queued by Kueue: no Workload owned by it; "
            "in Kueue mode hold and release act on its Workload, so try again once Kueue has made it"
        )
    return found


def _set_active(client: kube.Client, *, workload: Obj, active: bool) -> bool:
    """Set the Workload's spec.active, preconditioned on the version read (a 409 re-reads). True
    when written; False when it already was (or is gone)."""

    def compute(found: Obj) -> tuple[Obj | None, bool]:
        if is_active(found) == active:
            return None, False
        found.setdefault("spec", {})["active"] = active
        return found, True

    meta = workload["metadata"]
    try:
        changed, _ = client.read_modify_write(paths.WORKLOAD, name=meta["name"], namespace=meta["namespace"],
                                              compute=compute, first=workload)
    except kube.NotFound:
        return False
    return changed


def open_(client: kube.Client, *, namespace: str, name: str) -> Raised:
    """Plain mode: raise A and unsuspend, in one preconditioned update (after
    the runtime check and the JobSet UID record, see `_admit`). Refused in
    Kueue mode, where Kueue admits through our check."""
    trainjob = _get_trainjob(client, namespace=namespace, name=name)
    if is_kueue_mode(trainjob):
        raise AdapterError(
            f"TrainJob {namespace}/{name} is in Kueue mode (label {names.KUEUE_QUEUE_LABEL}): Kueue admits it "
            "through the admission check, which raises A; open is plain mode's"
        )
    return _admit(client, namespace=namespace, name=name, trainjob=trainjob)


def live_pods(client: kube.Client, *, namespace: str, name: str) -> list[str]:
    """The TrainJob's pods that still run (`marks.is_live`: the pods the
    controller's detector judges), sorted by name."""
    pods, _ = client.list(paths.POD, namespace=namespace, label_selector=f"{names.JOBSET_NAME_LABEL}={name}")
    return sorted(str(p["metadata"]["name"]) for p in pods if marks.is_live(p))


def _refuse_live_pods(client: kube.Client, *, namespace: str, name: str) -> None:
    live = live_pods(client, namespace=namespace, name=name)
    if live:
        more = f" and {len(live) - 1} more" if len(live) > 1 else ""
        raise AdapterError(
            f"TrainJob {namespace}/{name}: pod {live[0]}{more} of the held execution still running; "
            "release once the hold has stopped them (they would run below the raised floor)"
        )


def release(client: kube.Client, *, namespace: str, name: str) -> Raised:
    """A held TrainJob resumes; but not while pods of the held execution
    still run. Right after a hold, Trainer, JobSet and the Job controller
    have not yet stopped them; a raise then would leave them running below
    the new floor, where the detector (and their sidecars) would flag the
    TrainJob foreign for nothing. Terminating pods do not count: nothing
    judges them.

    Plain mode: A is raised in the update that unsuspends, as open does.
    Kueue mode: the TrainJob's Workloads are set spec.active true and
    nothing else is written: Kueue queues them again, and the next admission
    goes through our check, whose controller raises A. Refused until Kueue
    has suspended the TrainJob after the hold (its execution may still run),
    and when no Workload is inactive (nothing is held)."""
    trainjob = _get_trainjob(client, namespace=namespace, name=name)
    if is_kueue_mode(trainjob):
        return _release_workloads(client, trainjob=trainjob)
    if raising.is_suspended(trainjob):
        _refuse_live_pods(client, namespace=namespace, name=name)
    return _admit(client, namespace=namespace, name=name, trainjob=trainjob)


def _release_workloads(client: kube.Client, *, trainjob: Obj) -> Raised:
    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    held = [w for w in _queued_workloads(client, trainjob=trainjob) if not is_active(w)]
    where = f"TrainJob {namespace}/{name}"
    if not held:
        raise AdapterError(f"{where} is not held: no Workload of it has spec.active false")
    first = held[0]["metadata"]["name"]
    if not raising.is_suspended(trainjob):
        raise AdapterError(f"{where}: Kueue has not yet suspended it after the hold (Workload {first} "
                           "spec.active false); release once it is suspended")
    _refuse_live_pods(client, namespace=namespace, name=name)
    # As plain mode's release: the runtime (the check would reject the admission) and the JobSet UID.
    check_runtime(client, trainjob=trainjob)
    reset = check_jobset(client, namespace=namespace, name=name, jobset=_jobset(client, trainjob=trainjob))
    requeued = tuple(w["metadata"]["name"] for w in held if _set_active(client, workload=w, active=True))
    return Raised(raising.counts(trainjob).current, 0, written=False, jobset_reset=reset,
                  generation=_generation(trainjob), requeued=requeued)


@dataclasses.dataclass(frozen=True)
class Held:
    changed: bool  # False: it was already held
    workloads: tuple[str, ...] = ()  # Kueue mode: its Workloads (set spec.active false, or found so)


def holding(client: kube.Client, *, namespace: str, name: str) -> Held:
    """Hold the TrainJob; A is not touched (the next admission raises it).

    Plain mode: spec.suspend true, preconditioned on the TrainJob read.
    Kueue mode: Kueue's own hold, spec.active false on its Workloads, each
    preconditioned on the Workload read. Kueue then evicts the Workload
    (Deactivated), suspends the TrainJob and resets every admission check
    to Pending. Setting spec.suspend instead would be undone by Kueue at
    once (the Workload is still admitted), and the JobSet's pods would come
    back with the same A and J. Refused when Kueue has not made a Workload
    for it yet."""
    trainjob = _get_trainjob(client, namespace=namespace, name=name)
    if is_kueue_mode(trainjob):
        found = _queued_workloads(client, trainjob=trainjob)
        changed = [_set_active(client, workload=w, active=False) for w in found]
        return Held(any(changed), tuple(w["metadata"]["name"] for w in found))

    def compute(trainjob: Obj) -> tuple[Obj | None, bool]:
        if raising.is_suspended(trainjob):
            return None, False
        trainjob["spec"]["suspend"] = True
        return trainjob, True

    try:
        changed_plain, _ = client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace,
                                                    compute=compute, first=trainjob)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    return Held(changed_plain)


def hold(client: kube.Client, *, namespace: str, name: str) -> bool:
    """`holding`: True when it changed something (it was not held yet)."""
    return holding(client, namespace=namespace, name=name).changed


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

    Each cause is written and announced once (`toolkit.causes`: whole lines,
    bounded, the dropped ones counted once), with the label that finds it
    (`toolkit.flagmark`) in the same update. Only the flag changes; the
    workload is left running. True when the cause was new.

    Within the byte budget (`history.BUDGET`): the flag goes first, so a
    history past its room is shrunk in the same update (`history.make_room`),
    and a cause that does not fit the room left is counted as dropped. When
    the apiserver refuses even that (others' annotations fill the object),
    the label alone is written and the Warning Event still goes out: a flag
    is never lost.
    """

    def compute(trainjob: Obj) -> tuple[Obj | None, Obj | None]:
        annotations = trainjob["metadata"].get("annotations") or {}
        trainjob["metadata"]["annotations"] = annotations
        current = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
        history.make_room(annotations)
        flag_keys = (names.FOREIGN_ANNOTATION, causes.DROPPED_ANNOTATION)
        room = (history.BUDGET - history.ours(annotations, without=flag_keys) - sum(map(len, flag_keys))
                - causes.DROPPED_MOST)
        added = causes.add(current, violation.detail, limit=min(causes.LIMIT, room))
        if added is None:
            if flagmark.needs_label(trainjob):  # flagged without the label: label it, announce nothing again
                flagmark.label(trainjob)
                return trainjob, None
            return None, None
        flagmark.write(trainjob, added)
        return trainjob, trainjob

    def label_only(trainjob: Obj) -> tuple[Obj | None, Obj]:
        if flagmark.is_labelled(trainjob):
            return None, trainjob
        flagmark.label(trainjob)
        return trainjob, trainjob

    try:
        flagged, _ = _write_annotations(client, namespace=namespace, name=name, compute=compute)
    except AnnotationsRefused:
        # The causes cannot be kept on the object: the label and the Event carry the flag.
        try:
            flagged, _ = client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=label_only)
        except kube.NotFound:
            return False
        client.warn(involved=flagged, reason=names.FOREIGN_REASON,
                    message=f"{causes.fold(violation.detail)} (not kept on the TrainJob: its annotations are full)",
                    component=component)
        return True
    except kube.NotFound:
        return False
    if flagged is None:
        return False
    client.warn(involved=flagged, reason=names.FOREIGN_REASON, message=causes.fold(violation.detail),
                component=component)
    return True


is_flagged = flagmark.is_flagged


def record_jobset_uid(client: kube.Client, *, namespace: str, name: str, uid: str,
                      first: Obj | None = None) -> detect.Violation | None:
    """Record the JobSet UID the first time it is seen; a different one later
    is the jobset-uid violation (returned, for the caller to flag). `first`: the
    TrainJob as the caller just read it from the server (saves the read)."""

    def compute(trainjob: Obj) -> tuple[Obj | None, detect.Violation | None]:
        annotations = trainjob["metadata"].get("annotations") or {}
        recorded = annotations.get(names.JOBSET_UID_ANNOTATION)
        if recorded:
            return None, detect.jobset_uid(recorded=recorded, seen=uid)
        annotations[names.JOBSET_UID_ANNOTATION] = uid
        trainjob["metadata"]["annotations"] = annotations
        return trainjob, None

    try:
        violation, _ = _write_annotations(client, namespace=namespace, name=name, compute=compute, first=first)
    except kube.NotFound:
        return None
    return violation


# -- status -----------------------------------------------------------


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
    restarts = restarts_of(jobset)
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
        state=_state(suspended=suspended, held=any(not is_active(w) for w in workloads or [])),
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
        foreign=is_flagged(trainjob),
        foreign_cause="\n".join(foreign.kept) or None,
        foreign_dropped=foreign.dropped,
        foreign_fingerprint=causes.fingerprint(foreign) if is_flagged(trainjob) else None,
    )


def _state(*, suspended: bool, held: bool) -> str:
    if held:
        return HELD if suspended else "running (Workload spec.active false: Kueue is stopping it)"
    return "suspended" if suspended else "running"


def status(client: kube.Client, *, namespace: str, name: str) -> Status:
    """The status, after recording the JobSet UID if it was not yet (and
    flagging a different one), as open and release do; a caller that may
    only read gets the status without the record."""
    trainjob = _get_trainjob(client, namespace=namespace, name=name)
    jobset = _jobset(client, trainjob=trainjob)
    if marks.is_ours(trainjob) and jobset is not None:
        recorded = (trainjob["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION)
        if recorded != jobset["metadata"]["uid"] and not is_flagged_with(trainjob, jobset):
            try:
                check_jobset(client, namespace=namespace, name=name, jobset=jobset)
            except kube.Forbidden:
                pass  # a reader without update rights: the mismatch is still shown, not recorded
            trainjob = _get_trainjob(client, namespace=namespace, name=name)
    workloads = None
    if is_kueue_mode(trainjob):
        try:
            workloads = workloads_of(client, trainjob=trainjob)
        except kube.Forbidden:
            pass  # a reader who may not list Workloads: the state as the TrainJob shows it
    return compute_status(trainjob, jobset, workloads=workloads)


def is_flagged_with(trainjob: Obj, jobset: Obj) -> bool:
    """The JobSet's UID mismatch is already among the causes (no write needed)."""
    annotations = trainjob["metadata"].get("annotations") or {}
    violation = detect.jobset_uid(recorded=annotations.get(names.JOBSET_UID_ANNOTATION), seen=jobset["metadata"]["uid"])
    kept = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), None).kept
    return violation is not None and violation.detail in kept


# -- the execution history ----------------------------------------------


def record_execution(client: kube.Client, *, namespace: str, name: str, observation: history.Observation,
                     first: Obj | None = None) -> bool:
    """Record what a pod showed of its execution (`history.observe`), in one
    update preconditioned on the TrainJob read; nothing is written when it
    adds nothing. True when written. The history is written within its room
    (`history.store`); AnnotationsRefused when even the least history does
    not fit, or the apiserver refuses the write."""

    def compute(trainjob: Obj) -> tuple[Obj | None, bool]:
        if not marks.is_ours(trainjob):
            return None, False
        if history.of(trainjob).unreadable:
            return None, False  # kept as found: the detector flags it (history.unreadable_violation)
        new = history.observe(history.of(trainjob), observation)
        if new is None:
            return None, False
        annotations = trainjob["metadata"].get("annotations") or {}
        if not history.store(annotations, new):
            raise _refused(namespace=namespace, name=name, trainjob=trainjob,
                           detail="our other annotations leave the history no room")
        trainjob["metadata"]["annotations"] = annotations
        return trainjob, True

    try:
        written, _ = _write_annotations(client, namespace=namespace, name=name, compute=compute, first=first)
    except kube.NotFound:
        return False
    return written


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
    trainjob = _get_trainjob(client, namespace=namespace, name=name)
    annotations = trainjob["metadata"].get("annotations") or {}
    foreign = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
    return Executions(
        namespace=namespace,
        name=name,
        state="suspended" if raising.is_suspended(trainjob) else "running",
        history=history.of(trainjob),
        foreign_causes=foreign.kept,
        foreign_dropped=foreign.dropped,
        foreign_fingerprint=causes.fingerprint(foreign) if is_flagged(trainjob) else None,
    )


# -- adopt --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Adopted:
    namespace: str
    name: str
    high_water: int  # the mark the next execution's R is above
    minimum: int  # the least A the next raise writes
    next_r: int  # R of the next execution (with J as the JobSet has it now)
    next_epoch: str | None
    next_attempt: str | None
    jobset_uid: str | None  # the JobSet UID now recorded (None: no JobSet now)
    causes: list[str]  # the causes cleared (kept in the history)
    held: bool  # plain mode: the running TrainJob was suspended by the adoption
    requeued: list[str]  # Kueue mode: Workloads whose check was set Retry (Kueue evicts and re-admits)
    running: bool = False  # still running after the adoption (Kueue mode): its next admission raises

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _requeue(client: kube.Client, *, trainjob: Obj, reason: str, checks: set[str]) -> list[str]:
    """Kueue mode: set our checks (`checks`) Retry on the TrainJob's admitted Workloads, so Kueue
    evicts them and the next admission goes through our check (which raises A above the
    minimum). Preconditioned on the Workload read."""
    done = []
    workloads, _ = client.list(paths.WORKLOAD, namespace=trainjob["metadata"]["namespace"])
    for workload in workloads:
        if not marks.owned_by(workload, trainjob):
            continue
        entries = (workload.get("status") or {}).get("admissionChecks") or []
        if not any(e.get("name") in checks and e.get("state") == "Ready" for e in entries):
            continue
        message = f"adopted ({reason}): re-admit so A is raised above the high-water mark"
        try:
            client.replace(paths.WORKLOAD, admission_checks.with_checks(workload, checks=checks, state="Retry",
                                                                        message=message), subresource="status")
        except (kube.Conflict, kube.NotFound):
            continue  # Kueue moved it on: its next admission goes through the check anyway
        done.append(workload["metadata"]["name"])
    return sorted(done)


def _stamp_adoption(client: kube.Client, *, namespace: str, name: str, placeholder: str, stamp: str) -> None:
    """The last adoption record's time set to the apiserver's stamp, if it still holds the
    placeholder (a later adoption or an unreadable history: left as it is)."""

    def compute(trainjob: Obj) -> tuple[Obj | None, None]:
        kept = history.of(trainjob)
        if kept.unreadable or not kept.adoptions or kept.adoptions[-1].time != placeholder:
            return None, None
        last = dataclasses.replace(kept.adoptions[-1], time=stamp)
        annotations = trainjob["metadata"].get("annotations") or {}
        if not history.store(annotations, dataclasses.replace(kept, adoptions=(*kept.adoptions[:-1], last))):
            return None, None  # no room: the placeholder stays (the detector reads the stamp itself)
        return trainjob, None

    try:
        _write_annotations(client, namespace=namespace, name=name, compute=compute)
    except kube.NotFound:
        pass


def adopt(client: kube.Client, *, namespace: str, name: str, reason: str, reviewed: str,
          checks: set[str] | None = None, controller_name: str = CHECK_CONTROLLER_NAME) -> Adopted:
    """A person's decision after a foreign flag (see docs/adapter.md, "Adopt").

    `reviewed` is what the person read: the causes' fingerprint
    (`causes.fingerprint`, printed by `status` and `executions`). The update
    that clears the flag is computed from the TrainJob it is preconditioned
    on, and is refused when the causes there are not the ones reviewed (a
    cause flagged while the person was deciding): an adoption clears only
    causes a person has seen.

    In ONE update preconditioned on the TrainJob read: the causes and the
    reason go into the history (within its room, `history.store`), the flag is cleared, the current JobSet's UID
    is recorded, and the next raise's minimum A is set so that the next
    execution's R is above the high-water mark; a running TrainJob in plain
    mode is suspended in the same update (its execution's R may repeat, and
    only a raise while suspended moves A), in Kueue mode its admitted
    Workload's check is set Retry. A Normal Event records the reason.

    When it happened is the apiserver's word: the update is written under
    the adopt's own field manager and changes the adoption count it alone
    writes, so the apiserver stamps that entry (`history.adopted_at`); the
    detector exempts pods created by then. The adoption record then takes
    that stamp in place of the placeholder it was written with.

    Our checks, in Kueue mode, are `checks` when given, else the
    AdmissionChecks whose spec.controllerName is `controller_name` (the name
    the controller serves; a CLI cannot read its settings).

    Refused (AdapterError, one line) unless the TrainJob is ours and flagged
    with the causes reviewed, or when the next R would reach the bound 10^6.
    """
    text = " ".join(reason.split())
    if not text:
        raise AdapterError("--reason: empty; say what was checked and why the TrainJob may run again")
    jobset = _jobset(client, trainjob=_get_trainjob(client, namespace=namespace, name=name))
    live = jobset is not None and not jobset["metadata"].get("deletionTimestamp")
    uid = jobset["metadata"]["uid"] if live and jobset is not None else None
    restarts = restarts_of(jobset) if uid else 0
    when = detect.now()  # a placeholder until the apiserver's stamp replaces it (see the docstring)

    def compute(trainjob: Obj) -> tuple[Obj | None, tuple[Obj, Adopted]]:
        where = f"TrainJob {namespace}/{name}"
        if not marks.is_ours(trainjob):
            raise AdapterError(f"{where} is not a dispatch TrainJob (no runtime patch, job-id or floor of ours): "
                               "nothing to adopt")
        annotations = trainjob["metadata"].get("annotations") or {}
        if not is_flagged(trainjob):
            raise AdapterError(f"{where} is not flagged foreign ({names.FOREIGN_ANNOTATION} absent): nothing to adopt")
        flag = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
        now = causes.fingerprint(flag)
        if now != reviewed:
            raise AdapterError(
                f"{where}: the causes changed since they were reviewed ({reviewed}): {len(flag.kept)} cause(s) now"
                + (f" and {flag.dropped} not kept" if flag.dropped else "")
                + f", fingerprint {now}; read `toolkit status {name} -n {namespace}` again, then adopt with it")
        if history.of(trainjob).unreadable:
            raise AdapterError(f"{where}: annotation {history.HISTORY_ANNOTATION} is unreadable, so the high-water "
                               "mark of R is unknown: repair or remove it by hand (kept as found), then adopt")
        try:
            recorded, minimum = history.adopt(history.of(trainjob), time=when, reason=text, causes=flag.kept,
                                              dropped=flag.dropped, restarts=restarts, jobset_uid=uid)
        except history.AdoptRefused as exc:
            raise AdapterError(f"{where}: {exc}") from None
        counts = raising.counts(trainjob)
        next_a = max(counts.current + 1, minimum)
        if next_a + restarts >= 10**6:
            raise AdapterError(f"{where}: the next R would be {next_a + restarts}; R {next_a + restarts} "
                               "is not below the bound 10^6")
        annotations[history.MINIMUM_ANNOTATION] = str(max(minimum, counts.minimum or 0))
        annotations[names.ADOPTIONS_ANNOTATION] = str(
            (detect.parse_count(annotations.get(names.ADOPTIONS_ANNOTATION)) or 0) + 1)
        flagmark.clear(trainjob)
        if uid is not None:
            annotations[names.JOBSET_UID_ANNOTATION] = uid
        else:
            annotations.pop(names.JOBSET_UID_ANNOTATION, None)  # the next JobSet is recorded when first seen
        if not history.store(annotations, recorded):  # last: the room is what the others leave it
            raise _refused(namespace=namespace, name=name, trainjob=trainjob,
                           detail="our other annotations leave the history no room")
        trainjob["metadata"]["annotations"] = annotations
        kueue = names.KUEUE_QUEUE_LABEL in (trainjob["metadata"].get("labels") or {})
        held = not raising.is_suspended(trainjob) and not kueue
        if held:
            trainjob["spec"]["suspend"] = True
        epoch, attempt = history.identity_of(trainjob, admission=next_a, restart=restarts)
        result = Adopted(namespace=namespace, name=name, high_water=recorded.high_water, minimum=next_a,
                         next_r=next_a + restarts, next_epoch=epoch, next_attempt=attempt, jobset_uid=uid,
                         causes=flag.kept, held=held, requeued=[])
        return trainjob, (trainjob, result)

    landed: list[Obj] = []
    try:
        (written, adopted), _ = _write_annotations(client, namespace=namespace, name=name, compute=compute,
                                                    field_manager=names.ADOPT_FIELD_MANAGER, on_written=landed.append)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None
    stamp = history.adopted_at(landed[0]) if landed else None
    if stamp is not None and stamp != when:
        _stamp_adoption(client, namespace=namespace, name=name, placeholder=when, stamp=stamp)
    if names.KUEUE_QUEUE_LABEL in (written["metadata"].get("labels") or {}) and not raising.is_suspended(written):
        adopted = dataclasses.replace(adopted, running=True,
                                      requeued=_requeue(client, trainjob=written, reason=text,
                                                        checks=checks if checks is not None else admission_checks.ours(
                                                            client, controller_name=controller_name)))
    message = (f"adopted: {text} (next R {adopted.next_r} above the high-water mark {adopted.high_water}; "
               f"{len(adopted.causes)} cause(s) cleared, kept in the history)")
    client.event(involved=written, reason=ADOPTED_REASON, message=message[:1024], component=COMPONENT)
    return adopted
