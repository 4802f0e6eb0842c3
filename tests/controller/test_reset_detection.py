"""Resets are detected, not prevented (DESIGN.md §7): the controller records
the JobSet UID, flags a new one, flags pods without A or below the floor and
turns a sidecar's report into the flag, and stops nothing."""

from __future__ import annotations

import pytest

from tests.adapter import kit
from tests.controller.conftest import wait_until
from toolkit import adapter, kube, names

pytestmark = pytest.mark.cluster


def _foreign(admin, namespace, name):
    return kit.annotations(admin, namespace, name).get(names.FOREIGN_ANNOTATION)


def _warnings(admin, namespace, name):
    events, _ = admin.list(kube.EVENT, namespace=namespace, field_selector=f"reason={names.FOREIGN_REASON}")
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
    admin.delete(kube.JOBSET, name=name, namespace=namespace)
    second = kit.create_jobset(admin, tj)
    cause = f"JobSet UID {second['metadata']['uid']} is not the recorded {first['metadata']['uid']}: J may have been reset"
    assert wait_until(lambda: _foreign(admin, namespace, name), what="foreign") == cause
    assert wait_until(lambda: _warnings(admin, namespace, name), what="event") == [cause]
    # the recorded UID stays the first one, and nothing was stopped or removed
    after = admin.get(kube.TRAINJOB, name=name, namespace=namespace)
    assert after["metadata"]["annotations"][names.JOBSET_UID_ANNOTATION] == first["metadata"]["uid"]
    assert after["spec"]["suspend"] is False
    assert admin.get(kube.JOBSET, name=name, namespace=namespace)["metadata"]["uid"] == second["metadata"]["uid"]


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
        live = admin.get(kube.POD, name=pod["metadata"]["name"], namespace=namespace)
        assert not live["metadata"].get("deletionTimestamp")
    assert admin.get(kube.TRAINJOB, name=name, namespace=namespace)["spec"]["suspend"] is False


def test_a_sidecar_report_becomes_the_foreign_flag(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    start_controller()
    detail = "pod x has admission 1, below the floor 3: A may have been lowered"
    admin.warn(involved=tj, reason=names.SIDECAR_VIOLATION_REASON, message=detail, component="dispatch-sidecar")
    assert wait_until(lambda: _foreign(admin, namespace, name), what="foreign") == detail
    assert wait_until(lambda: _warnings(admin, namespace, name), what="event") == [detail]


def test_a_trainjob_that_is_not_ours_is_not_judged(admin, namespace, start_controller):
    body = kit.trainjob_body("stranger")
    body["spec"].pop("runtimePatches")
    tj = admin.create(kube.TRAINJOB, body, namespace=namespace)
    start_controller()
    kit.create_pod(admin, namespace=namespace, trainjob="stranger", admission=None)
    kit.create_jobset(admin, tj)
    marker = kit.create_trainjob(admin, namespace)  # a pod of ours after it: proves the queue got there
    kit.create_pod(admin, namespace=namespace, trainjob=marker["metadata"]["name"], admission=None)
    wait_until(lambda: _foreign(admin, namespace, marker["metadata"]["name"]), what="marker flagged")
    assert kit.annotations(admin, namespace, "stranger") == {}
