"""Adopt: a person's decision after a foreign flag (docs/adapter.md, "Adopt").

Only a person clears the flag, and only the causes they read: `adopt` takes
the fingerprint of the causes reviewed and refuses when the TrainJob's
differ. In one update preconditioned on the TrainJob read it keeps the
causes and the reason in the history, clears the flag, records the current
JobSet's UID and sets the next raise's minimum A above the high-water mark
(`history.adopt`); a running TrainJob is held (plain mode) or its Workload
sent back through our admission check (Kueue mode, `_requeue`). When it
happened is the apiserver's stamp on the adopt's own field manager, never
the clock of the machine that ran it (`_stamp_adoption`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit import admission_checks, causes, detect, flagmark, history, kube, marks, names, paths, raising
from toolkit.adapter import trainjobs

Obj = dict[str, Any]

# The AdmissionCheck controllerName of our Kueue check (controller.admission).
CHECK_CONTROLLER_NAME = admission_checks.CONTROLLER_NAME
ADOPTED_REASON = "DispatchAdopted"


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
        trainjobs.write_annotations(client, namespace=namespace, name=name, compute=compute)
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
        raise trainjobs.AdapterError("--reason: empty; say what was checked and why the TrainJob may run again")
    jobset = trainjobs.jobset_of(client, trainjob=trainjobs.get_trainjob(client, namespace=namespace, name=name))
    live = jobset is not None and not jobset["metadata"].get("deletionTimestamp")
    uid = jobset["metadata"]["uid"] if live and jobset is not None else None
    restarts = trainjobs.restarts_of(jobset) if uid else 0
    when = detect.now()  # a placeholder until the apiserver's stamp replaces it (see the docstring)

    def compute(trainjob: Obj) -> tuple[Obj | None, tuple[Obj, Adopted]]:
        where = f"TrainJob {namespace}/{name}"
        if not marks.is_ours(trainjob):
            raise trainjobs.AdapterError(f"{where} is not a dispatch TrainJob (no runtime patch, job-id or floor of "
                                         "ours): nothing to adopt")
        annotations = trainjob["metadata"].get("annotations") or {}
        if not flagmark.is_flagged(trainjob):
            raise trainjobs.AdapterError(
                f"{where} is not flagged foreign ({names.FOREIGN_ANNOTATION} absent): nothing to adopt")
        flag = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
        now = causes.fingerprint(flag)
        if now != reviewed:
            raise trainjobs.AdapterError(
                f"{where}: the causes changed since they were reviewed ({reviewed}): {len(flag.kept)} cause(s) now"
                + (f" and {flag.dropped} not kept" if flag.dropped else "")
                + f", fingerprint {now}; read `toolkit status {name} -n {namespace}` again, then adopt with it")
        if history.of(trainjob).unreadable:
            raise trainjobs.AdapterError(
                f"{where}: annotation {history.HISTORY_ANNOTATION} is unreadable, so the high-water mark of R is "
                "unknown: repair or remove it by hand (kept as found), then adopt")
        try:
            recorded, minimum = history.adopt(history.of(trainjob), time=when, reason=text, causes=flag.kept,
                                              dropped=flag.dropped, restarts=restarts, jobset_uid=uid)
        except history.AdoptRefused as exc:
            raise trainjobs.AdapterError(f"{where}: {exc}") from None
        counts = raising.counts(trainjob)
        next_a = max(counts.current + 1, minimum)
        if next_a + restarts >= 10**6:
            raise trainjobs.AdapterError(f"{where}: the next R would be {next_a + restarts}; R {next_a + restarts} "
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
            raise trainjobs.refused(namespace=namespace, name=name, trainjob=trainjob,
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
        (written, adopted), _ = trainjobs.write_annotations(
            client, namespace=namespace, name=name, compute=compute, field_manager=names.ADOPT_FIELD_MANAGER,
            on_written=landed.append)
    except kube.NotFound:
        raise trainjobs.AdapterError(f"TrainJob {namespace}/{name} not found") from None
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
    client.event(involved=written, reason=ADOPTED_REASON, message=message[:1024], component=trainjobs.COMPONENT)
    return adopted
