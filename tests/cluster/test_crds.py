"""The Trainer, JobSet and Kueue CRDs are the real ones: their schemas and CEL rules apply."""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import uuid
from typing import Any

import kubernetes.client
import pytest

from devcluster import harness
from toolkit import render, request

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "start-request.yaml"

pytestmark = pytest.mark.cluster

TRAINER = ("trainer.kubeflow.org", "v1alpha1")


def contains(got: Any, sent: Any) -> bool:
    """Every field sent is in what came back, equal (the server may add defaults)."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(k in got and contains(got[k], v) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(got, list) and len(got) == len(sent) and all(map(contains, got, sent))
    return bool(got == sent)


def minimal_trainjob(name: str) -> dict[str, Any]:
    # Hand-built and minimal, independent of the renderer: what the schema needs.
    return {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "suspend": True,
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "command": ["/bin/sh", "-c", "exec \"$@\"", "dispatch-prologue"],
                "args": ["python", "train.py"],
                "env": [{"name": "DISPATCH_K8S_ADMISSION",
                         "valueFrom": {"fieldRef": {
                             "fieldPath": "metadata.annotations['dispatch.phpboyscout.uk/admission']"}}}],
            },
        },
    }


def test_every_crd_from_the_modules_is_established(api_client: kubernetes.client.ApiClient) -> None:
    ext = kubernetes.client.ApiextensionsV1Api(api_client)
    wanted = {doc["metadata"]["name"] for doc in harness.crd_documents()}
    assert {"trainjobs.trainer.kubeflow.org", "clustertrainingruntimes.trainer.kubeflow.org",
            "jobsets.jobset.x-k8s.io", "workloads.kueue.x-k8s.io", "admissionchecks.kueue.x-k8s.io",
            "clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io"} <= wanted
    established = {
        crd.metadata.name for crd in ext.list_custom_resource_definition().items
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])
    }
    assert wanted <= established


def rendered_trainjob(namespace: str) -> dict[str, Any]:
    """`toolkit render trainjob` of the shipped example request, in the test's namespace."""
    req = dataclasses.replace(request.load(str(EXAMPLE)), namespace=namespace, name="tj")
    return render.trainjob(req)


def test_minimal_trainjob_is_accepted(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    created = custom.create_namespaced_custom_object(*TRAINER, namespace, "trainjobs", minimal_trainjob("tj"))
    assert created["spec"]["trainer"]["args"] == ["python", "train.py"]


def test_rendered_trainjob_is_accepted_and_its_trainer_is_immutable(
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    body = rendered_trainjob(namespace)
    created = custom.create_namespaced_custom_object(*TRAINER, namespace, "trainjobs", body)
    assert contains(created["spec"]["trainer"], body["spec"]["trainer"])  # nothing pruned by the schema

    changed = copy.deepcopy(created)
    changed["spec"]["trainer"]["args"] = ["python", "other.py"]
    with pytest.raises(kubernetes.client.ApiException) as caught:
        custom.replace_namespaced_custom_object(*TRAINER, namespace, "trainjobs", "tj", changed)
    assert caught.value.status == 422
    assert "spec.trainer" in caught.value.body and "field is immutable" in caught.value.body

    # The same document with only a mutable field changed is fine: the refusal was the rule, not the write.
    allowed = copy.deepcopy(created)
    allowed["metadata"].setdefault("annotations", {})["dispatch.phpboyscout.uk/admission"] = "1"
    custom.replace_namespaced_custom_object(*TRAINER, namespace, "trainjobs", "tj", allowed)


def test_trainjob_schema_refuses_a_missing_runtime_ref(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    body = minimal_trainjob("no-runtime")
    del body["spec"]["runtimeRef"]
    with pytest.raises(kubernetes.client.ApiException) as caught:
        kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            *TRAINER, namespace, "trainjobs", body)
    assert caught.value.status == 422
    assert "runtimeRef" in caught.value.body


@pytest.mark.parametrize("rendered", [False, True], ids=["as shipped", "toolkit render runtime"])
def test_cluster_training_runtime_from_trainers_manifests_is_accepted(
        api_client: kubernetes.client.ApiClient, rendered: bool) -> None:
    [runtime] = harness.trainer_manifest("manifests/base/runtimes/torch_distributed.yaml")
    assert runtime["kind"] == "ClusterTrainingRuntime"
    if rendered:
        runtime = render.runtime(runtime, sidecar_image="sidecar:test")
    # Cluster-scoped: a unique name keeps this test independent of the others and of order.
    runtime["metadata"]["name"] = f"torch-distributed-{uuid.uuid4().hex[:8]}"
    custom = kubernetes.client.CustomObjectsApi(api_client)
    created = custom.create_cluster_custom_object(*TRAINER, "clustertrainingruntimes", runtime)
    try:
        [node] = created["spec"]["template"]["spec"]["replicatedJobs"]
        assert node["name"] == "node"
        assert contains(created["spec"], runtime["spec"])  # nothing pruned (defaults may be added)
    finally:
        custom.delete_cluster_custom_object(*TRAINER, "clustertrainingruntimes", runtime["metadata"]["name"])
