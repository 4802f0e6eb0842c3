"""The controller manager really runs its default controllers: Job, garbage collector, TTL,
Deployment and ReplicaSet, EndpointSlice.

There are no kubelets, so pods stay Pending; a test that needs a finished pod
writes its phase through the status subresource, as a kubelet would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes.client
import pytest

from devcluster import harness
from tests import waiting

pytestmark = pytest.mark.cluster

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float = 60.0) -> T:
    return waiting.until(what, probe, timeout=timeout, interval=0.2)


def job(name: str, *, parallelism: int, ttl: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "completions": parallelism,
        "backoffLimit": 0,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "unused"}]}},
    }
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    return {"metadata": {"name": name}, "spec": spec}


def pods_of(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={name}").items)




def test_job_controller_creates_pods_and_garbage_collector_deletes_them(
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    batch = kubernetes.client.BatchV1Api(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    created = batch.create_namespaced_job(namespace, job("two", parallelism=2))

    def two_pods() -> list[Any] | None:
        pods = pods_of(core, namespace, "two")
        return pods if len(pods) == 2 else None

    pods = wait_for("two pods", two_pods)
    for pod in pods:
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.uid, owner.controller) == ("Job", created.metadata.uid, True)
        assert pod.status.phase == "Pending"

    batch.delete_namespaced_job("two", namespace, propagation_policy="Background")
    wait_for("the Job's pods deleted by the garbage collector", lambda: not pods_of(core, namespace, "two"))


def test_finished_job_with_ttl_is_deleted(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    batch = kubernetes.client.BatchV1Api(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    batch.create_namespaced_job(namespace, job("once", parallelism=1, ttl=0))
    [pod] = wait_for("one pod", lambda: pods_of(core, namespace, "once"))

    # What a kubelet would report for a container that exited 0.
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {"phase": "Succeeded"}})

    def completed() -> bool:
        try:
            conditions = batch.read_namespaced_job_status("once", namespace).status.conditions or []
        except kubernetes.client.ApiException as e:
            if e.status == 404:  # the TTL controller was quicker than this poll
                return True
            raise
        return any(c.type == "Complete" and c.status == "True" for c in conditions)

    wait_for("the Job to complete", completed)
    wait_for("the finished Job deleted by the TTL controller",
             lambda: harness.gone(lambda: batch.read_namespaced_job("once", namespace)))
    wait_for("its pod deleted with it", lambda: not pods_of(core, namespace, "once"))


def test_deployment_and_service_controllers_run_as_on_any_cluster(
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The controller manager runs its default set: a Deployment gets a ReplicaSet and that its pods
    (Pending here: no node), a Service its EndpointSlice."""
    apps = kubernetes.client.AppsV1Api(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    discovery = kubernetes.client.DiscoveryV1Api(api_client)
    labels = {"app": "web"}
    created = apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "unused"}]}}}})
    core.create_namespaced_service(namespace, {"metadata": {"name": "web"},
                                               "spec": {"selector": labels, "ports": [{"port": 80}]}})
    [replica_set] = wait_for("the ReplicaSet", lambda: apps.list_namespaced_replica_set(namespace).items)
    assert replica_set.metadata.owner_references[0].uid == created.metadata.uid
    pods = wait_for("two pods", lambda: p if len(p := core.list_namespaced_pod(namespace).items) == 2 else None)
    assert {p.metadata.owner_references[0].uid for p in pods} == {replica_set.metadata.uid}
    wait_for("the Service's EndpointSlice", lambda: discovery.list_namespaced_endpoint_slice(
        namespace, label_selector="kubernetes.io/service-name=web").items)
