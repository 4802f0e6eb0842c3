"""Kueue mode's holds by hand, as pure rules (docs/adapter.md, "Holds in Kueue mode"): one
execution's pods on both sides of an unsuspend, or created after a pod of it was stopped, repeat its
epoch; an unsuspend while the Workload is evicted or deactivated is nobody's admission; the time of
an unsuspend survives a later write of the same field manager; "not known yet" is never "not ours";
the clock margin on both of its sides; and the sidecar's first check reads the same stop."""

from __future__ import annotations

import json

import hypothesis
import hypothesis.strategies as st

from controller import pod_rules
from sidecar import check
from toolkit import detect, history, marks, names, raising

UID = "js-1"


def _at(second: int) -> str:
    return detect.shifted("2026-12-07T10:00:00Z", second)


def _trainjob(*, suspend_owner: tuple[str, int] | None = None, generation: int = 2, recorded: history.History | None = None,
              kueue: bool = True) -> dict:
    fields = []
    if suspend_owner is not None:
        fields.append({"manager": suspend_owner[0], "operation": "Update", "time": _at(suspend_owner[1]),
                       "fieldsV1": {"f:spec": {"f:suspend": {}}}})
    annotations = {names.FLOOR_ANNOTATION: "1", names.JOBSET_UID_ANNOTATION: UID}
    if recorded is not None:
        annotations[names.HISTORY_ANNOTATION] = history.render(recorded)
    return {"metadata": {"name": "tj", "namespace": "ns", "uid": "tj-uid", "generation": generation,
                         "creationTimestamp": _at(-100), "annotations": annotations, "managedFields": fields,
                         "labels": {names.KUEUE_QUEUE_LABEL: "lq"} if kueue else {}},
            "spec": {"suspend": False, "runtimePatches": [raising.patch_entry(1)]}}


def _pod(name: str, *, created: int, a: int = 1, j: int = 0, stopped: int | None = None, grace: int = 30) -> dict:
    meta = {"name": name, "namespace": "ns", "creationTimestamp": _at(created),
            "labels": {names.JOBSET_NAME_LABEL: "tj", names.JOBSET_UID_LABEL: UID, names.RESTART_LABEL: str(j),
                       marks.REPLICATED_JOB_LABEL: names.TRAINER_REPLICATED_JOB},
            "annotations": {names.ADMISSION_ANNOTATION: str(a)}}
    if stopped is not None:
        meta["deletionTimestamp"] = _at(stopped + grace)
        meta["deletionGracePeriodSeconds"] = grace
    return {"metadata": meta, "status": {"phase": "Running"}}


def _observed(recorded: history.History, pod: dict, trainjob: dict) -> history.History:
    obs = history.from_pod(pod, trainjob, now=_at(0), verdict="ok")
    assert obs is not None
    return history.observe(recorded, obs) or recorded


def _rules(pod: dict, trainjob: dict, **kw) -> list[str]:
    return [v.detail for v in pod_rules.judge(pod, trainjob, **kw)]


def test_the_first_delete_request_is_the_deletion_timestamp_less_its_grace():
    assert detect.stop_requested(_pod("p", created=0, stopped=7, grace=30)["metadata"]) == _at(7)
    assert detect.stop_requested(_pod("p", created=0)["metadata"]) is None
    assert detect.stop_requested({"deletionTimestamp": _at(5), "deletionGracePeriodSeconds": -1}) is None


def test_a_pod_created_after_a_pod_of_its_execution_was_stopped_is_flagged_whichever_is_seen_first():
    # A suspend by hand of an admitted TrainJob: the pod is stopped at 10; Kueue, whose Workload is
    # still admitted, unsuspends it, and the same JobSet makes a pod with the same A and J at 12.
    old, new = _pod("p-old", created=0, stopped=10), _pod("p-new", created=12)
    tj = _trainjob()
    stopped_first = _observed(_observed(history.History(), _pod("p-old", created=0), tj), old, tj)
    found = _rules(new, _trainjob(recorded=stopped_first))
    assert found and "has a pod created at 2026-12-07T10:00:12Z, after a pod of it was stopped at " \
                     "2026-12-07T10:00:10Z" in found[0]
    new_first = _observed(_observed(history.History(), _pod("p-old", created=0), tj), new, tj)
    assert "after a pod of it was stopped" in _rules(old, _trainjob(recorded=new_first))[0]


def test_an_execution_whose_pods_were_all_created_before_its_stop_is_not_flagged():
    # A preemption: every pod of the execution is stopped, none is created after.
    tj = _trainjob()
    recorded = history.History()
    for i in range(3):
        recorded = _observed(recorded, _pod(f"p{i}", created=i), tj)
    recorded = _observed(recorded, _pod("p0", created=0, stopped=5), tj)
    for i in range(3):
        assert _rules(_pod(f"p{i}", created=i, stopped=5), _trainjob(recorded=recorded)) == []
    # a pod created in the same second as the stop is not taken for a repeat (the stop of a
    # legitimate execution can land in the second its last pod was created)
    assert _rules(_pod("p3", created=5), _trainjob(recorded=recorded)) == []
    assert _rules(_pod("p3", created=6), _trainjob(recorded=recorded)) != []


def test_a_pod_of_another_execution_is_not_judged_by_this_ones_stop():
    tj = _trainjob()
    recorded = _observed(history.History(), _pod("p0", created=0, stopped=5), tj)
    assert _rules(_pod("q0", created=9, a=2), _trainjob(recorded=recorded)) == []  # re-admitted: A raised
    assert _rules(_pod("q1", created=9, j=1), _trainjob(recorded=recorded)) == []  # a JobSet restart: J + 1


def test_pods_on_both_sides_of_an_unsuspend_by_kueue_repeat_the_execution():
    tj = _trainjob(suspend_owner=("kueue", 20))
    recorded = _observed(history.History(), _pod("p0", created=0), tj)
    found = _rules(_pod("p1", created=21), _trainjob(suspend_owner=("kueue", 20), recorded=recorded), admitted=True)
    assert found and "has pods created before and after the unsuspend at 2026-12-07T10:00:20Z" in found[0]
    # an execution that began at that unsuspend is not flagged
    fresh = _observed(history.History(), _pod("p0", created=21), tj)
    assert _rules(_pod("p1", created=22), _trainjob(suspend_owner=("kueue", 20), recorded=fresh), admitted=True) == []


def test_an_execution_that_began_within_the_margin_of_the_unsuspend_is_not_flagged():
    # Stamped by another apiserver replica whose clock is behind, a pod created just after the
    # unsuspend can read as a second before it.
    tj = _trainjob(suspend_owner=("kueue", 20))
    early = _observed(history.History(), _pod("p0", created=20 - detect.SKEW_SECONDS), tj)
    assert _rules(_pod("p1", created=25), _trainjob(suspend_owner=("kueue", 20), recorded=early), admitted=True) == []
    earlier = _observed(history.History(), _pod("p0", created=19 - detect.SKEW_SECONDS), tj)
    assert _rules(_pod("p1", created=25), _trainjob(suspend_owner=("kueue", 20), recorded=earlier), admitted=True)


def test_a_later_write_of_the_same_manager_does_not_move_the_unsuspend_it_made():
    # `kubectl patch` unsuspends at 20 (generation 3), pods start; the same manager patches a label
    # at 40: its managedFields time moves, the generation does not. The history kept 20.
    at_unsuspend = _trainjob(suspend_owner=("kubectl-patch", 20), generation=3)
    seen = raising.unsuspend_seen(at_unsuspend)
    assert seen == ("kubectl-patch", 3, _at(20))
    recorded = history.with_unsuspend(history.History(), seen)
    after_label = _trainjob(suspend_owner=("kubectl-patch", 40), generation=3, recorded=recorded)
    assert raising.unsuspended_at(after_label) == ("kubectl-patch", _at(20))
    # A pod of the execution that began at 20, created after the label edit: not a repeat.
    ran = history.with_unsuspend(_observed(history.History(), _pod("p0", created=21), at_unsuspend), seen)
    assert _rules(_pod("p1", created=45), _trainjob(suspend_owner=("kubectl-patch", 40), generation=3, recorded=ran),
                  admitted=True) == []
    # Without the kept time the label edit would pass for an unsuspend at 40 and split the execution.
    unkept = _observed(history.History(), _pod("p0", created=21), at_unsuspend)
    assert _rules(_pod("p1", created=45), _trainjob(suspend_owner=("kubectl-patch", 40), generation=3, recorded=unkept),
                  admitted=True)
    # A new generation is a new unsuspend (a suspend and an unsuspend by the same manager).
    assert raising.unsuspended_at(_trainjob(suspend_owner=("kubectl-patch", 60), generation=5,
                                            recorded=recorded)) == ("kubectl-patch", _at(60))


def test_the_kept_unsuspend_is_the_earliest_seen_and_only_the_last_ones_are_kept():
    h = history.with_unsuspend(history.History(), ("kueue", 3, _at(30)))
    h = history.with_unsuspend(h, ("kueue", 3, _at(20)))
    assert h.unsuspends == (("kueue", 3, _at(20)),)
    assert history.with_unsuspend(h, ("kueue", 3, _at(50))) is h
    for g in range(4, 4 + history.MAX_UNSUSPENDS):
        h = history.with_unsuspend(h, ("kueue", g, _at(g)))
    assert len(h.unsuspends) == history.MAX_UNSUSPENDS and ("kueue", 3, _at(20)) not in h.unsuspends
    assert history.parse(history.render(h)).unsuspends == h.unsuspends


def _workload(*, evicted_at: int | None = None, active: bool = True, ready: bool = True) -> dict:
    conditions = [] if evicted_at is None else [
        {"type": "Evicted", "status": "True", "reason": "Deactivated" if not active else "Preempted",
         "lastTransitionTime": _at(evicted_at)}]
    return {"metadata": {"name": "wl", "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                              "name": "tj", "uid": "tj-uid"}]},
            "spec": {"active": active},
            "status": {"conditions": conditions, "admissionChecks": [{"name": "ac", "state": "Ready" if ready else "Pending"}]}}


def test_an_unsuspend_while_evicted_or_deactivated_is_not_an_admission():
    tj = _trainjob()
    after = detect.SKEW_SECONDS + 1
    assert pod_rules.admitted_by([_workload(evicted_at=10)], tj, ours={"ac"}, unsuspended=_at(10 + after)) is False
    assert pod_rules.admitted_by([_workload(evicted_at=10, active=False)], tj, ours={"ac"},
                                unsuspended=_at(10 + after)) is False
    # the unsuspend that began the admission now being torn down: its pods are on their way out
    assert pod_rules.admitted_by([_workload(evicted_at=10)], tj, ours={"ac"}, unsuspended=_at(2)) is True
    # within the margin of Kueue's clock: not judged
    assert pod_rules.admitted_by([_workload(evicted_at=10)], tj, ours={"ac"},
                                unsuspended=_at(10 + detect.SKEW_SECONDS)) is True
    # deactivated, not evicted yet: no unsuspend is an admission
    assert pod_rules.admitted_by([_workload(active=False)], tj, ours={"ac"}, unsuspended=_at(5)) is False
    assert pod_rules.admitted_by([_workload()], tj, ours={"ac"}, unsuspended=_at(5)) is True
    assert pod_rules.admitted_by([_workload(ready=False)], tj, ours={"ac"}, unsuspended=_at(5)) is False


def test_a_pod_started_by_hand_while_evicted_is_flagged():
    tj = _trainjob(suspend_owner=("kubectl-patch", 30))
    admitted = pod_rules.admitted_by([_workload(evicted_at=10)], tj, ours={"ac"}, unsuspended=_at(30))
    found = pod_rules.judge(_pod("p", created=31, a=1), tj, admitted=admitted)
    assert [v.rule for v in found] == ["resumed-without-raise"]


def test_not_knowing_our_checks_yet_judges_nothing_as_not_ours():
    tj = _trainjob(suspend_owner=("kueue", 30))
    assert pod_rules.admitted_by([_workload()], tj, ours=None, unsuspended=_at(30)) is None
    assert pod_rules.judge(_pod("p", created=31), tj, admitted=None) == []
    # ... where an empty set of checks known would have flagged it
    assert [v.rule for v in pod_rules.judge(
        _pod("p", created=31), tj,
        admitted=pod_rules.admitted_by([_workload()], tj, ours=set(), unsuspended=_at(30)))] == ["resumed-without-raise"]


def test_the_sidecars_first_check_reports_a_pod_starting_in_a_stopped_execution():
    tj = _trainjob()
    recorded = _observed(history.History(), _pod("p-old", created=0, stopped=10), tj)
    doc = _trainjob(recorded=recorded)
    labels = _pod("p-new", created=12)["metadata"]["labels"]
    seen = check.seen_from(pod_name="p-new", labels=labels, annotations={names.ADMISSION_ANNOTATION: "1"},
                           trainjob=doc, jobset_uid=UID)
    found = check.violations(seen)
    assert [v.rule for v in found] == ["r-repeat"]
    assert "has a pod starting now, after a pod of it was stopped at 2026-12-07T10:00:10Z" in found[0].detail
    # a pod of the next admission (A raised) is not
    raised = check.seen_from(pod_name="p-next", labels=labels, annotations={names.ADMISSION_ANNOTATION: "2"},
                             trainjob={**doc, "metadata": {**doc["metadata"], "annotations": {
                                 **doc["metadata"]["annotations"], names.FLOOR_ANNOTATION: "2"}}}, jobset_uid=UID)
    assert check.violations(raised) == []


@hypothesis.given(st.one_of(st.none(), st.text(max_size=50), st.binary(max_size=20).map(repr),
                            st.recursive(st.none() | st.integers() | st.text(max_size=5),
                                         lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                           max_size=3)).map(json.dumps)))
def test_the_sidecar_reads_any_history_text_without_failing(text):
    assert detect.stopped_in_history(text, a=1, j=0, jobset_uid=UID) in (None,) or \
        detect.is_timestamp(detect.stopped_in_history(text, a=1, j=0, jobset_uid=UID))


def test_an_execution_started_after_one_of_equal_r_repeats_its_epoch():
    # A=2 J=0 started at 10 (R 2), then A=1 J=1 (R 2) started at 20: the same epoch, later.
    earlier = history.Execution(a=2, j=0, jobset_uid="u", r=2, epoch=None, attempt=None, first_pod="p",
                                first_seen=_at(10), last_seen=_at(10), ended=None, verdict="ok", created=_at(10))
    h = history.History(executions=(earlier,), high_water=2)
    found = history.repeat_by_creation(h, a=1, j=1, jobset_uid="v", created=_at(20))
    assert found is not None and "R 2, started at 2026-12-07T10:00:20Z, after the execution A=2 J=0, R 2" in found.detail
    assert history.repeat_by_creation(h, a=2, j=1, jobset_uid="v", created=_at(20)) is None  # R 3: above


def test_the_margin_on_both_of_its_sides():
    assert detect.after(_at(10 + detect.SKEW_SECONDS + 1), _at(10))
    assert not detect.after(_at(10 + detect.SKEW_SECONDS), _at(10))
    assert not detect.after(_at(10), _at(10 + detect.SKEW_SECONDS + 1))
    assert detect.shifted(_at(59), 2) == "2026-12-07T10:01:01Z"


def _execution(*, a: int, j: int, uid: str, created: int) -> history.Execution:
    return history.Execution(a=a, j=j, jobset_uid=uid, r=a + j, epoch=None, attempt=None, first_pod="p",
                             first_seen=_at(created), last_seen=_at(created), ended=None, verdict="ok",
                             created=_at(created))


def test_the_start_order_rule_gives_the_margin_to_executions_that_start_close_together():
    # A JobSet restart starts the next execution a moment after the last: stamped by replicas
    # whose clocks disagree, the later start can read as the earlier.
    h = history.History(executions=(_execution(a=1, j=1, uid="u", created=10),), high_water=2)
    close = 10 + detect.SKEW_SECONDS
    assert history.repeat_by_creation(h, a=1, j=0, jobset_uid="u", created=_at(close)) is None
    assert history.repeat_by_creation(h, a=1, j=0, jobset_uid="u", created=_at(close + 1)) is not None


def test_the_raise_between_rule_gives_the_margin_to_the_earlier_side():
    h = history.History(executions=(_execution(a=2, j=0, uid="u", created=10),), high_water=2)
    near = [(2, _at(10 + detect.SKEW_SECONDS))]
    far = [(2, _at(11 + detect.SKEW_SECONDS))]
    assert history.repeat_across_raise(h, a=2, j=0, jobset_uid="u", created=_at(30), raises=near) is None
    assert history.repeat_across_raise(h, a=2, j=0, jobset_uid="u", created=_at(30), raises=far) is not None


def test_an_ended_pod_is_judged_only_by_raises_more_than_the_margin_before_it():
    tj = _trainjob()
    fields = tj["metadata"]["managedFields"]
    fields.append({"manager": names.RAISE_FIELD_MANAGER, "operation": "Update", "time": _at(20)})
    tj["metadata"]["annotations"][names.FLOOR_ANNOTATION] = "2"
    assert raising.floor_when_created(tj, _at(20 + detect.SKEW_SECONDS)) is None
    assert raising.floor_when_created(tj, _at(21 + detect.SKEW_SECONDS)) == (2, _at(20))
