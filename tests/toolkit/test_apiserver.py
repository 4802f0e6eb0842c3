"""The rendered objects are accepted by a real kube-apiserver with the real
Trainer v2.3.0 CRDs (schema and CEL rules; Trainer's webhook is not running)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import uuid

import kubernetes.client
import pytest

from toolkit import render, request, runtime_check, yamlio

pytestmark = pytest.mark.cluster
REPO = pathlib.Path(__file__).parents[2]
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def _trainer_runtimes() -> list[pathlib.Path]:
    out = subprocess.run(["go", "mod", "download", "-json", "github.com/kubeflow/trainer/v2@v2.3.0"],
                         capture_output=True, text=True, check=True, cwd="/tmp", timeout=300)
    root = pathlib.Path(json.loads(out.stdout)["Dir"]) / "manifests" / "base" / "runtimes"
    return sorted(p for p in root.rglob("*.yaml") if p.name != "kustomization.yaml")


def test_rendered_runtimes_and_trainjob_are_accepted(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    suffix = uuid.uuid4().hex[:6]
    created: list[str] = []
    refused: list[str] = []
    try:
        for path in _trainer_runtimes():
            (doc,) = yamlio.load_documents(str(path))
            steps = runtime_check.trainer_step(doc)
            if steps:
                # Trainer's MPI runtimes give spec.trainer to their launcher, not to `node`: refused by
                # that field, by render and by the check alike.
                with pytest.raises(render.RenderError) as refusal:
                    render.runtime(doc, sidecar_image="sidecar:test")
                assert str(refusal.value) == "; ".join(str(r) for r in steps)
                assert all(str(r) in map(str, runtime_check.check(doc)) for r in steps)
                refused.append(doc["metadata"]["name"])
                continue
            body = render.runtime(doc, sidecar_image="sidecar:test")
            body["metadata"]["name"] = f"{doc['metadata']['name']}-{suffix}"
            got = custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", body)
            created.append(got["metadata"]["name"])
            # What the apiserver stored (after defaulting) still passes the check.
            assert runtime_check.check(got) == [], path
        assert f"torch-distributed-{suffix}" in created, (created, refused)
        req = request.from_dict({**yamlio.load_document(str(REPO / "examples" / "start-request.yaml")),
                                 "namespace": namespace,
                                 "runtimeRef": {"name": f"torch-distributed-{suffix}"}})
        tj = render.trainjob(req)
        got = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", tj)
        assert got["spec"]["trainer"]["command"] == tj["spec"]["trainer"]["command"]
        assert got["spec"]["trainer"]["env"] == tj["spec"]["trainer"]["env"]
        assert got["spec"]["suspend"] is True
    finally:
        for name in created:
            custom.delete_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)
