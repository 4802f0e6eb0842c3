"""The verdict for one pod (pure): every rule of docs/adapter.md and the ok case,
the Event message and the Event body (the backoff schedule: tests/toolkit/test_core.py)."""

from __future__ import annotations


import pytest

from sidecar import check, report
from toolkit import detect, names

OK = check.Seen(pod="tj-node-0-0-abc", admission="3", restart="1", floor="3", recorded_uid="uid-1",
                jobset_uid="uid-1")


@pytest.mark.parametrize(("change", "rules"), [
    ({}, []),
    ({"floor": None}, []),                       # nothing raised yet
    ({"recorded_uid": None}, []),                # UID not recorded yet
    ({"jobset_uid": None}, []),                  # JobSet UID unknown: that rule is skipped
    ({"restart": None}, []),
    ({"admission": "4"}, []),                    # above the floor is fine
    ({"admission": None}, ["missing-admission"]),
    ({"admission": "2"}, ["below-floor"]),
    ({"admission": "0"}, ["below-floor"]),
    ({"admission": ""}, ["invalid-admission"]),
    ({"admission": "03"}, ["invalid-admission"]),
    ({"admission": "1234567"}, ["invalid-admission"]),
    ({"admission": " 3"}, ["invalid-admission"]),
    ({"restart": "x"}, ["invalid-restart"]),
    ({"restart": "-1"}, ["invalid-restart"]),
    ({"floor": "three"}, ["invalid-floor"]),
    ({"jobset_uid": "uid-2"}, ["jobset-uid"]),
    ({"admission": "1", "jobset_uid": "uid-2"}, ["below-floor", "jobset-uid"]),
])
def test_rules(change: dict[str, str | None], rules: list[str]) -> None:
    assert [v.rule for v in check.violations(OK._replace(**change))] == rules


def test_the_message_names_rule_pod_values_and_cause() -> None:
    seen = OK._replace(admission="2")
    (violation,) = check.violations(seen)
    text = check.message(violation, seen)
    assert text.startswith("below-floor: pod tj-node-0-0-abc has admission 2, below the floor 3")
    for part in ("pod=tj-node-0-0-abc", "admission='2'", "restart-attempt='1'", "floor='3'",
                 "jobset-uid='uid-1'", "recorded-jobset-uid='uid-1'"):
        assert part in text


def test_the_uid_message_is_the_designed_sentence() -> None:
    seen = OK._replace(jobset_uid="uid-2")
    (violation,) = check.violations(seen)
    assert "JobSet UID uid-2 is not the recorded uid-1: J may have been reset" in check.message(violation, seen)


def test_a_huge_malformed_value_keeps_the_message_bounded() -> None:
    seen = OK._replace(admission="9" * 5000)
    (violation,) = check.violations(seen)
    text = check.message(violation, seen)
    assert text.startswith("invalid-admission: ")
    assert len(text) <= check.MESSAGE_LIMIT


def test_seen_from_the_objects() -> None:
    trainjob = {"metadata": {"name": "tj", "uid": "t-uid", "annotations": {
        names.FLOOR_ANNOTATION: "3", names.JOBSET_UID_ANNOTATION: "uid-1"}}}
    seen = check.seen_from(pod_name="p", labels={names.RESTART_LABEL: "1"},
                           annotations={names.ADMISSION_ANNOTATION: "3"}, trainjob=trainjob, jobset_uid="uid-1")
    assert seen == OK._replace(pod="p")
    bare = check.seen_from(pod_name="p", labels={}, annotations={}, trainjob={"metadata": {}}, jobset_uid=None)
    assert (bare.admission, bare.restart, bare.floor, bare.recorded_uid) == (None, None, None, None)


def test_the_event_is_a_warning_on_the_trainjob() -> None:
    body = report.event(namespace="ns", trainjob={"metadata": {"name": "tj", "uid": "t-uid"}}, pod="p",
                        message="m")
    assert body["involvedObject"] == {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                      "name": "tj", "namespace": "ns", "uid": "t-uid"}
    assert (body["type"], body["reason"], body["message"]) == ("Warning", names.SIDECAR_VIOLATION_REASON, "m")


def test_reported_once_per_distinct_violation() -> None:
    reported = report.Reported()
    first = detect.Violation("below-floor", "pod p has admission 2, below the floor 3")
    assert reported.is_new(first)
    reported.add(first)
    assert not reported.is_new(detect.Violation("below-floor", "pod p has admission 2, below the floor 3"))
    assert reported.is_new(detect.Violation("below-floor", "pod p has admission 2, below the floor 4"))
