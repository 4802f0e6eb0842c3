"""The rules that judge a trainer pod against its TrainJob: pure, over the objects read.

The inputs are a pod of our trainer replicated job and its TrainJob as read (annotations:
the floor, the recorded JobSet UID, the execution history, the raises and the unsuspends the
apiserver's managedFields record); the output is the list of violations (`detect.Violation`),
which `detector.Detector` flags. The rules themselves are `toolkit.detect`'s and
`toolkit.history`'s, shared with the sidecar and the CLI; this module decides which apply to a
pod and in which order. Nothing here reads or writes the cluster.

Not judged: a pod created before its TrainJob (an earlier TrainJob of the same name), and one
created at or before the last adoption (`history.adopted`): a person has judged its execution.

Pods that are terminating or finished are not checked against the floor as it stands: after a
preemption the old execution's pods linger while the floor is raised for the next one, and they
are not a reset. They are judged by the floor as it stood when they were created instead
(`raising.floor_when_created`: the highest floor set by a raise a second or more before the
pod's creation, both times the apiserver's): a pod created after the raise that set a floor
above its A ran below the floor, whether or not the controller saw it run. This flags nothing
the floor rule would not have flagged had it seen the pod running, since the floor never falls.

A pod of an execution not yet recorded whose R is not above the history's high-water mark is
flagged (`r-repeat`): its epoch repeats. So is a pod, live or ended, whose execution repeats
another by the apiserver's times alone (`_repeat_by_time`): it started after an execution whose
R is not below its own, or its pods were created on both sides of a raise. In Kueue mode the
resume rule needs to know whether the TrainJob's Workload stands admitted through a check of
ours (`admitted_by`); "not known yet" (our checks not synced) is never "not ours".

The rules in LIVE_RULES depend on the pod still running: the detector judges the pod again on a
fresh read before it flags one of them.
"""

from __future__ import annotations

from typing import Any

from toolkit import detect, history, marks, names, raising

Obj = dict[str, Any]


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
