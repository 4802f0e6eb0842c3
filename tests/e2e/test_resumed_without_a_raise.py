"""An execution that starts after a suspension with no raise since is flagged, on the real
controllers and the real node: Trainer resumes the same JobSet, so its pods carry the same A, the
same J and the same JobSet UID as the execution before the suspension, and its epoch repeats.
Nothing in the pods tells the two apart; the apiserver's own record does: the field manager that
last set spec.suspend and the time it did (metadata.managedFields), against the pods' creation
times. Only a raise unsuspends in plain mode; in Kueue mode Kueue does, once our check is Ready.

- plain mode: held, then resumed by hand (a merge patch of spec.suspend, as
  `kubectl patch --type merge` sends);
- Kueue mode: our check taken off the ClusterQueue, the Workload deactivated and activated again:
  Kueue admits it without asking us.

Each repeat runs (detection, not prevention) and the flag names the cause.
"""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, names

E2E_KUEUE = True  # our controller runs (with Kueue) in this module's stack

RESUMED = "started after spec.suspend was set false by "


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[Scenario]:
    with stack.plane.api_client() as api:
        yield Scenario(stack, api, e2e_namespace)


def _causes(scenario: Scenario) -> list[str]:
    return [line for line in (scenario.foreign() or "").split("\n") if line]


def _flagged_resumed(scenario: Scenario, pods: list[dict]) -> list[str]:
    """The resume causes naming one of PODS, once there is one for each."""
    lines = [c for c in _causes(scenario) if RESUMED in c]
    named = {p["metadata"]["name"] for p in pods if any(c.startswith(f"pod {p['metadata']['name']} ") for c in lines)}
    return lines if len(named) == len(pods) else []


def test_a_trainjob_resumed_by_hand_after_a_hold_is_flagged(scenario: Scenario) -> None:
    scenario.create_runtime(flow.runtime("resumed"))
    scenario.start("resumed", env={"STAY": "1"})
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)
    first = [scenario.run(pod) for pod in scenario.new_pods()]
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the held execution's pods to go", lambda: not scenario.pods())
    assert _causes(scenario) == []

    scenario.custom.patch_namespaced_custom_object(
        names.TRAINER_GROUP, names.TRAINER_VERSION, scenario.namespace, "trainjobs", scenario.name,
        {"spec": {"suspend": False}})
    pods = scenario.new_pods()
    again = [scenario.run(pod) for pod in pods]
    # What the flag is for: the same A, J and JobSet, so the same identity.
    assert [(e.epoch, e.attempt) for e in again] == [(e.epoch, e.attempt) for e in first]
    lines = scenario.wait("the resume flagged", lambda: _flagged_resumed(scenario, pods))
    assert all("not by a raise (the last raise at " in line for line in lines), lines
    assert scenario.trainjob()["spec"]["suspend"] is False  # nothing stopped


def test_a_kueue_admission_without_our_check_is_flagged(scenario: Scenario, queues: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(scenario.api)
    scenario.create_runtime(flow.runtime("unchecked", cpu="1"))
    scenario.start("unchecked", queue="lq", env={"STAY": "1"})
    first = [scenario.run(pod) for pod in scenario.new_pods()]
    assert _causes(scenario) == []

    # Our check taken off the ClusterQueue; the Workload deactivated (evicted: the pods go) and
    # activated again: Kueue admits it with nothing raised.
    custom.patch_cluster_custom_object(*flow.KUEUE_API, "clusterqueues", f"cq-{queues}",
                                       {"spec": {"admissionChecksStrategy": None}})
    workload = scenario.workload()["metadata"]["name"]
    custom.patch_namespaced_custom_object(*flow.KUEUE_API, scenario.namespace, "workloads", workload,
                                          {"spec": {"active": False}})
    scenario.wait("the evicted execution's pods to go", lambda: not scenario.pods())
    custom.patch_namespaced_custom_object(*flow.KUEUE_API, scenario.namespace, "workloads", workload,
                                          {"spec": {"active": True}})
    pods = scenario.new_pods()
    again = [scenario.run(pod) for pod in pods]
    assert [(e.epoch, e.attempt) for e in again] == [(e.epoch, e.attempt) for e in first]
    scenario.wait("the admission without our check flagged", lambda: _flagged_resumed(scenario, pods))
