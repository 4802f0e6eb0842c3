"""Reset detection against the cluster (docs/adapter.md), both modes.

Three inputs, one output. The inputs are the JobSet of one of our TrainJobs
(its UID is recorded the first time it is seen; a different one later is a
reset of J), a pod of our trainer replicated job (the admission annotation
must be there and not below the floor), and a sidecar's Warning Event with
reason `names.SIDECAR_VIOLATION_REASON` on a TrainJob (the sidecar cannot
update the TrainJob, by design, so it reports and we record). The output is
`adapter.flag_foreign`: the cause detail on the TrainJob and a Warning
Event. The rules themselves are `toolkit.detect`, shared with the sidecar.

A sidecar's report is a hint, never evidence: the training container runs
with the pod's ServiceAccount, so its code can create the same Event with
any message. On a report the controller re-reads the evidence itself (the
TrainJob's floor, the named pod's admission annotation and restart label if
that pod is one of this TrainJob's, the JobSet's UID and the pod's JobSet
UID label against the recorded one) and flags only what that re-read
confirms. The claim is kept beside the confirmed cause, on the same line
(`<cause> (confirmed by the controller; the sidecar reported: <claim>)`), so
the foreign annotation keeps its one-cause-a-line contract; the first claim
of a cause is kept, later reports of the same cause add nothing. A report the
re-read does not confirm flags nothing: it is logged as "sidecar report
unconfirmed" and counted (`dispatch_sidecar_reports_total{outcome}`).

What this must never do: stop, suspend, delete or otherwise change the
workload. It only writes the TrainJob's jobset-uid, foreign and history
annotations.

Pods that are terminating or finished are not checked against the floor as
it stands: after a preemption the old execution's pods linger while the
floor is raised for the next one, and they are not a reset. They are judged
by the floor as it stood when they were created instead
(`raising.floor_when_created`: the highest floor set by a raise a second or
more before the pod's creation, both times the apiserver's): a pod created
after the raise that set a floor above its A ran below the floor, whether or
not the controller saw it run. This flags nothing the floor rule would not
have flagged had it seen the pod running, since the floor never falls. Nor are pods created at or before the last
adoption (`history.adopted`): a person has judged their execution.

No flag from a stale cache: the informer's copy of a pod can be older than
the floor read fresh for it (a pod of the previous execution, seen late
across a raise, still looks live there). So a pod is flagged only after a
fresh read of that pod shows the violation too; the informer's copy only
says where to look.

Every trainer pod seen (live or ended) is also recorded in the TrainJob's
execution history (`toolkit.history`, through `adapter.record_execution`),
and a pod of an execution not yet recorded whose R is not above the
history's high-water mark is flagged (`r-repeat`): its epoch repeats. So is
a pod, live or ended, whose execution repeats another by the apiserver's
times alone (`_repeat_by_time`): it started after an execution whose R is not
below its own, or its pods were created on both sides of a raise.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any

from toolkit import adapter, admission_checks, detect, history, kube, marks, names, paths, raising

Obj = dict[str, Any]
log = logging.getLogger(__name__)

REPLICATED_JOB_LABEL = marks.REPLICATED_JOB_LABEL
COMPONENT = "dispatch-controller"
# A claim kept in the flag is bounded like the sidecar's own message
# (sidecar/check.py); a forged one can be any length.
CLAIM_LIMIT = 1024
# The sidecar's message names its pod (sidecar/check.py `message`); its
# Event's reportingInstance does too, and is read first.
CONFIRMED = "(confirmed by the controller; the sidecar reported:"
_CLAIMED_POD = re.compile(r"\[seen by the sidecar of pod=(\S+)")


is_ours = marks.is_ours


# The rules whose verdict depends on the pod still running: judged again on a
# fresh read before a flag. The JobSet UID a pod carries never changes.
LIVE_RULES = frozenset({"missing-admission", "invalid-admission", "invalid-restart", "below-floor",
                        "missing-prologue", "resumed-without-raise", "r-repeat"})


def exempt(pod: Obj, trainjob: Obj) -> bool:
    """Pure: not a pod to judge (see `judge`)."""
    if not marks.is_trainer(pod):
        return True
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    born = (trainjob.get("metadata") or {}).get("creationTimestamp")
    if created and born and created < born:
        return True
    return history.adopted(trainjob, created=created)


def judge(pod: Obj, trainjob: Obj, *, admitted: bool | None = None) -> list[detect.Violation]:
    """Pure: the violations a trainer pod shows against its TrainJob.

    - Not judged: a pod created before the TrainJob (an earlier TrainJob of
      the same name), or at or before the last adoption (judged by a person).
    - Any such pod, running or not: its JobSet UID label against the recorded
      UID (a pod of another JobSet proves the JobSet was replaced).
    - A live pod only, besides: the floor rules; the resume rule (`resumed`:
      `admitted` says, in Kueue mode, whether the TrainJob's Workload is
      admitted through our check now, None when not known); and when those
      and the UID rule pass, the repeat rule against the history (a pod
      already flagged needs no repeat line).
    """
    if exempt(pod, trainjob):
        return []
    unreadable = history.unreadable_violation(history.of(trainjob))
    if unreadable is not None:
        # The repeat rule cannot be judged without the history: the TrainJob is flagged for it,
        # and the other rules still apply.
        return [unreadable, *(v for v in _judge_with(pod, trainjob, admitted=admitted) if v.rule != "r-repeat")]
    return _judge_with(pod, trainjob, admitted=admitted)


def _judge_with(pod: Obj, trainjob: Obj, *, admitted: bool | None) -> list[detect.Violation]:
    """`judge` once the pod is one to judge and the history is readable."""
    meta = pod.get("metadata") or {}
    recorded = history.of(trainjob)
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    pod_jobset = labels.get(names.JOBSET_UID_LABEL)
    found: list[detect.Violation] = []
    if pod_jobset:
        uid_rule = detect.jobset_uid(
            recorded=((trainjob.get("metadata") or {}).get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION),
            seen=pod_jobset,
        )
        if uid_rule is not None:
            found.append(uid_rule)
    if not marks.is_live(pod):
        late = _created_below_floor(pod, trainjob) or _repeat_by_time(pod, trainjob, recorded)
        return [*found, late] if late is not None else found
    # A pod of a replaced JobSet that also runs below the floor shows both: each is its own cause
    # (the sidecar reports both, and a person needs to know of each).
    rule = detect.pod(
        pod_name=str(meta.get("name")),
        admission=annotations.get(names.ADMISSION_ANNOTATION),
        restart=labels.get(names.RESTART_LABEL),
        floor=raising.counts(trainjob).floor,
    )
    if rule is None and isinstance((pod.get("spec") or {}).get("containers"), list):
        rule = detect.prologue_inputs(pod_name=str(meta.get("name")), containers=pod["spec"]["containers"])
    if rule is not None:
        return [*found, rule]
    again = resumed(pod, trainjob, admitted=admitted)
    if again is not None:
        return [*found, again]
    if found:
        return found
    a = detect.parse_count(annotations.get(names.ADMISSION_ANNOTATION))
    j = detect.parse_count(labels.get(names.RESTART_LABEL))
    if a is not None and j is not None:
        repeat = (history.repeat(recorded, a=a, j=j, jobset_uid=pod_jobset, pod=str(meta.get("name")))
                  or _repeat_by_time(pod, trainjob, recorded))
        if repeat is not None:
            return [repeat]
    return []


def resumed(pod: Obj, trainjob: Obj, *, admitted: bool | None) -> detect.Violation | None:
    """Pure: a pod created (by the apiserver's clock) at or after spec.suspend was last set false
    by a writer other than a raise (`raising.unsuspended_by`, the apiserver's record). In plain
    mode only a raise unsuspends, so that alone is the violation. In Kueue mode Kueue unsuspends
    after our check's Ready, so it is one only when the TrainJob's Workload is not admitted
    through our check now (`admitted` False: started by hand, or admitted by a ClusterQueue that
    does not list our check)."""
    writer = raising.unsuspended_at(trainjob)
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if writer is None or not isinstance(created, str) or created < writer[1]:
        return None
    if names.KUEUE_QUEUE_LABEL in ((trainjob.get("metadata") or {}).get("labels") or {}) and admitted is not False:
        return None
    last = raising.last_raise(trainjob)
    return detect.resumed_without_raise(pod_name=str((pod.get("metadata") or {}).get("name")), manager=writer[0],
                                        time=writer[1], raised_at=last[1] if last else None)


def admitted_by(workloads: list[Obj], trainjob: Obj, *, ours: set[str] | None,
                unsuspended: str | None = None) -> bool | None:
    """Pure: whether the TrainJob's Workload (owned by its UID) stands admitted through a check of
    ours for the pods of the unsuspend at `unsuspended` (the apiserver's time; None: not known).

    - None when our checks are not known yet (`ours` None: the controller's cache of them has not
      synced): "not known yet" is never "not ours".
    - Evicted (preempted, or deactivated: `spec.active` false, Kueue's own hold): its pods are on
      their way out, so True for an unsuspend from before the eviction; False for one after it by
      more than the clock margin (`detect.SKEW_SECONDS`; Kueue's condition time is its own clock):
      a `kubectl patch ... suspend:false` while evicted or held starts pods that no admission of
      ours raised A for. A Workload deactivated that Kueue has not evicted yet counts as evicted
      from then on, for any unsuspend.
    - Else True when a check of ours is Ready on it."""
    if ours is None:
        return None
    for workload in workloads:
        if not marks.owned_by(workload, trainjob):
            continue
        status = workload.get("status") or {}
        evicted = next((c for c in status.get("conditions") or []
                        if c.get("type") == "Evicted" and c.get("status") == "True"), None)
        if evicted is not None:
            since = evicted.get("lastTransitionTime")
            if (unsuspended is not None and isinstance(since, str) and detect.is_timestamp(since)
                    and detect.is_timestamp(unsuspended) and detect.after(unsuspended, since)):
                return False
            return True
        if (workload.get("spec") or {}).get("active") is False:
            return unsuspended is None
        if any(e.get("name") in ours and e.get("state") == "Ready" for e in status.get("admissionChecks") or []):
            return True
    return False


def _created_below_floor(pod: Obj, trainjob: Obj) -> detect.Violation | None:
    """An ended pod, by the floor as it stood when the pod was created (`raising.floor_when_created`)."""
    meta = pod.get("metadata") or {}
    a = detect.parse_count((meta.get("annotations") or {}).get(names.ADMISSION_ANNOTATION))
    then = raising.floor_when_created(trainjob, meta.get("creationTimestamp"))
    if a is None or then is None:
        return None
    return detect.created_below_floor(pod_name=str(meta.get("name")), admission=a, floor=then[0], raised_at=then[1])


def _repeat_by_time(pod: Obj, trainjob: Obj, recorded: history.History) -> detect.Violation | None:
    """A pod, live or ended, whose execution repeats another by the apiserver's times, which never
    change: its pods straddle a raise (`history.repeat_across_raise`), or it started after an
    execution whose R is not below its own (`history.repeat_by_creation`)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    a = detect.parse_count((meta.get("annotations") or {}).get(names.ADMISSION_ANNOTATION))
    j = detect.parse_count(labels.get(names.RESTART_LABEL))
    created = meta.get("creationTimestamp")
    if a is None or j is None or not isinstance(created, str) or not detect.is_timestamp(created):
        return None
    key = {"a": a, "j": j, "jobset_uid": labels.get(names.JOBSET_UID_LABEL), "created": created}
    writer = raising.unsuspended_at(trainjob, recorded)
    return (history.repeat_across_raise(recorded, **key, raises=raising.raises(trainjob, recorded))
            or history.repeat_across_unsuspend(recorded, **key, unsuspended=writer[1] if writer else None)
            or history.repeat_after_stop(recorded, **key, stopped=detect.stop_requested(meta))
            or history.repeat_by_creation(recorded, **key, adopted=history.adopted_at(trainjob)))


def pod_violation(pod: Obj, trainjob: Obj) -> detect.Violation | None:
    """Pure: the first violation of a pod of our trainer job, or None."""
    found = judge(pod, trainjob)
    return found[0] if found else None


def claim_text(event: Obj) -> str:
    """The report's message as one bounded line (the flag is one cause a line)."""
    text = " ".join(str(event.get("message") or "").split())
    return text if len(text) <= CLAIM_LIMIT else text[: CLAIM_LIMIT - 3] + "..."


def claimed_rule(claim: str) -> str | None:
    """The rule key the sidecar's message leads with (`<rule>: <detail> ...`)."""
    head, sep, _ = claim.partition(": ")
    return head if sep and re.fullmatch(r"[a-z][a-z-]*", head) else None


def claimed_pod(event: Obj) -> str | None:
    instance = event.get("reportingInstance")
    if isinstance(instance, str) and instance:
        return instance
    found = _CLAIMED_POD.search(str(event.get("message") or ""))
    return found.group(1).rstrip("]") if found else None


def confirmed(*, trainjob: Obj, pod: Obj | None, jobset: Obj | None) -> list[detect.Violation]:
    """Pure: every violation the controller's own reads show for this
    TrainJob. `pod` is the pod a report named (None when it does not exist),
    `jobset` the TrainJob's JobSet (None when there is none); either is
    ignored unless it belongs to this TrainJob, so a report cannot borrow
    another TrainJob's evidence."""
    name = trainjob["metadata"]["name"]
    annotations = trainjob["metadata"].get("annotations") or {}
    recorded = annotations.get(names.JOBSET_UID_ANNOTATION)
    found: list[detect.Violation] = []

    def add(violation: detect.Violation | None) -> None:
        if violation is not None and violation not in found:
            found.append(violation)

    add(detect.floor(annotations.get(names.FLOOR_ANNOTATION)))
    if pod is not None and ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOBSET_NAME_LABEL) == name:
        for violation in judge(pod, trainjob):
            add(violation)
    if jobset is not None and marks.owned_by(jobset, trainjob) and not jobset["metadata"].get("deletionTimestamp"):
        add(detect.jobset_uid(recorded=recorded, seen=jobset["metadata"]["uid"]))
    return found


class Detector:
    def __init__(self, client: kube.Client, *, metrics: Any = None, clock: Callable[[], str] = detect.now,
                 ours: Callable[[], set[str] | None] | None = None) -> None:
        self.client = client
        self.metrics = metrics
        self.clock = clock  # the time recorded in the history
        # The names of the AdmissionChecks whose controllerName is ours (the controller keeps them);
        # None while they are not known yet (its cache has not synced).
        self.ours = ours if ours is not None else (lambda: admission_checks.ours(client))

    def _admitted(self, pod: Obj, trainjob: Obj) -> bool | None:
        """Kueue mode, when the resume rule needs it: the TrainJob's Workload admitted through our
        check now (a list of the namespace's Workloads); None when the rule does not need it."""
        labels = trainjob["metadata"].get("labels") or {}
        writer = raising.unsuspended_at(trainjob)
        if names.KUEUE_QUEUE_LABEL not in labels or not marks.is_live(pod) or writer is None:
            return None
        ours = self.ours()
        if ours is None:
            return None
        workloads, _ = self.client.list(paths.WORKLOAD, namespace=trainjob["metadata"]["namespace"])
        return admitted_by(workloads, trainjob, ours=ours, unsuspended=writer[1])

    def _flag(self, *, namespace: str, name: str, violation: detect.Violation) -> bool:
        new = adapter.flag_foreign(
            self.client, namespace=namespace, name=name, violation=violation, component=COMPONENT
        )
        if new:
            log.warning("flagged foreign: %s", violation.detail, extra={"trainjob": f"{namespace}/{name}", "rule": violation.rule})
            if self.metrics is not None:
                self.metrics.foreign(violation.rule)
        return new

    def _trainjob(self, namespace: str, name: str) -> Obj | None:
        try:
            trainjob = self.client.get(paths.TRAINJOB, name=name, namespace=namespace)
        except kube.NotFound:
            return None
        return trainjob if is_ours(trainjob) else None

    def jobset(self, jobset: Obj) -> bool:
        meta = jobset["metadata"]
        if meta.get("deletionTimestamp"):
            return False
        name = marks.owner_trainjob(jobset)
        trainjob = None if name is None else self._trainjob(meta["namespace"], name)
        if name is None or trainjob is None or not marks.owned_by(jobset, trainjob):
            return False  # not ours, or a deleted predecessor's of the same name
        violation = adapter.record_jobset_uid(self.client, namespace=meta["namespace"], name=name, uid=meta["uid"],
                                              first=trainjob)
        if violation is None:
            return False
        return self._flag(namespace=meta["namespace"], name=name, violation=violation)

    def pod(self, pod: Obj) -> bool:
        """Judge a trainer pod (the rules that depend on it running, from a
        fresh read of it before any flag), record the JobSet UID it names if
        none is recorded yet, and record its execution in the history."""
        meta = pod["metadata"]
        namespace = meta["namespace"]
        name = (meta.get("labels") or {}).get(names.JOBSET_NAME_LABEL)
        if not name or not marks.is_trainer(pod):
            return False
        trainjob = self._trainjob(namespace, name)
        if trainjob is None:
            return False
        pod_jobset = (meta.get("labels") or {}).get(names.JOBSET_UID_LABEL)
        annotations = trainjob["metadata"].get("annotations") or {}
        if pod_jobset and not annotations.get(names.JOBSET_UID_ANNOTATION) and not exempt(pod, trainjob):
            # The first JobSet may be seen through its pods first (the
            # JobSet's own event can be merged away by a quick delete and
            # recreate, the pods' cannot: each pod is its own key): record
            # it, so that a later JobSet is compared with it.
            adapter.record_jobset_uid(self.client, namespace=namespace, name=name, uid=pod_jobset)
            trainjob = self._trainjob(namespace, name) or trainjob
        admitted = self._admitted(pod, trainjob)
        found = judge(pod, trainjob, admitted=admitted)
        if marks.is_live(pod) and any(v.rule in LIVE_RULES for v in found):
            # The cache may be behind the floor just read: judge the pod as it is now. (An ended
            # pod is judged by what never changes: its creation time and its A.)
            fresh = self._one(paths.POD, namespace=namespace, name=meta["name"])
            found = judge(fresh, trainjob, admitted=admitted) if fresh is not None else []
            pod = fresh if fresh is not None else pod
        flagged = False
        for violation in found:
            flagged = self._flag(namespace=namespace, name=name, violation=violation) or flagged
        verdict = f"foreign: {found[0].rule}" if found else "ok"
        observation = history.from_pod(pod, trainjob, now=self.clock(), verdict=verdict)
        if observation is not None:
            # The unsuspend read now is kept with it: its earliest time, should a later write of the
            # same manager move its managedFields time (history.with_unsuspend).
            observation = dataclasses.replace(observation, unsuspend=raising.unsuspend_seen(trainjob))
            adapter.record_execution(self.client, namespace=namespace, name=name, observation=observation,
                                     first=None if flagged else trainjob)
        return flagged

    def _one(self, res: paths.Resource, *, namespace: str, name: str) -> Obj | None:
        """A fresh read by name. A list with a name selector, not a get: the
        controller's Role lists and watches pods and JobSets, never gets them."""
        items, _ = self.client.list(res, namespace=namespace, field_selector=f"metadata.name={name}")
        return items[0] if items else None

    def event(self, event: Obj) -> bool:
        """A sidecar's report: a hint to re-read the evidence, which alone decides."""
        if event.get("reason") != names.SIDECAR_VIOLATION_REASON or event.get("type") != "Warning":
            return False
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "TrainJob":
            return False
        namespace, name = event["metadata"]["namespace"], involved.get("name")
        if not name or (involved.get("namespace") or namespace) != namespace:
            return False
        trainjob = self._trainjob(namespace, name)
        if trainjob is None:
            return False
        if involved.get("uid") and involved["uid"] != trainjob["metadata"].get("uid"):
            return False  # a report about an earlier TrainJob of the same name
        claim = claim_text(event)
        pod_name = claimed_pod(event)
        pod = self._one(paths.POD, namespace=namespace, name=pod_name) if pod_name else None
        jobset = self._one(paths.JOBSET, namespace=namespace, name=name)
        found = confirmed(trainjob=trainjob, pod=pod, jobset=jobset)
        rule = claimed_rule(claim)
        matching = [v for v in found if v.rule == rule]
        flagged = False
        causes = ((trainjob["metadata"].get("annotations") or {}).get(names.FOREIGN_ANNOTATION) or "").split("\n")
        for violation in found:
            if violation in matching:
                prefix = f"{violation.detail} {CONFIRMED}"
                if any(cause.startswith(prefix) for cause in causes):
                    # One claim kept per cause: more reports of it (every pod's
                    # sidecar, or a flood of forged ones) add no line or Event.
                    continue
                violation = detect.Violation(violation.rule, f"{prefix} {claim})")
            flagged = self._flag(namespace=namespace, name=name, violation=violation) or flagged
        # Logged and counted last, once everything this report caused is written.
        if matching:
            self._count("confirmed")
        else:
            log.warning("sidecar report unconfirmed", extra={
                "trainjob": f"{namespace}/{name}", "event": event["metadata"].get("name"), "pod": pod_name,
                "claim": claim, "claimed_rule": rule, "pod_found": pod is not None,
                "confirmed_rules": [v.rule for v in found]})
            self._count("unconfirmed")
        return flagged

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.sidecar_report(outcome)
