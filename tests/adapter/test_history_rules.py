"""The execution history (toolkit.history) as pure rules: one record per
execution (A, J), bounded with a count of the dropped, a high-water mark of R
that never falls, the repeat rule, and what an adoption records and requires."""

from __future__ import annotations

import dataclasses
import json

import hypothesis
import hypothesis.strategies as st
import pytest

from toolkit import history, identity, names

T0 = "2026-12-04T10:00:00Z"


def _seen(h: history.History, a: int, j: int, **kw) -> history.History:
    obs = history.Observation(a=a, j=j, jobset_uid=kw.pop("uid", "u1"), epoch=kw.pop("epoch", None), attempt=kw.pop("attempt", None),
                              pod=kw.pop("pod", f"p-{a}-{j}"), time=kw.pop("time", T0),
                              ended=kw.pop("ended", None), verdict=kw.pop("verdict", "ok"),
                              created=kw.pop("created", None))
    assert not kw
    out = history.observe(h, obs)
    return h if out is None else out


def test_an_execution_is_recorded_once_with_its_identity_and_first_pod():
    h = _seen(history.History(), 1, 0, epoch="7000003000001", attempt="job.3.0.1.0", pod="tj-node-0-0-a")
    obs = history.Observation(a=1, j=0, jobset_uid="u1", epoch="7000003000001", attempt="job.3.0.1.0", pod="tj-node-0-1-b",
                              time="2026-12-04T10:00:05Z", ended=None, verdict="ok")
    assert history.observe(h, obs) is None  # another rank of the same execution: nothing to write
    (e,) = h.executions
    assert (e.a, e.j, e.r, e.epoch, e.attempt, e.first_pod, e.first_seen) == (
        1, 0, 1, "7000003000001", "job.3.0.1.0", "tj-node-0-0-a", T0)
    assert h.high_water == 1


def test_how_it_ended_and_a_foreign_verdict_are_kept_once_known():
    h = _seen(history.History(), 1, 0)
    h = _seen(h, 1, 0, ended="failed", time="2026-12-04T10:01:00Z")
    h = _seen(h, 1, 0, ended="stopped")  # the other ranks deleted by the restart
    h = _seen(h, 1, 0, verdict="foreign: below-floor")
    h = _seen(h, 1, 0, verdict="ok")
    (e,) = h.executions
    assert (e.ended, e.verdict, e.last_seen) == ("failed", "foreign: below-floor", T0)


def test_the_history_keeps_the_last_executions_and_counts_the_dropped():
    h = history.History()
    for r in range(1, history.MAX_EXECUTIONS + 6):
        h = _seen(h, r, 0)
    assert [e.r for e in h.executions] == list(range(6, history.MAX_EXECUTIONS + 6))
    assert h.dropped == 5
    assert h.high_water == history.MAX_EXECUTIONS + 5
    # a late pod of a dropped execution is not recorded again (nor counted twice)
    assert history.observe(h, history.Observation(a=2, j=0, jobset_uid="u1", epoch=None, attempt=None, pod="late", time=T0,
                                                  ended=None, verdict="ok")) is None


@hypothesis.given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=60))
def test_the_high_water_mark_is_the_highest_r_ever_seen_and_never_falls(pairs):
    h = history.History()
    marks = []
    for a, j in pairs:
        h = _seen(h, a, j)
        marks.append(h.high_water)
        h = history.parse(history.render(h))  # and survives its annotation
    assert marks == sorted(marks)
    assert h.high_water == max((a + j for a, j in pairs), default=0)


def test_a_new_execution_at_or_below_the_mark_repeats_an_epoch():
    h = _seen(_seen(history.History(), 1, 0), 1, 3)  # R 1, then R 4
    found = history.repeat(h, a=2, j=0, jobset_uid="u1", pod="p")
    assert found is not None and found.rule == "r-repeat"
    assert found.detail == ("pod p runs A=2 J=0, R 2, not above the highest R 4 of an earlier execution: "
                            "its epoch repeats or goes back")
    assert history.repeat(h, a=4, j=1, jobset_uid="u1", pod="p") is None  # R 5: above
    assert history.repeat(h, a=1, j=3, jobset_uid="u1", pod="p") is None  # the recorded execution itself
    # the same A and J under a recreated JobSet is a new execution, and repeats
    assert history.repeat(h, a=1, j=3, jobset_uid="u2", pod="p").rule == "r-repeat"


def test_an_unreadable_history_reads_as_empty_and_says_so():
    h = history.parse("{not json")
    assert h.unreadable and h.executions == () and h.high_water == 0
    assert history.parse(None) == history.History()


def test_the_history_carries_its_format_version_and_reads_one_without_it():
    h = _seen(history.History(), 1, 0)
    written = history.render(h)
    assert json.loads(written)["version"] == history.FORMAT_VERSION == 1
    assert history.parse(written) == h
    doc = json.loads(written)
    del doc["version"]  # the same format, with no version field
    assert history.parse(json.dumps(doc)) == h


def test_a_history_of_a_newer_format_is_kept_as_found_and_says_which():
    doc = json.loads(history.render(_seen(history.History(), 1, 0)))
    doc["version"] = history.FORMAT_VERSION + 1
    h = history.parse(json.dumps(doc))
    assert h.unreadable and h.newer_format == 2 and h.executions == () and h.high_water == 0
    violation = history.unreadable_violation(h)
    assert violation is not None
    assert "has format version 2, newer than this dispatch reads (1)" in violation.detail


@pytest.mark.parametrize("version", ["1", 0, -1, 1.5, None, True])
def test_a_format_version_that_is_not_a_positive_integer_is_unreadable(version):
    doc = json.loads(history.render(history.History()))
    doc["version"] = version
    h = history.parse(json.dumps(doc))
    assert h.unreadable and not h.newer_format


def test_an_adoption_sets_the_minimum_so_the_next_r_is_above_the_mark():
    h = _seen(_seen(history.History(), 3, 0), 3, 4)  # mark 7
    adopted, minimum = history.adopt(h, time=T0, reason="JobSet deleted by hand; checkpoints checked",
                                     causes=["JobSet UID b is not the recorded a: J may have been reset"],
                                     dropped=0, restarts=0, jobset_uid="b")
    assert minimum == 8  # next A 8 with J 0: R 8 > 7
    assert history.adopt(h, time=T0, reason="r", causes=[], dropped=0, restarts=2, jobset_uid=None)[1] == 6
    (rec,) = adopted.adoptions
    assert (rec.reason, rec.high_water, rec.minimum, rec.jobset_uid) == (
        "JobSet deleted by hand; checkpoints checked", 7, 8, "b")
    assert rec.causes == ["JobSet UID b is not the recorded a: J may have been reset"]
    assert history.parse(history.render(adopted)) == adopted


def test_an_adoption_past_the_r_bound_is_refused_naming_the_bound():
    h = _seen(history.History(), identity.R_LIMIT - 1, 0)
    with pytest.raises(history.AdoptRefused, match="R 1000000 is not below the bound 10\\^6"):
        history.adopt(h, time=T0, reason="r", causes=[], dropped=0, restarts=0, jobset_uid=None)


def test_adoptions_and_their_text_are_bounded():
    h = history.History()
    for i in range(history.MAX_ADOPTIONS + 2):
        h, _ = history.adopt(h, time=T0, reason="x" * 5000, causes=["c" * 100] * 100, dropped=0, restarts=0,
                             jobset_uid=None)
    assert len(h.adoptions) == history.MAX_ADOPTIONS and h.adoptions_dropped == 2
    assert len(history.render(h)) < 64 * 1024


def test_a_pod_created_by_the_last_adoption_was_judged_by_its_person():
    """By the apiserver's stamp on the adopt's own field manager, not by the time in the record
    (which the operator's clock may have written)."""
    h, _ = history.adopt(history.History(), time="2026-12-04T10:10:00Z", reason="r", causes=[], dropped=0,
                         restarts=0, jobset_uid=None)
    tj = {"metadata": {"annotations": {history.HISTORY_ANNOTATION: history.render(h)}, "managedFields": [
        {"manager": names.ADOPT_FIELD_MANAGER, "operation": "Update", "time": T0}]}}
    assert history.adopted(tj, created="2026-12-04T09:59:59Z")
    assert history.adopted(tj, created=T0)
    assert not history.adopted(tj, created="2026-12-04T10:00:01Z")
    assert not history.adopted({"metadata": {"annotations": tj["metadata"]["annotations"]}}, created=T0)


def _pod(a: str | None, j: str, *, phase: str = "Running", deleting: bool = False) -> dict:
    meta = {"name": "tj-node-0-0-x", "labels": {names.RESTART_LABEL: j, names.JOBSET_UID_LABEL: "u1"},
            "annotations": {},
            "creationTimestamp": T0}
    if a is not None:
        meta["annotations"][names.ADMISSION_ANNOTATION] = a
    if deleting:
        meta["deletionTimestamp"] = T0
    return {"metadata": meta, "status": {"phase": phase}}


def _trainjob(prefix: str = "7000003") -> dict:
    env = [{"name": names.ENV_EPOCH_PREFIX, "value": prefix}, {"name": names.ENV_TOKEN_PREFIX, "value": "job.3.0"}]
    return {"metadata": {"name": "tj"}, "spec": {"trainer": {"env": env}}}


def test_an_observation_of_a_pod_carries_its_identity_and_how_it_ended():
    obs = history.from_pod(_pod("2", "1", phase="Failed"), _trainjob(), now=T0, verdict="ok")
    assert obs is not None
    assert (obs.a, obs.j, obs.jobset_uid, obs.epoch, obs.attempt, obs.ended) == (
        2, 1, "u1", "7000003000003", "job.3.0.2.1", "failed")
    assert history.from_pod(_pod("2", "1", deleting=True), _trainjob(), now=T0, verdict="ok").ended == "stopped"
    assert history.from_pod(_pod(None, "1"), _trainjob(), now=T0, verdict="ok") is None
    assert history.from_pod(_pod("0", "0"), _trainjob(), now=T0, verdict="ok") is None  # the prologue refuses A = 0
    assert obs.created == T0  # the pod's creationTimestamp, the apiserver's


def test_past_the_r_bound_there_is_no_epoch_and_no_token():
    assert history.identity_of(_trainjob(), admission=999_999, restart=1) == (None, None)
    assert history.identity_of(_trainjob(prefix=""), admission=1, restart=0) == ("1", "job.3.0.1.0")


def _at(second: int) -> str:
    return f"2026-12-04T10:00:{second:02d}Z"


def test_a_record_keeps_the_earliest_creation_of_its_pods_and_survives_a_round_trip():
    h = _seen(history.History(), 1, 0, created=_at(5))
    later = history.Observation(a=1, j=0, jobset_uid="u1", epoch=None, attempt=None, pod="b", time=T0, ended=None,
                                verdict="ok", created=_at(9))
    moved = history.observe(h, later)
    # A later pod moves the latest creation (the stop rule's side), once: the same again adds nothing.
    assert moved is not None and [(e.created, e.latest) for e in moved.executions] == [(_at(5), _at(9))]
    assert history.observe(moved, later) is None
    h = moved
    h = _seen(h, 1, 0, created=_at(3))  # an earlier pod of it, seen later
    h = dataclasses.replace(h, raised=4)
    again = history.parse(history.render(h))
    assert [e.created for e in again.executions] == [_at(3)] and again.raised == 4
    assert history.highest_admission(again) == 4
    bad = json.loads(history.render(h))
    bad["executions"][0]["created"] = "yesterday"
    assert history.parse(json.dumps(bad)).unreadable


def test_an_execution_that_started_after_one_with_an_r_not_below_its_own_repeats():
    h = _seen(_seen(history.History(), 2, 0, created=_at(10)), 1, 0, created=_at(20))
    found = history.repeat_by_creation(h, a=1, j=0, jobset_uid="u1", created=_at(21))
    assert found is not None and found.rule == "r-repeat"
    assert found.detail.startswith(f"the execution A=1 J=0, R 1, started at {_at(20)}, after the execution A=2 J=0, "
                                   f"R 2, started at {_at(10)}")
    # In R's order, in the same second, or a record without a creation time: nothing.
    ordered = _seen(_seen(history.History(), 1, 0, created=_at(10)), 2, 0, created=_at(20))
    assert history.repeat_by_creation(ordered, a=2, j=0, jobset_uid="u1", created=_at(20)) is None
    assert history.repeat_by_creation(ordered, a=1, j=0, jobset_uid="u1", created=_at(10)) is None
    same = _seen(history.History(), 2, 0, created=_at(10))
    assert history.repeat_by_creation(same, a=1, j=0, jobset_uid="u1", created=_at(10)) is None
    unknown = _seen(history.History(), 2, 0)
    assert history.repeat_by_creation(unknown, a=1, j=0, jobset_uid="u1", created=_at(20)) is None
    # An execution that started by the last adoption was judged by a person, a pod of it made since too.
    assert history.repeat_by_creation(h, a=1, j=0, jobset_uid="u1", created=_at(30), adopted=_at(20)) is None
    assert history.repeat_by_creation(h, a=1, j=0, jobset_uid="u1", created=_at(30), adopted=_at(19)) is not None


def test_one_executions_pods_on_both_sides_of_a_raise_repeat():
    h = _seen(history.History(), 3, 0, created=_at(10))
    found = history.repeat_across_raise(h, a=3, j=0, jobset_uid="u1", created=_at(30), raises=[(3, _at(20))])
    assert found is not None and found.rule == "r-repeat"
    assert found.detail.startswith(f"the execution A=3 J=0, R 3, has pods created before and after the raise at {_at(20)}")
    # Seen in the other order (the later pod recorded first): the same.
    later = _seen(history.History(), 3, 0, created=_at(30))
    assert history.repeat_across_raise(later, a=3, j=0, jobset_uid="u1", created=_at(10), raises=[(3, _at(20))])
    # A raise in the same second as either pod, none between, or another JobSet's record: nothing.
    for raises in ([(3, _at(10))], [(3, _at(30))], [(3, _at(5)), (4, _at(40))], []):
        assert history.repeat_across_raise(h, a=3, j=0, jobset_uid="u1", created=_at(30), raises=raises) is None
    assert history.repeat_across_raise(h, a=3, j=0, jobset_uid="u2", created=_at(30), raises=[(3, _at(20))]) is None
