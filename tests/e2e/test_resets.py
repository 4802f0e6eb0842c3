"""Resets are detected, not prevented (DESIGN.md §7), on the real controllers:
a JobSet deleted by hand is rebuilt by Trainer with restarts 0, and our
controller flags the TrainJob foreign with the exact cause; our runtime patch
rewritten lower does not lower the next raise (the floor holds); a pod that
runs below the floor is flagged too. Plain mode, with our controller running.
"""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.e2e import flow, stack as stack_mod
from tests.e2e.flow import Scenario
from toolkit import adapter, kube, names, raising

E2E_KUEUE = True  # read by the stack fixture: Kueue and our controller run too


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[Scenario]:
    with stack.plane.api_client() as api:
        yield Scenario(stack, api, e2e_namespace)


def _rewrite_patch(scenario: Scenario, admission: int) -> None:
    """What an outsider could do while the TrainJob is suspended: set our patch's A by hand."""
    def compute(trainjob: dict) -> tuple[dict, None]:
        patches = [p for p in trainjob["spec"].get("runtimePatches") or [] if p.get("manager") != names.PATCH_MANAGER]
        trainjob["spec"]["runtimePatches"] = [*patches, raising.patch_entry(admission)]
        return trainjob, None
    scenario.client.read_modify_write(kube.TRAINJOB, name=scenario.name, namespace=scenario.namespace,
                                      compute=compute)


def test_jobset_deleted_by_hand_is_flagged_foreign_and_the_floor_holds(scenario: Scenario) -> None:
    scenario.create_runtime(flow.runtime("resets"))
    scenario.start("resets")
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)
    for pod in scenario.new_running_pods():
        scenario.run(pod)
    old_uid = scenario.wait("the JobSet UID to be recorded", lambda: (
        scenario.trainjob()["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION))
    assert old_uid == (scenario.jobset() or {})["metadata"]["uid"]
    scenario.check_identities()  # everything before the flag

    kubernetes.client.CustomObjectsApi(scenario.api).delete_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", scenario.namespace, "jobsets", scenario.name,
        body={"propagationPolicy": "Background"})
    new = scenario.wait("Trainer to build a new JobSet", lambda: (
        (js := scenario.jobset()) and js["metadata"]["uid"] != old_uid and js))
    assert int((new.get("status") or {}).get("restarts") or 0) == 0
    cause = f"JobSet UID {new['metadata']['uid']} is not the recorded {old_uid}: J may have been reset"
    scenario.wait("the foreign flag", lambda: cause in (
        (scenario.trainjob()["metadata"].get("annotations") or {}).get(names.FOREIGN_ANNOTATION) or "").split("\n"))
    status = adapter.status(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert status.foreign and cause in (status.foreign_cause or "")

    # Our patch rewritten lower while held: the next raise still goes above the floor.
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the pods to go", lambda: not scenario.pods())
    _rewrite_patch(scenario, 0)
    raised = adapter.release(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert raised.admission == 2  # max(patch 0, floor 1) + 1
    for pod in scenario.new_running_pods():
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "2"
        scenario.run(pod)

    # A pod below the floor (patch lowered, unsuspended without a raise) is reported.
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the pods to go", lambda: not scenario.pods())
    _rewrite_patch(scenario, 1)

    def unsuspend(trainjob: dict) -> tuple[dict, None]:
        trainjob["spec"]["suspend"] = False
        return trainjob, None
    scenario.client.read_modify_write(kube.TRAINJOB, name=scenario.name, namespace=scenario.namespace,
                                      compute=unsuspend)
    below = scenario.new_running_pods()
    assert all(p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1" for p in below)
    for pod in below:
        text = f"pod {pod['metadata']['name']} has admission 1, below the floor 2: A may have been lowered"
        scenario.wait("the below-floor report", lambda text=text: text in (
            (scenario.trainjob()["metadata"].get("annotations") or {}).get(names.FOREIGN_ANNOTATION) or ""))
