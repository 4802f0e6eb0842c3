"""The Kueue admission check (docs/adapter.md, Kueue mode).

Kueue reserves quota for a Workload, then waits for every AdmissionCheck of
its ClusterQueue to be Ready before it admits and unsuspends the job. Ours
is the moment A is raised: the TrainJob is still suspended, so Trainer's
webhook allows the runtime-patch change, and no pod of the coming execution
exists yet.

Only our TrainJobs (`marks.is_ours`: what `toolkit start` writes) are
raised. A Workload that waits on our check but is not owned by one of them
(a user's own TrainJob, or any other job, in a ClusterQueue that lists our
check) has no identity of ours to keep: its check is set Ready untouched,
with the message "not a dispatch TrainJob: approved without a raise", and
nothing of ours is written on its job. Leaving it Pending instead would hold
its quota forever for a rule that does not apply to it.

For a Workload owned by one of our TrainJobs (its ownerReferences name the
TrainJob's UID, not only its name: a TrainJob deleted and created again
under the same name is another object), with QuotaReserved true and our
check Pending, the TrainJob's runtime is checked again first (it may have
been edited since start): a refusal sets our check Rejected with the refusal
(the field and the value found) as its message, and Kueue deactivates the
Workload, releasing its quota, until a person fixes the runtime and
reactivates it. Otherwise:
    1. raise A on the TrainJob (`adapter.raise_admission`), writing in the
       SAME update the marker
       `raised-for = <workload uid>/<workload rv>/<trainjob generation>`,
       where rv is the Workload resourceVersion that showed the reservation
       and the generation is the one this update gives the TrainJob (one
       more than the generation read: a raise always changes the spec);
    2. read the Workload again, now, after the raise, and set our check
       Ready ("A raised to N") on the version read, as a status update
       preconditioned on it: directly when it is still the version rv the
       raise was for; when Kueue wrote it since (it often does, right after
       its reservation or in reply to the raise), only as `_still_approvable`
       says (below), from a fresh read of the TrainJob.

Which reads may be cached. The pass starts from the informer's copy of the
Workload that queued it (a pass the worker queued again, after a stale or
refused pass or an error, reads it fresh). That copy only says where to
look: it can be any earlier version (a watch that lags), and nothing written
trusts it. The TrainJob is read fresh and the raise is preconditioned on that
read, so whether this TrainJob was already raised for this admission
(`raised_here`: suspended, at the generation its raise left) is decided on
the TrainJob as it is; a stale copy's rv only makes the marker older, which
costs at most a second raise (A only grows). The Ready is written on the
version read after the raise and checked there: the same Workload (uid),
still waiting on the same checks of ours; a copy that showed a reservation
the Workload no longer has approves nothing. Reading the Workload after the
raise rather than before is also what spares most passes a 409 on the Ready
(Kueue's writes after the reservation land while we raise).

The invariant: Ready is only ever written with an A that no execution has
started with. An execution starts only when spec.suspend goes false, which
changes the TrainJob's spec and so its metadata.generation. Ready for A is
written only when the TrainJob is suspended and its generation is still the
one the raise of A left (`raised_here`): nothing has unsuspended it since
that raise, by hand, by `toolkit open` or `release`, or by Kueue. Either the
TrainJob carries raised-for = W/g and Ready is written on that version W
(step 2 needs W unchanged), or the pass that raised for W finds a newer
version of the same Workload still waiting on our check and the TrainJob
unchanged since its own raise (`_still_approvable`).

A Workload written since the raise's version (step 2), or a 409 on the
Ready (Kueue wrote it between our read and our Ready), is that second case:
the pass reads the TrainJob again (and, after a 409, the Workload) and, if
both still qualify, writes Ready on the new version with the same A, so one
admission costs one raise. Otherwise the next pass decides from a fresh read. Any other refusal
of step 2 (an admission policy, a webhook, an error) leaves the check
Pending and the next pass decides from a fresh read too.

Crash (or a refused Ready) between 1 and 2: the next pass reads the
Workload; if it is still W and the TrainJob still suspended at generation g,
the marker matches and step 1 writes nothing (no double raise) before step
2. If either changed meanwhile (Kueue touched the Workload; the TrainJob was
started and stopped again), the marker does not match and A is raised
again: R grows by two instead of one, which is still monotonic. So R always
increases across admissions, and an A an execution may have used is never
approved.

An evicted Workload is left alone until Kueue reserves quota for it again.
Kueue sets Evicted and resets our check to Pending at once, but keeps the
quota reserved until the job is suspended; approving in that window would
spend the raise on an admission that is being taken back (the re-admission
would then find the check already Ready). Kueue's next reservation sets
Evicted back to false (SetQuotaReservation), so nothing waits forever.

The check's Active condition is kept true on every AdmissionCheck whose
spec.controllerName is ours; only those checks' states are touched.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from toolkit import adapter, admission_checks, derive, detect, kube, marks, names, paths, raising

Obj = dict[str, Any]

CONTROLLER_NAME = adapter.CHECK_CONTROLLER_NAME
UNTOUCHED = "not a dispatch TrainJob: approved without a raise"
READY_ATTEMPTS = 3  # Ready writes per pass: the first, and two after a Workload write Kueue slipped in
log = logging.getLogger(__name__)


def condition_true(obj: Obj, kind: str) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("status") == "True"
    return False


def check_state(workload: Obj, check: str) -> str | None:
    for entry in (workload.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == check:
            return str(entry.get("state"))
    return None


def pending_checks(workload: Obj, ours: set[str]) -> list[str]:
    """Our checks that this Workload waits on now: QuotaReserved true, not
    Evicted, and the check Pending. Empty when there is nothing to do."""
    if not condition_true(workload, "QuotaReserved") or condition_true(workload, "Evicted"):
        return []
    return sorted(c for c in ours if check_state(workload, c) == "Pending")


def in_eviction_window(workload: Obj) -> bool:
    """Evicted while the quota is still reserved (see the module docstring)."""
    return condition_true(workload, "QuotaReserved") and condition_true(workload, "Evicted")


def marker(workload: Obj) -> str:
    """The Workload version a raise is for: "<uid>/<resourceVersion>"."""
    meta = workload["metadata"]
    return f"{meta['uid']}/{meta['resourceVersion']}"


def _generation(trainjob: Obj) -> int | None:
    generation = (trainjob.get("metadata") or {}).get("generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else None


def raised_for(workload: Obj, trainjob: Obj) -> str:
    """The raised-for marker a raise for this Workload version writes on TRAINJOB as read before
    the raise: the Workload's marker and the generation the raise's update gives the TrainJob."""
    return f"{marker(workload)}/{(_generation(trainjob) or 0) + 1}"


def raised_here(trainjob: Obj, workload: Obj) -> bool:
    """The TrainJob was raised for this Workload version and nothing has changed its spec since
    (still suspended, at the generation that raise left): no execution has started with its A."""
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    generation = _generation(trainjob)
    return (raising.is_suspended(trainjob) and generation is not None
            and annotations.get(adapter.RAISED_FOR_ANNOTATION) == f"{marker(workload)}/{generation}")


def with_check_ready(workload: Obj, *, checks: list[str], admission: int) -> Obj:
    """The Workload with our checks set Ready; pure (copies the status list)."""
    return with_checks(workload, checks=checks, state="Ready", message=f"A raised to {admission}")


with_checks = admission_checks.with_checks


@dataclasses.dataclass(frozen=True)
class Outcome:
    action: str  # "ready", "untouched" (not ours, approved), "rejected" (runtime), "skipped", "refused", "stale"
    admission: int | None = None
    conflicts: int = 0
    raised: bool = False


def reconcile_workload(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    ours: set[str],
    on_conflict: Any = None,
    seen: Obj | None = None,
    counter_namespace: str = names.CONTROLLER_NAMESPACE,
) -> Outcome:
    """One pass over one Workload. `seen` is the informer's copy that queued it (None: read it
    now). The copy only says whether to look: nothing it says is trusted for a write (see
    "Which reads may be cached" in the module docstring); the TrainJob is read fresh, the raise is
    preconditioned on it, and the Workload is read fresh after the raise, for the Ready."""
    cached = seen is not None
    if seen is None:
        try:
            seen = client.get(paths.WORKLOAD, name=name, namespace=namespace)
        except kube.NotFound:
            return Outcome("skipped")
    workload = seen
    checks = pending_checks(workload, ours)
    if not checks:
        return Outcome("skipped")
    trainjob = marks.owner_trainjob(workload)
    current: Obj | None = None
    if trainjob is not None:
        try:
            current = client.get(paths.TRAINJOB, name=trainjob, namespace=namespace)
        except kube.NotFound:
            return Outcome("skipped")  # its job is gone; Kueue deletes the Workload
        if not marks.owned_by(workload, current):
            return Outcome("skipped")  # a deleted predecessor's of the same name: gone with it
    refused = derive.refusal(current) if current is not None else None
    if refused is not None:
        # Made in a namespace that opts in, but the admission policy could not wrap it: never approved
        # untouched (its trainer would run without an identity), refused with the policy's reason.
        log.warning("not wrapped at creation, check Rejected: %s", refused, extra={"workload": f"{namespace}/{name}"})
        return _set(client, workload, checks=checks, state="Rejected", message=refused, action="rejected",
                    ours=ours if cached else None)
    if current is None or trainjob is None or not marks.is_ours(current):
        return _set(client, workload, checks=checks, state="Ready", message=UNTOUCHED, action="untouched",
                    ours=ours if cached else None)
    try:
        adapter.check_runtime(client, trainjob=current)
        give = adapter.identity_giver(client, current, counter_namespace=counter_namespace)
    except adapter.AdapterError as exc:
        log.warning("refused, check Rejected: %s", exc, extra={"workload": f"{namespace}/{name}"})
        return _set(client, workload, checks=checks, state="Rejected", message=str(exc), action="rejected",
                    ours=ours if cached else None)
    def already(tj: Obj) -> int | None:
        return raising.counts(tj).current if raised_here(tj, workload) else None

    try:
        raised = adapter.raise_admission(
            client,
            namespace=namespace,
            name=trainjob,
            record=lambda tj: (adapter.RAISED_FOR_ANNOTATION, raised_for(workload, tj)),
            skip_if=already,
            on_conflict=on_conflict,
            first=current,
            give=give,
        )
    except adapter.AdapterError as exc:
        # Not suspended (or gone): never approve without the raise.
        log.warning("not raised, check left Pending: %s", exc, extra={"workload": f"{namespace}/{name}"})
        return Outcome("refused")
    reserved = workload  # the version the raise was for (its marker names it)
    # The Workload read after the raise, not before: Kueue's own writes of the reservation (and its
    # reaction to the raise) have mostly landed by now, so the Ready below rarely meets a 409.
    try:
        workload = client.get(paths.WORKLOAD, name=name, namespace=namespace)
    except kube.NotFound:
        return Outcome("stale", raised.admission, raised.conflicts, raised.written)
    if workload["metadata"].get("resourceVersion") != reserved["metadata"].get("resourceVersion"):
        # Not the version the raise was for: approvable only as `_still_approvable` says.
        again = _still_approvable(client, reserved, checks=checks, ours=ours, trainjob=trainjob, raised=raised,
                                  again=workload)
        if again is None:
            return Outcome("stale", raised.admission, raised.conflicts, raised.written)
        workload = again
    elif pending_checks(workload, ours) != checks or workload["metadata"].get("uid") != reserved["metadata"].get("uid"):
        return Outcome("stale", raised.admission, raised.conflicts, raised.written)
    for _ in range(READY_ATTEMPTS):
        try:
            client.replace(paths.WORKLOAD, with_check_ready(workload, checks=checks, admission=raised.admission),
                           subresource="status")
            return Outcome("ready", raised.admission, raised.conflicts, raised.written)
        except kube.NotFound:
            break
        except kube.Conflict:
            # Kueue wrote the Workload between our read and our Ready (its own status, often).
            again = _still_approvable(client, reserved, checks=checks, ours=ours, trainjob=trainjob,
                                      raised=raised)
            if again is None:
                break
            workload = again
        except (kube.Invalid, kube.Forbidden) as exc:
            # Refused by an admission policy or a webhook: the check stays Pending; the next pass
            # decides from a fresh read (any other error is retried the same way by the worker).
            log.warning("check Ready refused, left Pending: %s", exc, extra={"workload": f"{namespace}/{name}"})
            return Outcome("refused", raised.admission, raised.conflicts, raised.written)
    # The Workload moved on in a way this raise cannot vouch for: the next pass decides from a
    # fresh read (and raises again if it must).
    return Outcome("stale", raised.admission, raised.conflicts, raised.written)


def _still_approvable(client: kube.Client, workload: Obj, *, checks: list[str], ours: set[str], trainjob: str,
                      raised: adapter.Raised, again: Obj | None = None) -> Obj | None:
    """The Workload read again, when the A just raised may still be its approval; else None.

    It may when the Workload is the same object still waiting on the same checks of ours, and the
    TrainJob's spec has not changed since our raise (its generation is the one our write left:
    never unsuspended since, so no execution has started with this A), still suspended, with our
    A as its patch and floor and our raise's marker. Anything else, even a write that looks
    harmless, sends the decision back to a fresh pass."""
    namespace = workload["metadata"]["namespace"]
    try:
        if again is None:
            again = client.get(paths.WORKLOAD, name=workload["metadata"]["name"], namespace=namespace)
        tj = client.get(paths.TRAINJOB, name=trainjob, namespace=namespace)
    except kube.NotFound:
        return None
    same = (again["metadata"].get("uid") == workload["metadata"].get("uid")
            and pending_checks(again, ours) == checks)
    untouched = (raised.generation is not None
                 and (tj.get("metadata") or {}).get("generation") == raised.generation
                 and raising.is_suspended(tj)
                 and raising.counts(tj) == raising.Counts(patch=raised.admission, floor=raised.admission)
                 and raised_here(tj, workload))
    return again if same and untouched else None


def _set(client: kube.Client, workload: Obj, *, checks: list[str], state: str, message: str, action: str,
         ours: set[str] | None = None) -> Outcome:
    """Our checks set to `state` without a raise, preconditioned on the version read. `ours`: the
    Workload given is an informer's copy, read again first (it must still wait on the same checks)."""
    try:
        if ours is not None:
            uid = workload["metadata"].get("uid")
            workload = client.get(paths.WORKLOAD, name=workload["metadata"]["name"],
                                  namespace=workload["metadata"]["namespace"])
            if workload["metadata"].get("uid") != uid or pending_checks(workload, ours) != checks:
                return Outcome("stale")
        client.replace(paths.WORKLOAD, with_checks(workload, checks=checks, state=state, message=message),
                       subresource="status")
    except (kube.Conflict, kube.NotFound):
        return Outcome("stale")
    return Outcome(action)


def ensure_active(client: kube.Client, check: Obj) -> bool:
    """Set the AdmissionCheck's Active condition true if it is not; True
    when written. Preconditioned on the version read."""
    conditions = [dict(c) for c in (check.get("status") or {}).get("conditions") or []]
    for cond in conditions:
        if cond.get("type") == "Active" and cond.get("status") == "True":
            return False
    conditions = [c for c in conditions if c.get("type") != "Active"]
    conditions.append(
        {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": "dispatch admission-check controller is running",
            "lastTransitionTime": detect.now(),
            "observedGeneration": (check.get("metadata") or {}).get("generation", 0),
        }
    )
    body = dict(check)
    body["status"] = {**(check.get("status") or {}), "conditions": conditions}
    try:
        client.replace(paths.ADMISSION_CHECK, body, subresource="status")
    except kube.Conflict:
        return False
    return True
