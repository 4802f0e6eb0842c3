"""The admission check acts only on our TrainJobs, and checks their runtime
again at each admission (the cases: a user's own TrainJob in a queue with
our check; a runtime edited after start). The test acts as Kueue on real
Workload objects; the controller is a real process under its shipped RBAC."""

from __future__ import annotations

import uuid

import pytest

from controller import admission
from tests.adapter import kit
from tests.controller.conftest import wait_until
from toolkit import names, paths, raising

pytestmark = pytest.mark.cluster


def _check(admin) -> str:
    name = f"dispatch-{uuid.uuid4().hex[:8]}"
    kit.create_admission_check(admin, name)
    return name


def _entry(admin, namespace, wl, check, state):
    return wait_until(
        lambda: (e := kit.check_entry(admin, namespace=namespace, name=wl["metadata"]["name"], check=check))
        .get("state") == state and e, what=state)


def test_a_users_own_trainjob_in_a_queue_with_our_check_is_admitted_and_left_untouched(admin, namespace, start_controller):
    check = _check(admin)
    body = kit.trainjob_body("users-own")
    body["spec"].pop("runtimePatches")
    theirs = admin.create(paths.TRAINJOB, body, namespace=namespace)
    before = admin.get(paths.TRAINJOB, name="users-own", namespace=namespace)
    wl = kit.create_workload(admin, theirs)
    start_controller()
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    entry = _entry(admin, namespace, wl, check, "Ready")
    assert entry["message"] == admission.UNTOUCHED
    after = admin.get(paths.TRAINJOB, name="users-own", namespace=namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # not one write
    assert not any(k.startswith(names.DOMAIN) for k in after["metadata"].get("annotations") or {})
    assert "runtimePatches" not in after["spec"]
    # and ours, in the same queue, is still raised before its Ready
    ours = kit.create_trainjob(admin, namespace)
    wl2 = kit.create_workload(admin, ours)
    kit.kueue_reserve(admin, namespace=namespace, name=wl2["metadata"]["name"], check=check)
    assert _entry(admin, namespace, wl2, check, "Ready")["message"] == "A raised to 1"


def test_a_runtime_edited_after_start_is_refused_at_the_next_admission_naming_the_field(
        admin, namespace, start_controller):
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    wl = kit.create_workload(admin, tj)
    start_controller()
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    assert _entry(admin, namespace, wl, check, "Ready")["message"] == "A raised to 1"
    kit.kueue_evict(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)

    def edit(runtime):
        node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
        node["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
        return runtime, None

    admin.read_modify_write(paths.TRAINING_RUNTIME, name=kit.RUNTIME, namespace=namespace, compute=edit)
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    entry = _entry(admin, namespace, wl, check, "Rejected")
    assert "restartPolicy" in entry["message"] and "OnFailure" in entry["message"], entry["message"]
    # no raise for the refused admission
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).current == 1
