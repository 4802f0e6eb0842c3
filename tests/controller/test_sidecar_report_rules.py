"""How a sidecar's report is read and what the controller's own evidence
confirms (pure: `sidecar_reports.confirmed` and the claim helpers; the same on the
real control plane is tests/controller/test_reset_detection.py)."""

from __future__ import annotations

from controller import sidecar_reports
from sidecar import check, report
from toolkit import detect, marks, names

TRAINJOB = {
    "apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}", "kind": "TrainJob",
    "metadata": {"name": "tj", "namespace": "ns", "uid": "tj-uid",
                 "annotations": {names.FLOOR_ANNOTATION: "3", names.JOBSET_UID_ANNOTATION: "js-1"}},
}


def _pod(name: str = "tj-node-0-0-abcde", *, trainjob: str = "tj", admission: str | None = "3",
         jobset_uid: str | None = None, phase: str = "Running") -> dict:
    labels = {names.JOBSET_NAME_LABEL: trainjob, names.RESTART_LABEL: "0",
              marks.REPLICATED_JOB_LABEL: names.TRAINER_REPLICATED_JOB}
    if jobset_uid:
        labels[names.JOBSET_UID_LABEL] = jobset_uid
    annotations = {} if admission is None else {names.ADMISSION_ANNOTATION: admission}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels, "annotations": annotations},
            "status": {"phase": phase}}


def _jobset(uid: str, *, owner: str = "tj", owner_uid: str | None = None) -> dict:
    return {"metadata": {"name": owner, "namespace": "ns", "uid": uid, "ownerReferences": [
        {"apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}", "kind": "TrainJob", "name": owner,
         "uid": owner_uid or f"{owner}-uid"}]}}


def test_a_healthy_trainjob_confirms_nothing():
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=_pod(jobset_uid="js-1"), jobset=_jobset("js-1")) == []
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=None, jobset=None) == []


def test_each_rule_is_confirmed_from_the_controllers_own_objects():
    below = sidecar_reports.confirmed(trainjob=TRAINJOB, pod=_pod("p", admission="2"), jobset=_jobset("js-1"))
    assert below == [detect.Violation("below-floor", "pod p has admission 2, below the floor 3: A may have been lowered")]
    reset = sidecar_reports.confirmed(trainjob=TRAINJOB, pod=None, jobset=_jobset("js-2"))
    assert [v.rule for v in reset] == ["jobset-uid"]
    from_label = sidecar_reports.confirmed(trainjob=TRAINJOB, pod=_pod(jobset_uid="js-0"), jobset=_jobset("js-1"))
    assert from_label == [detect.jobset_uid(recorded="js-1", seen="js-0")]
    bad_floor = {**TRAINJOB, "metadata": {**TRAINJOB["metadata"], "annotations": {names.FLOOR_ANNOTATION: "03"}}}
    assert [v.rule for v in sidecar_reports.confirmed(trainjob=bad_floor, pod=None, jobset=None)] == ["invalid-floor"]


def test_another_trainjobs_pod_or_jobset_and_a_finished_pods_admission_prove_nothing():
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=_pod(trainjob="other", admission=None), jobset=None) == []
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=None, jobset=_jobset("js-9", owner="other")) == []
    # A JobSet of the same name owned by a deleted predecessor (another UID) is not this TrainJob's.
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=None, jobset=_jobset("js-9", owner_uid="old-uid")) == []
    done = _pod(admission="1", jobset_uid="js-1", phase="Succeeded")
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=done, jobset=None) == []


def test_a_finished_pod_of_another_jobset_still_proves_the_jobset_was_replaced():
    """A pod's JobSet UID label never changes: a pod of another JobSet, even
    one that has ended, shows a second JobSet under this TrainJob (the first
    one's own event can be merged away by a quick delete and recreate)."""
    done = _pod(admission="3", jobset_uid="js-0", phase="Succeeded")
    assert sidecar_reports.confirmed(trainjob=TRAINJOB, pod=done, jobset=None) == [
        detect.jobset_uid(recorded="js-1", seen="js-0")]


def test_the_claim_is_read_as_the_sidecar_words_it_and_kept_on_one_bounded_line():
    seen = check.Seen(pod="tj-node-0-0-abcde", admission="1", restart="0", floor="3", recorded_uid="js-1",
                      jobset_uid="js-1")
    violation = check.violations(seen)[0]
    event = report.event(namespace="ns", trainjob=TRAINJOB, pod=seen.pod, message=check.message(violation, seen))
    assert sidecar_reports.claimed_pod(event) == seen.pod
    assert sidecar_reports.claimed_rule(sidecar_reports.claim_text(event)) == "below-floor"
    # Without reportingInstance, the pod the message names.
    assert sidecar_reports.claimed_pod({**event, "reportingInstance": ""}) == seen.pod
    assert sidecar_reports.claimed_pod({"message": "no pod here"}) is None
    assert sidecar_reports.claimed_rule("free text") is None
    forged = sidecar_reports.claim_text({"message": "a\nb\r\n c" + "x" * 5000})
    assert "\n" not in forged and forged.startswith("a b c") and len(forged) == sidecar_reports.CLAIM_LIMIT
