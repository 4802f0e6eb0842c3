"""End to end in Kueue mode: the real Kueue manager (TrainJob integration on)
admits TrainJobs through a ClusterQueue that requires our AdmissionCheck, and
our controller (`toolkit controller`) raises A before it approves each
admission. A higher-priority TrainJob preempts a running one; Kueue resets
the check to Pending on eviction, so the re-admission raises A again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from tests.e2e import flow, stack as stack_mod
from tests.e2e.flow import Scenario
from toolkit import names
from toolkit.controller import admission

E2E_KUEUE = True  # read by the stack fixture
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def _create(custom: kubernetes.client.CustomObjectsApi, plural: str, body: dict[str, Any],
            namespace: str | None = None) -> None:
    body = {"apiVersion": "/".join(KUEUE), **body}
    if namespace:
        custom.create_namespaced_custom_object(*KUEUE, namespace, plural, body)
    else:
        custom.create_cluster_custom_object(*KUEUE, plural, body)


@pytest.fixture
def queues(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[str]:
    """ResourceFlavor, our AdmissionCheck, a ClusterQueue of 1.5 CPU, room for one TrainJob of 1 CPU (the
    sidecar's requests are CPU and memory, so both are covered) that
    requires it and preempts lower priorities, a LocalQueue; two priorities."""
    suffix = e2e_namespace
    with stack.plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        _create(custom, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": f"rf-{suffix}"}})
        _create(custom, "admissionchecks", {"kind": "AdmissionCheck", "metadata": {"name": f"ac-{suffix}"},
                                            "spec": {"controllerName": admission.CONTROLLER_NAME}})
        _create(custom, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": f"cq-{suffix}"}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                {"name": f"rf-{suffix}", "resources": [{"name": "cpu", "nominalQuota": "1500m"},
                                                       {"name": "memory", "nominalQuota": "64Gi"}]}]}],
            "admissionChecksStrategy": {"admissionChecks": [{"name": f"ac-{suffix}"}]},
            "preemption": {"withinClusterQueue": "LowerPriority"},
        }})
        for name, value in (("low", 10), ("high", 1000)):
            _create(custom, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass",
                                                        "metadata": {"name": f"{name}-{suffix}"}, "value": value})
        _create(custom, "localqueues", {"kind": "LocalQueue", "metadata": {"name": "lq"},
                                        "spec": {"clusterQueue": f"cq-{suffix}"}}, namespace=e2e_namespace)
        yield suffix


def test_kueue_admission_preemption_and_readmission_raise_admission(
        stack: stack_mod.Stack, e2e_namespace: str, queues: str) -> None:
    with stack.plane.api_client() as api, stack.plane.api_client() as api2:
        low = Scenario(stack, api, e2e_namespace)
        high = Scenario(stack, api2, e2e_namespace, service_account=False)
        low.create_runtime(flow.runtime("kueue", cpu="1"))
        low.start("kueue", queue="lq", job_id="e2e.low",
                  labels={"kueue.x-k8s.io/priority-class": f"low-{queues}"})

        # Kueue reserves quota, our controller raises A and sets the check
        # Ready, Kueue admits and unsuspends: the pods run with A >= 1.
        # (Seen here: the controller may raise more than once for one
        # admission; A only grows, so identities stay distinct.)
        first_a = 0
        for pod in low.new_running_pods():
            first_a = int(pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION])
            assert first_a >= 1
            low.run(pod)  # left running

        # A higher priority preempts it; it runs with its own A = 1.
        high.start("kueue", queue="lq", job_id="e2e.high",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{queues}"})
        low.wait("the low TrainJob to be suspended by the eviction", lambda: low.trainjob()["spec"].get("suspend"))
        for pod in high.new_running_pods():
            assert int(pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION]) >= 1
            result = high.run(pod)
            high.end(pod, result.exit_code)  # finishes: frees the quota

        # Re-admitted: the check went back to Pending, so A was raised again.
        for pod in low.new_running_pods():
            assert int(pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION]) > first_a
            result = low.run(pod)
            low.end(pod, result.exit_code)
        low.check_identities()
        high.check_identities()
