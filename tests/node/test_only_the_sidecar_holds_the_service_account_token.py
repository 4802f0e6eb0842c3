"""The ServiceAccount token is the sidecar's alone, on the real kubelet: the rendered runtime turns
the pod's automount off and mounts a projected token into the sidecar only. The trainer container
has no token at the ServiceAccount path (its code cannot act as the sidecar), the sidecar's checks
reach the apiserver with its own (a verdict is a check that did), and a projected token the runtime
mounts for its trainer (cloud credentials: its own audience, as IRSA's webhook mounts one) is still
there for the trainer, and names the pods' own ServiceAccount: render keeps the account a cloud
binding names (here the namespace's `default`), and the sidecar's rights come with sidecar-rbac.yaml.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import kubernetes.client
import pytest

from devcluster import local, stack as stack_mod
from tests.node import kit
from toolkit import names, render, runtime_check
from toolkit import request as request_mod

pytestmark = pytest.mark.cluster

CLOUD_DIR = "/var/run/secrets/cloud"
# The cloud token's claims only (its middle part): without its signature it is no credential to log.
PRINT = (f"[ -e {names.SERVICE_ACCOUNT_DIR}/token ] && echo sa-token=present || echo sa-token=absent; "
         f"[ -s {CLOUD_DIR}/token ] && echo cloud-token=present || echo cloud-token=absent; "
         f"echo cloud-claims=$(cut -d. -f2 {CLOUD_DIR}/token)")


@pytest.fixture(scope="module")
def api(node_cluster: stack_mod.Stack) -> Iterator[kubernetes.client.ApiClient]:
    with node_cluster.plane.api_client() as client:
        yield client


def test_the_trainer_has_no_service_account_token_and_keeps_its_own_projected_one(
        api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    namespace = kit.new_namespace(api)
    kit.sidecar_rbac(api, namespace)
    # A TrainJob for the sidecar to read (no Trainer runs here: it is only stored).
    trainjob = render.trainjob(request_mod.from_dict({
        "jobId": "node.token", "generation": 1, "submission": 1, "attempt": 1, "command": ["true"],
        "namespace": namespace, "runtimeRef": {"kind": "TrainingRuntime", "name": "stored-only"}}))
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.TRAINER_GROUP, names.TRAINER_VERSION, namespace, "trainjobs", trainjob)
    cloud = {"name": "cloud-token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "audience": "sts.example", "expirationSeconds": 3600}}]}}
    rendered = render.runtime({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime", "metadata": {"name": "r"},
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": names.TRAINER_REPLICATED_JOB, "template": {
            "metadata": {"labels": runtime_check.TRAINER_STEP_LABELS},
            "spec": {"template": {"spec": {"volumes": [cloud], "containers": [{
                "name": "node", "image": kit.BUSYBOX, "command": ["/bin/sh", "-c", PRINT],
                "volumeMounts": [{"name": "cloud-token", "mountPath": CLOUD_DIR, "readOnly": True}]}]}}}}}]}}},
    }, sidecar_image=local.SIDECAR_IMAGE)
    pod_spec = rendered["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "trainer", "labels": {names.JOBSET_NAME_LABEL: trainjob["metadata"]["name"],
                                                   names.JOBSET_UID_LABEL: "jobset-uid-1", names.RESTART_LABEL: "0"},
                     "annotations": {names.ADMISSION_ANNOTATION: "1"}},
        "spec": pod_spec,
    })

    def printed() -> list[str] | None:
        status = kit.container_status(kit.pod(core, namespace, "trainer"), "node")
        if "terminated" not in status.get("state", {}):
            return None
        return kit.log(core, namespace, "trainer", "node").split()
    held = kit.wait("the trainer to print what it holds", printed)
    assert held[:2] == ["sa-token=absent", "cloud-token=present"]
    payload = held[2].removeprefix("cloud-claims=")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["aud"] == ["sts.example"]
    assert claims["sub"] == f"system:serviceaccount:{namespace}:default"
    assert "serviceAccountName" not in pod_spec

    def verdict() -> bool:
        lines = kit.log(core, namespace, "trainer", names.SIDECAR_CONTAINER).splitlines()
        return any(json.loads(line).get("message") == "verdict" for line in lines if line.startswith("{"))
    kit.wait("a check of the sidecar's, with its own token", verdict)
