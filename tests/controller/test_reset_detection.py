"""Resets are detected, not prevented (docs/adapter.md): the controller records
the JobSet UID, flags a new one, flags pods without A or below the floor and
turns a sidecar's report into the flag only once it has confirmed the
violation itself, and stops nothing."""

from __future__ import annotations

import pytest

from tests.adapter import kit
from tests.controller.conftest import wait_until
from sidecar import report
from toolkit import adapter, names, paths

pytestmark = pytest.mark.cluster


def _foreign(admin, namespace, name):
    return kit.annotations(admin, namespace, name).get(names.FOREIGN_ANNOTATION)


def _warnings(admin, namespace, name):
    events, _ = admin.list(paths.EVENT, namespace=namespace, field_selector=f"reason={names.FOREIGN_REASON}")
    return [e["message"] for e in events if e["involvedObject"]["name"] == name]


def test_a_recreated_jobset_is_flagged_with_the_exact_cause_and_nothing_is_stopped(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    adapter.open_(admin, namespace=namespace, name=name)
    start_controller()
    first = kit.create_jobset(admin, tj)
    wait_until(lambda: kit.annotations(admin, namespace, name).get(names.JOBSET_UID_ANNOTATION) == first["metadata"]["uid"],
               what="recorded uid")
    assert _foreign(admin, namespace, name) is None
    admin.delete(paths.JOBSET, name=name, namespace=namespace)
    second = kit.create_jobset(admin, tj)
    cause = f"JobSet UID {second['metadata']['uid']} is not the recorded {first['metadata']['uid']}: J may have been reset"
    assert wait_until(lambda: _foreign(admin, namespace, name), what="foreign") == cause
    assert wait_until(lambda: _warnings(admin, namespace, name), what="event") == [cause]
    # the recorded UID stays the first one, and nothing was stopped or removed
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert after["metadata"]["annotations"][names.JOBSET_UID_ANNOTATION] == first["metadata"]["uid"]
    assert after["spec"]["suspend"] is False
    assert admin.get(paths.JOBSET, name=name, namespace=namespace)["metadata"]["uid"] == second["metadata"]["uid"]


def test_pods_without_the_annotation_or_below_the_floor_are_flagged_and_left_running(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    for _ in range(3):
        adapter.raise_admission(admin, namespace=namespace, name=name)
    adapter.open_(admin, namespace=namespace, name=name)  # floor 4
    start_controller()
    ok = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="4")
    # an initializer pod carries no A by design: not ours to check
    kit.create_pod(admin, namespace=namespace, trainjob=name, admission=None, replicated_job="dataset-initializer")
    missing = kit.create_pod(admin, namespace=namespace, trainjob=name, admission=None)
    below = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="2", restart="1")
    expected = {
        f"pod {missing['metadata']['name']} has no annotation dispatch.phpboyscout.uk/admission: "
        "it was not created from our runtime patch",
        f"pod {below['metadata']['name']} has admission 2, below the floor 4: A may have been lowered",
    }
    wait_until(lambda: set((_foreign(admin, namespace, name) or "").split("\n")) == expected, what="both flagged")
    assert set(wait_until(lambda: len(_warnings(admin, namespace, name)) == 2 and _warnings(admin, namespace, name))) == expected
    for pod in (ok, missing, below):
        live = admin.get(paths.POD, name=pod["metadata"]["name"], namespace=namespace)
        assert not live["metadata"].get("deletionTimestamp")
    assert admin.get(paths.TRAINJOB, name=name, namespace=namespace)["spec"]["suspend"] is False


def _sidecar_report(admin, *, trainjob, pod: str, message: str) -> dict:
    """A report as the sidecar words and posts it (sidecar.report.event); the
    training container holds the same token, so anything here can be forged."""
    namespace = trainjob["metadata"]["namespace"]
    return admin.create(paths.EVENT, report.event(namespace=namespace, trainjob=trainjob, pod=pod, message=message),
                        namespace=namespace)


def _unconfirmed(ctl, namespace, name):
    return [line for line in list(ctl.lines)
            if line.get("message") == "sidecar report unconfirmed" and line.get("trainjob") == f"{namespace}/{name}"]


def test_a_forged_report_on_a_healthy_trainjob_flags_nothing_and_is_logged_unconfirmed(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    adapter.open_(admin, namespace=namespace, name=name)  # floor 1
    ctl = start_controller()
    jobset = kit.create_jobset(admin, tj)
    wait_until(lambda: kit.annotations(admin, namespace, name).get(names.JOBSET_UID_ANNOTATION) == jobset["metadata"]["uid"],
               what="recorded uid")
    healthy = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")["metadata"]["name"]
    # A real below-floor pod, but of another TrainJob: it proves nothing about this one.
    other = kit.create_trainjob(admin, namespace)
    for _ in range(3):
        adapter.raise_admission(admin, namespace=namespace, name=other["metadata"]["name"])
    elsewhere = kit.create_pod(admin, namespace=namespace, trainjob=other["metadata"]["name"], admission="1")
    tj = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    forged = {
        healthy: f"below-floor: pod {healthy} has admission 0, below the floor 1: A may have been lowered",
        "no-such-pod": "missing-admission: pod no-such-pod has no annotation dispatch.phpboyscout.uk/admission: "
                       "it was not created from our runtime patch",
        elsewhere["metadata"]["name"]: f"below-floor: pod {elsewhere['metadata']['name']} has admission 1, "
                                       "below the floor 3: A may have been lowered",
    }
    uid_claim = f"jobset-uid: JobSet UID forged-uid is not the recorded {jobset['metadata']['uid']}: J may have been reset"
    for pod, message in forged.items():
        _sidecar_report(admin, trainjob=tj, pod=pod, message=message)
    _sidecar_report(admin, trainjob=tj, pod=healthy, message=uid_claim)
    _sidecar_report(admin, trainjob=tj, pod=healthy, message="anything at all\nsecond line")
    logged = wait_until(lambda: len(_unconfirmed(ctl, namespace, name)) == 5 and _unconfirmed(ctl, namespace, name),
                        what="five unconfirmed reports")
    assert sorted(line["claim"] for line in logged) == sorted(
        [*forged.values(), uid_claim, "anything at all second line"])
    assert {line["level"] for line in logged} == {"warning"}
    # The controller's own pass over the other TrainJob's pod flags that one, not this one.
    wait_until(lambda: _foreign(admin, namespace, other["metadata"]["name"]), what="the other TrainJob flagged")
    assert _foreign(admin, namespace, name) is None
    assert _warnings(admin, namespace, name) == []
    status, body = ctl.get("/metrics")
    assert 'dispatch_sidecar_reports_total{outcome="unconfirmed"} 5.0' in body


def test_a_real_violation_reported_by_the_sidecar_is_flagged_with_its_claim_alongside(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    for _ in range(2):
        adapter.raise_admission(admin, namespace=namespace, name=name)
    adapter.open_(admin, namespace=namespace, name=name)  # floor 3
    ctl = start_controller()
    below = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")["metadata"]["name"]
    detail = f"pod {below} has admission 1, below the floor 3: A may have been lowered"
    claim = f"below-floor: {detail} [seen by the sidecar of pod={below} admission='1' floor='3']"
    _sidecar_report(admin, trainjob=admin.get(paths.TRAINJOB, name=name, namespace=namespace), pod=below, message=claim)
    confirmed = f"{detail} (confirmed by the controller; the sidecar reported: {claim})"
    # The controller's own pod check flags the plain cause; the report adds
    # its line, with the sidecar's words kept beside the confirmed cause.
    assert wait_until(lambda: set((_foreign(admin, namespace, name) or "").split("\n")) == {detail, confirmed},
                      what="both lines")
    # The same cause reported again (another pod's sidecar, or a flood of
    # forged claims about it): counted, no new line and no new Event.
    for i in range(3):
        _sidecar_report(admin, trainjob=admin.get(paths.TRAINJOB, name=name, namespace=namespace), pod=below,
                        message=f"below-floor: {detail} [again {i}]")
    wait_until(lambda: 'dispatch_sidecar_reports_total{outcome="confirmed"} 4.0' in ctl.get("/metrics")[1],
               what="four confirmed reports")
    assert set((_foreign(admin, namespace, name) or "").split("\n")) == {detail, confirmed}
    assert sorted(_warnings(admin, namespace, name)) == sorted([detail, confirmed])
    assert _unconfirmed(ctl, namespace, name) == []


def test_a_reported_jobset_reset_is_confirmed_from_the_jobset_itself(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    adapter.open_(admin, namespace=namespace, name=name)
    first = kit.create_jobset(admin, tj)
    adapter.record_jobset_uid(admin, namespace=namespace, name=name, uid=first["metadata"]["uid"])
    admin.delete(paths.JOBSET, name=name, namespace=namespace)
    second = kit.create_jobset(admin, tj)
    cause = f"JobSet UID {second['metadata']['uid']} is not the recorded {first['metadata']['uid']}: J may have been reset"
    pod = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")["metadata"]["name"]
    claim = f"jobset-uid: {cause} [seen by the sidecar of pod={pod}]"
    _sidecar_report(admin, trainjob=admin.get(paths.TRAINJOB, name=name, namespace=namespace), pod=pod, message=claim)
    start_controller()
    confirmed = f"{cause} (confirmed by the controller; the sidecar reported: {claim})"
    assert wait_until(lambda: set((_foreign(admin, namespace, name) or "").split("\n")) == {cause, confirmed},
                      what="both lines")


def test_a_trainjob_that_is_not_ours_is_not_judged(admin, namespace, start_controller):
    body = kit.trainjob_body("stranger")
    body["spec"].pop("runtimePatches")
    tj = admin.create(paths.TRAINJOB, body, namespace=namespace)
    start_controller()
    kit.create_pod(admin, namespace=namespace, trainjob="stranger", admission=None)
    kit.create_jobset(admin, tj)
    marker = kit.create_trainjob(admin, namespace)  # a pod of ours after it: proves the queue got there
    kit.create_pod(admin, namespace=namespace, trainjob=marker["metadata"]["name"], admission=None)
    wait_until(lambda: _foreign(admin, namespace, marker["metadata"]["name"]), what="marker flagged")
    assert kit.annotations(admin, namespace, "stranger") == {}


def test_a_stale_cached_pod_seen_across_a_raise_flags_nothing_while_a_real_one_is_flagged(admin, namespace):
    """The informer's copy of a pod can be older than the floor read for it:
    the previous execution's pod, replayed as it was while it ran, after the
    hold stopped it and the release raised the floor. The detector judges
    the pod as a fresh read shows it (here: gone), so no flag; a pod that
    really runs below the floor is still flagged."""
    from controller import detector

    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    adapter.open_(admin, namespace=namespace, name=name)  # floor 1
    old = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")
    adapter.hold(admin, namespace=namespace, name=name)
    admin.delete(paths.POD, name=old["metadata"]["name"], namespace=namespace, body={"gracePeriodSeconds": 0})
    adapter.release(admin, namespace=namespace, name=name)  # floor 2
    watcher = detector.Detector(admin)
    assert watcher.pod(old) is False  # the old version, replayed late
    assert _foreign(admin, namespace, name) is None
    real = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")
    assert watcher.pod(real) is True
    assert _foreign(admin, namespace, name) == (
        f"pod {real['metadata']['name']} has admission 1, below the floor 2: A may have been lowered")


def test_a_jobset_left_by_a_deleted_trainjob_of_the_same_name_is_not_recorded(admin, namespace, start_controller):
    """The same request started again right after its TrainJob was deleted: the old TrainJob's
    JobSet (same name, owned by the old UID) is still there until the garbage collector removes
    it. It is not the new TrainJob's: its UID is not recorded, and the new TrainJob's own JobSet is
    recorded, not flagged."""
    start_controller()
    old = kit.create_trainjob(admin, namespace)
    name = old["metadata"]["name"]
    admin.delete(paths.TRAINJOB, name=name, namespace=namespace)
    wait_until(lambda: not admin.list(paths.TRAINJOB, namespace=namespace)[0], what="the old TrainJob gone")
    new = kit.create_trainjob(admin, namespace, name=name)
    stale = kit.create_jobset(admin, old)  # what the old TrainJob's JobSet is until it is collected
    adapter.open_(admin, namespace=namespace, name=name)
    assert kit.annotations(admin, namespace, name).get(names.JOBSET_UID_ANNOTATION) != stale["metadata"]["uid"]
    wait_until(lambda: admin.list(paths.JOBSET, namespace=namespace, field_selector=f"metadata.name={name}")[0] == [],
               what="the garbage collector to remove the old JobSet")
    own = kit.create_jobset(admin, new)
    wait_until(lambda: kit.annotations(admin, namespace, name).get(names.JOBSET_UID_ANNOTATION) == own["metadata"]["uid"],
               what="the new JobSet's UID recorded")
    assert _foreign(admin, namespace, name) is None


def test_a_running_trainer_pod_without_the_prologues_inputs_is_flagged(admin, namespace, start_controller):
    """A runtime that gives the TrainJob's spec.trainer to another replicated job than `node` (or
    to none): `node`'s pods run the image's own command, without the prologue's inputs, so
    without DISPATCH_EPOCH. The pod carries A and J like any other; its missing env shows it."""
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    adapter.open_(admin, namespace=namespace, name=name)  # A 1
    start_controller()
    kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")
    bare = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", prologue=False)
    cause = (f"pod {bare['metadata']['name']}: its container node has no DISPATCH_K8S_ADMISSION, "
             "DISPATCH_K8S_RESTART, DISPATCH_K8S_EPOCH_PREFIX, DISPATCH_K8S_TOKEN_PREFIX: it runs without the "
             "prologue, so without DISPATCH_EPOCH (its runtime does not give the TrainJob's command to it)")
    assert wait_until(lambda: _foreign(admin, namespace, name), what="the flag") == cause
