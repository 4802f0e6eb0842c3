"""Open, release and hold: an execution admitted and stopped, in either mode.

- Plain mode: open and release unsuspend in the same update that raises, so
  no pod can start with the previous A; hold sets spec.suspend and leaves A
  alone (the next admission raises it).
- Kueue mode (the TrainJob's queue label, `is_kueue_mode`): nothing here
  unsuspends or raises. Hold and release set the Workload's spec.active
  (Kueue's own hold), and the admission check raises A at the next
  admission; a spec.suspend of ours would be undone by Kueue while the
  Workload is admitted. Open is plain mode's alone.
- Open and release check the runtime again (it may have been edited since
  start) and record the JobSet UID the first time they see it, as the
  controller does; a different UID is flagged, not refused (detection, not
  prevention: `records.check_jobset`).
- Release waits for the held execution's pods to stop (`live_pods`): a
  raise while they run would leave them below the new floor, flagged for
  nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit import derive, kube, marks, names, paths, raising
from toolkit.adapter import generations, raises, records, trainjobs

Obj = dict[str, Any]


def _admit(client: kube.Client, *, namespace: str, name: str, trainjob: Obj,
           counter_namespace: str = names.CONTROLLER_NAMESPACE) -> raises.Raised:
    """Plain mode's admission: the runtime checked again, the JobSet UID
    recorded (or its change flagged), then the raise that unsuspends (with
    the identity of a TrainJob the admission policy wrapped, when it has
    none yet: `generations.giver`). A TrainJob the policy could not wrap is
    refused with the policy's reason."""
    refused = derive.refusal(trainjob)
    if refused is not None:
        raise trainjobs.AdapterError(f"TrainJob {namespace}/{name}: {refused}")
    raises.check_runtime(client, trainjob=trainjob)
    reset = records.check_jobset(client, namespace=namespace, name=name,
                                 jobset=trainjobs.jobset_of(client, trainjob=trainjob))
    give = generations.giver(client, trainjob, counter_namespace=counter_namespace)
    raised = raises.raise_admission(client, namespace=namespace, name=name, unsuspend=True,
                                    first=None if reset else trainjob, give=give)
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
        raise trainjobs.AdapterError(
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


def open_(client: kube.Client, *, namespace: str, name: str,
          counter_namespace: str = names.CONTROLLER_NAMESPACE) -> raises.Raised:
    """Plain mode: raise A and unsuspend, in one preconditioned update (after
    the runtime check and the JobSet UID record, see `_admit`). Refused in
    Kueue mode, where Kueue admits through our check. COUNTER_NAMESPACE holds
    the generation counter (the controller's namespace, where it keeps it)."""
    trainjob = trainjobs.get_trainjob(client, namespace=namespace, name=name)
    if is_kueue_mode(trainjob):
        raise trainjobs.AdapterError(
            f"TrainJob {namespace}/{name} is in Kueue mode (label {names.KUEUE_QUEUE_LABEL}): Kueue admits it "
            "through the admission check, which raises A; open is plain mode's"
        )
    return _admit(client, namespace=namespace, name=name, trainjob=trainjob, counter_namespace=counter_namespace)


def live_pods(client: kube.Client, *, namespace: str, name: str) -> list[str]:
    """The TrainJob's pods that still run (`marks.is_live`: the pods the
    controller's detector judges), sorted by name."""
    pods, _ = client.list(paths.POD, namespace=namespace, label_selector=f"{names.JOBSET_NAME_LABEL}={name}")
    return sorted(str(p["metadata"]["name"]) for p in pods if marks.is_live(p))


def _refuse_live_pods(client: kube.Client, *, namespace: str, name: str) -> None:
    live = live_pods(client, namespace=namespace, name=name)
    if live:
        more = f" and {len(live) - 1} more" if len(live) > 1 else ""
        raise trainjobs.AdapterError(
            f"TrainJob {namespace}/{name}: pod {live[0]}{more} of the held execution still running; "
            "release once the hold has stopped them (they would run below the raised floor)"
        )


def release(client: kube.Client, *, namespace: str, name: str) -> raises.Raised:
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
    trainjob = trainjobs.get_trainjob(client, namespace=namespace, name=name)
    if is_kueue_mode(trainjob):
        return _release_workloads(client, trainjob=trainjob)
    if raising.is_suspended(trainjob):
        _refuse_live_pods(client, namespace=namespace, name=name)
    return _admit(client, namespace=namespace, name=name, trainjob=trainjob)


def _release_workloads(client: kube.Client, *, trainjob: Obj) -> raises.Raised:
    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    held = [w for w in _queued_workloads(client, trainjob=trainjob) if not is_active(w)]
    where = f"TrainJob {namespace}/{name}"
    if not held:
        raise trainjobs.AdapterError(f"{where} is not held: no Workload of it has spec.active false")
    first = held[0]["metadata"]["name"]
    if not raising.is_suspended(trainjob):
        raise trainjobs.AdapterError(f"{where}: Kueue has not yet suspended it after the hold (Workload {first} "
                                     "spec.active false); release once it is suspended")
    _refuse_live_pods(client, namespace=namespace, name=name)
    # As plain mode's release: the runtime (the check would reject the admission) and the JobSet UID.
    raises.check_runtime(client, trainjob=trainjob)
    reset = records.check_jobset(client, namespace=namespace, name=name,
                                 jobset=trainjobs.jobset_of(client, trainjob=trainjob))
    requeued = tuple(w["metadata"]["name"] for w in held if _set_active(client, workload=w, active=True))
    return raises.Raised(raising.counts(trainjob).current, 0, written=False, jobset_reset=reset,
                         generation=trainjobs.generation(trainjob), requeued=requeued)


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
    trainjob = trainjobs.get_trainjob(client, namespace=namespace, name=name)
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
        raise trainjobs.AdapterError(f"TrainJob {namespace}/{name} not found") from None
    return Held(changed_plain)


def hold(client: kube.Client, *, namespace: str, name: str) -> bool:
    """`holding`: True when it changed something (it was not held yet)."""
    return holding(client, namespace=namespace, name=name).changed
