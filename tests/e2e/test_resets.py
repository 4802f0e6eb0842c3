"""Resets are detected, not prevented (docs/adapter.md), on the real controllers:
a JobSet deleted by hand is rebuilt by Trainer with restarts 0, and our
controller flags the TrainJob foreign with the exact cause; our runtime patch
rewritten lower does not lower the next raise (the floor holds); a pod that
runs below the floor is flagged too, by the controller's own pod check and
by the pod's real sidecar verifier (a native sidecar the kubelet runs with the
pod's Downward API files and its projected ServiceAccount token, under the
shipped sidecar Role), whose Event the controller confirms and turns into the
foreign flag. Plain mode, with our controller running.

Every pod is executed, the rebuilt JobSet's and the below-floor ones too:
they repeat the first execution's identity, which is what the flag is for.
The identity rule holds before the flag; the below-floor repeat ran with the
flag already raised; the rebuilt JobSet's repeat races its own detection, so
the test shows it repeats and that the flag follows.
"""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, names, paths, raising


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
    scenario.client.read_modify_write(paths.TRAINJOB, name=scenario.name, namespace=scenario.namespace,
                                      compute=compute)


def test_jobset_deleted_by_hand_is_flagged_foreign_and_the_floor_holds(scenario: Scenario) -> None:
    scenario.create_runtime(flow.runtime("resets"))
    scenario.start("resets", env={"STAY": "1"})  # each execution runs until it is stopped
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)
    for pod in scenario.new_pods():
        scenario.run(pod)
    old_uid = scenario.wait("the JobSet UID to be recorded", lambda: (
        scenario.trainjob()["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION))
    assert old_uid == (scenario.jobset() or {})["metadata"]["uid"]
    before = list(scenario.executions)
    assert not any(scenario.flag_at_run)
    scenario.check_identities()  # everything before the flag

    kubernetes.client.CustomObjectsApi(scenario.api).delete_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", scenario.namespace, "jobsets", scenario.name,
        body={"propagationPolicy": "Background"})
    new = scenario.wait("Trainer to build a new JobSet", lambda: (
        (js := scenario.jobset()) and js["metadata"]["uid"] != old_uid and js))
    assert adapter.restarts_of(new) == 0
    # The kubelet runs the rebuilt JobSet's pods whether or not the controller
    # has flagged the TrainJob yet: nothing prevents a reset, it is detected.
    rebuilt = [scenario.run(pod) for pod in scenario.new_pods()]
    cause = f"JobSet UID {new['metadata']['uid']} is not the recorded {old_uid}: J may have been reset"
    scenario.wait("the foreign flag", lambda: cause in (scenario.foreign() or "").split("\n"))
    status = adapter.status(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert status.foreign and cause in (status.foreign_cause or "")
    # The reset the flag exists for: with J back at 0 and A unchanged, the
    # rebuilt JobSet's execution repeats the first one's identity exactly.
    assert [(e.epoch, e.attempt) for e in rebuilt] == [(e.epoch, e.attempt) for e in before]

    # Our patch rewritten lower while held: the next raise still goes above the floor.
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the pods to go", lambda: not scenario.pods())
    _rewrite_patch(scenario, 0)
    raised = adapter.release(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert raised.admission == 2  # max(patch 0, floor 1) + 1
    for pod in scenario.new_pods():
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "2"
        scenario.run(pod)

    # A pod below the floor (patch lowered, unsuspended without a raise) is reported.
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the pods to go", lambda: not scenario.pods())
    _rewrite_patch(scenario, 1)

    def unsuspend(trainjob: dict) -> tuple[dict, None]:
        trainjob["spec"]["suspend"] = False
        return trainjob, None
    scenario.client.read_modify_write(paths.TRAINJOB, name=scenario.name, namespace=scenario.namespace,
                                      compute=unsuspend)
    below = scenario.new_pods()
    assert all(p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1" for p in below)
    # Run too: R = 1 + 0 repeats the first execution again, and this time the
    # flag (from the JobSet reset) was raised before it ran.
    for pod in below:
        result = scenario.run(pod)
        assert (result.epoch, result.attempt) == (before[0].epoch, before[0].attempt)
        assert cause in (scenario.flag_at_run[-1] or "").split("\n")
    for pod in below:
        text = f"pod {pod['metadata']['name']} has admission 1, below the floor 2: A may have been lowered"
        scenario.wait("the below-floor report", lambda text=text: text in (scenario.foreign() or ""))
    # Before the flag, strictly increasing and distinct; every repeat after it
    # ran flagged, except the rebuilt JobSet's, whose flag is asserted above.
    scenario.check_identities(resets=rebuilt)

    # The real sidecar of each below-floor pod checked it before its trainer started (the
    # startupProbe waits for that first check) and reported it; the controller turns its Event
    # into the flag (the cause carries the sidecar's own wording).
    pod = below[0]
    seen = scenario.sidecar_verdicts(pod)[0]
    # Below the floor, and (the JobSet was recreated above) not the recorded JobSet.
    assert (seen["verdict"], set(seen["rules"])) == ("violation", {"below-floor", "jobset-uid"}), seen
    assert seen["check"] == 1
    mark = f"[seen by the sidecar of pod={pod['metadata']['name']}"
    scenario.wait("the sidecar's report to become the flag", lambda: mark in (scenario.foreign() or ""))
