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
    1. raise A on the TrainJob (`writes.raise_for`), writing in the SAME
       write the marker
       `raised-for = <workload uid>/<workload rv>/<trainjob generation>`,
       where rv is the Workload resourceVersion that showed the reservation
       and the generation is the one this write gives the TrainJob (one
       more than the generation read: a raise always changes the spec);
    2. set our check Ready ("A raised to N") on that same Workload version
       rv, preconditioned on it (`writes.set_checks`). When Kueue wrote the
       Workload since (a 409), only as `_still_approvable` says (below), from
       fresh reads of the Workload and the TrainJob.

Which reads may be cached. The pass starts from the informers' copies: the
Workload that queued it and its TrainJob (a pass the worker queued again,
after a stale or refused pass or an error, reads both fresh). A copy can be
any earlier version (a watch that lags), so every write made from one is
preconditioned on the copy's resourceVersion: the raise is a merge patch
carrying the TrainJob's, the Ready one carrying the Workload's, and a 409
reads once, fresh, and computes again. Two things are never taken from a
cache: "already raised" (a copy carrying this version's marker writes
nothing, so nothing would prove it: the TrainJob is read fresh and decided
on, `writes`), and the runtime, read fresh at every admission (edited a
moment before, it must still be refused). A TrainJob that is not ours, or
that the admission policy refused, is read fresh too before its check is
set without a raise. A stale Workload copy's rv only makes the marker older,
which costs at most a second raise (A only grows), and its Ready a 409. The
Ready lands only on the version the raise was for, or on a version read
fresh that is the same Workload (uid), still waiting on the same checks of
ours; a copy that showed a reservation the Workload no longer has approves
nothing. So per admission, beyond the Ready: the runtime's read and the
raise.

The invariant: Ready is only ever written with an A that no execution has
started with. An execution starts only when spec.suspend goes false, which
changes the TrainJob's spec and so its metadata.generation. Ready for A is
written only when the TrainJob is suspended and its generation is still the
one the raise of A left (`raised_here`): nothing has unsuspended it since
that raise, by hand, by `toolkit open` or `release`, or by Kueue. Either the
Ready is written on the version W the raise was for (its marker names W),
or the pass that raised for W finds a newer version of the same Workload
still waiting on our check and the TrainJob, read fresh, unchanged since its
own raise (`_still_approvable`).

A 409 on the Ready (Kueue wrote the Workload between the version the raise
was for and our Ready) is that second case: the pass reads the Workload and
the TrainJob again and, if both still qualify, writes Ready on the new
version with the same A, so one admission costs one raise. Otherwise the
next pass decides from a fresh read. Any other refusal of step 2 (an
admission policy, a webhook, an error) leaves the check Pending and the next
pass decides from a fresh read too.

Crash (or a refused Ready) between 1 and 2: the next pass finds the marker
on its cached copy, does not trust it and reads the TrainJob: if the
Workload is still W and the TrainJob still suspended at generation g, the
marker matches and step 1 writes nothing (no double raise) before step 2.
If either changed meanwhile (Kueue touched the Workload; the TrainJob was
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
from controller import writes

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


marker = writes.marker
raised_for = writes.raised_for
raised_here = writes.raised_here


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
    version: str | None = None  # "ready": the marker (uid/resourceVersion) of the Workload version the Ready was written on


def reconcile_workload(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    ours: set[str],
    seen: Obj | None = None,
    trainjob: Obj | None = None,
    counter_namespace: str = names.CONTROLLER_NAMESPACE,
) -> Outcome:
    """One pass over one Workload. `seen` is the informer's copy that queued it and `trainjob` the
    informer's copy of its TrainJob (None: read it now). Every write made from a copy is
    preconditioned on it (see "Which reads may be cached" in the module docstring)."""
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
    owner = marks.owner_trainjob(workload)
    current = trainjob if _usable(trainjob, workload, owner=owner) else None
    if current is None and owner is not None:
        try:
            current = client.get(paths.TRAINJOB, name=owner, namespace=namespace)
        except kube.NotFound:
            return Outcome("skipped")  # its job is gone; Kueue deletes the Workload
        if not marks.owned_by(workload, current):
            return Outcome("skipped")  # a deleted predecessor's of the same name: gone with it
    fresh = current is not trainjob
    refused = derive.refusal(current) if current is not None else None
    if refused is not None:
        # Made in a namespace that opts in, but the admission policy could not wrap it: never approved
        # untouched (its trainer would run without an identity), refused with the policy's reason.
        log.warning("not wrapped at creation, check Rejected: %s", refused, extra={"workload": f"{namespace}/{name}"})
        return _set(client, workload, checks=checks, state="Rejected", message=refused, action="rejected",
                    ours=ours if cached else None)
    if current is None or owner is None or not marks.is_ours(current):
        return _set(client, workload, checks=checks, state="Ready", message=UNTOUCHED, action="untouched",
                    ours=ours if cached else None)
    try:
        adapter.check_runtime(client, trainjob=current)
        give = adapter.identity_giver(client, current, counter_namespace=counter_namespace)
    except adapter.AdapterError as exc:
        log.warning("refused, check Rejected: %s", exc, extra={"workload": f"{namespace}/{name}"})
        return _set(client, workload, checks=checks, state="Rejected", message=str(exc), action="rejected",
                    ours=ours if cached else None)
    try:
        raised = writes.raise_for(client, workload=workload, trainjob=current, fresh=fresh, give=give)
    except adapter.AdapterError as exc:
        # Not suspended (or gone): never approve without the raise.
        log.warning("not raised, check left Pending: %s", exc, extra={"workload": f"{namespace}/{name}"})
        return Outcome("refused")
    reserved = workload  # the version the raise was for (its marker names it)
    for _ in range(READY_ATTEMPTS):
        try:
            writes.set_checks(client, workload, checks=checks, state="Ready", message=f"A raised to {raised.admission}")
            return Outcome("ready", raised.admission, raised.conflicts, raised.written,
                           version=marker(workload))
        except kube.NotFound:
            break
        except kube.Conflict:
            # Kueue wrote the Workload since the version the raise was for (its own status, often).
            again = _still_approvable(client, reserved, checks=checks, ours=ours, trainjob=owner, raised=raised)
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


def _usable(trainjob: Obj | None, workload: Obj, *, owner: str | None) -> bool:
    """A cached TrainJob the pass may start from: the Workload's owner (by UID), ours and not
    refused. Any other decision (skip, untouched, rejected) is made on a fresh read."""
    return (trainjob is not None and owner is not None
            and (trainjob.get("metadata") or {}).get("name") == owner
            and marks.owned_by(workload, trainjob) and marks.is_ours(trainjob)
            and derive.refusal(trainjob) is None)


def _still_approvable(client: kube.Client, workload: Obj, *, checks: list[str], ours: set[str], trainjob: str,
                      raised: adapter.Raised) -> Obj | None:
    """The Workload read again, when the A just raised may still be its approval; else None.

    It may when the Workload is the same object still waiting on the same checks of ours, and the
    TrainJob's spec, read fresh, has not changed since our raise (its generation is the one our
    write left: never unsuspended since, so no execution has started with this A), still
    suspended, with our A as its patch and floor and our raise's marker. Anything else, even a
    write that looks harmless, sends the decision back to a fresh pass."""
    namespace = workload["metadata"]["namespace"]
    try:
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
    """Our checks set to `state` without a raise, preconditioned on the version given. `ours`: the
    Workload given is an informer's copy; a 409 reads it once, fresh, and writes again if it still
    waits on the same checks."""
    for attempt in range(2):
        try:
            writes.set_checks(client, workload, checks=checks, state=state, message=message)
            return Outcome(action)
        except kube.NotFound:
            return Outcome("stale")
        except kube.Conflict:
            if ours is None or attempt:
                return Outcome("stale")
        uid = workload["metadata"].get("uid")
        try:
            workload = client.get(paths.WORKLOAD, name=workload["metadata"]["name"],
                                  namespace=workload["metadata"]["namespace"])
        except kube.NotFound:
            return Outcome("stale")
        if workload["metadata"].get("uid") != uid or pending_checks(workload, ours) != checks:
            return Outcome("stale")
    return Outcome("stale")


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
