"""The sidecar authenticates with the projected ServiceAccount token the kubelet keeps rewriting,
read from its file before every check (sidecar/settings.py), on the real kubelet.

What the kubelet does: it requests a token per projected volume, caches it in memory, and
rewrites the file with a new one once 80% of `expirationSeconds` has passed (or the token is 24 h
old). The apiserver refuses an `expirationSeconds` under 600 (shown below), so a natural rotation
comes at the earliest about 470 s after the pod starts (480 s less the kubelet's jitter of up to
10 s), and proving the sidecar then uses the new token would take waiting out the old one's 600 s:
over ten minutes of a shared host's only node slot, for one test.

What is proven instead, in well under a minute, with the same code paths: the kubelet's token
cache is its memory, so a restarted kubelet (which keeps the pods running) requests a fresh token
on its next sync of the pod and rewrites the projected file, as it does on rotation. To tell the
tokens apart, the old one is made invalid first: the sidecar's ServiceAccount is deleted and made
again under the same name, and the apiserver refuses every token that names the old UID. So:
  checks succeed with token 1 -> the account is remade: the sidecar's requests get 401 (it sends
  token 1, nothing else) -> the kubelet restarts and rewrites the file (token 2, new UID, seen on
  the host) -> the sidecar's next check succeeds, in the same process (its container never
  restarted): it read the file again.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
import yaml

from devcluster import harness, local, stack as stack_mod
from tests.node import kit
from toolkit import names, render
from toolkit import request as request_mod

pytestmark = pytest.mark.cluster

TOKEN_SECONDS = 600  # the apiserver's minimum expirationSeconds
API_DIR = names.SERVICE_ACCOUNT_DIR  # where the rendered sidecar mounts its token volume
VOLUME = names.SIDECAR_TOKEN_VOLUME  # the rendered sidecar's volume, here with the shortest lifetime


@pytest.fixture(scope="module")
def api(node_cluster: stack_mod.Stack) -> Iterator[kubernetes.client.ApiClient]:
    with node_cluster.plane.api_client() as client:
        yield client


def token_volume(seconds: int) -> dict[str, Any]:
    return {"name": VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": seconds}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]}}


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def sidecar_lines(core: kubernetes.client.CoreV1Api, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The sidecar's JSON log lines, waited for while the log cannot be read (the container not yet
    started, the kubelet restarting)."""
    def readable() -> str | None:
        try:
            return kit.log(core, namespace, pod, names.SIDECAR_CONTAINER) or None
        except kubernetes.client.ApiException:
            return None
    text = kit.wait(f"the log of {pod}'s sidecar", readable, timeout=60)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_apiserver_refuses_a_token_shorter_than_ten_minutes(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    namespace = kit.new_namespace(api)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod(namespace, {"metadata": {"name": "short"}, "spec": {
            "containers": [{"name": "main", "image": kit.BUSYBOX, "command": ["true"]}],
            "volumes": [token_volume(TOKEN_SECONDS - 1)]}})
    assert refused.value.status == 422
    assert "may not specify a duration less than 10 minutes" in refused.value.body


def test_after_the_kubelet_rewrites_the_token_the_next_check_uses_the_new_one(
        node_cluster: stack_mod.Stack, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    node = node_cluster.node
    assert node is not None
    namespace = kit.new_namespace(api)
    kit.sidecar_rbac(api, namespace)
    # A TrainJob for the sidecar to read (no Trainer runs here: it is only stored).
    trainjob = render.trainjob(request_mod.from_dict({
        "jobId": "node.token", "generation": 1, "submission": 1, "attempt": 1, "command": ["true"],
        "namespace": namespace, "runtimeRef": {"kind": "TrainingRuntime", "name": "stored-only"}}))
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.TRAINER_GROUP, names.TRAINER_VERSION, namespace, "trainjobs", trainjob)
    sidecar = render.sidecar_container(image=local.SIDECAR_IMAGE, env=[
        {"name": "DISPATCH_SIDECAR_API_SERVER", "value": f"https://{harness.SERVICE_IP}:443"},
        {"name": "DISPATCH_SIDECAR_TOKEN_FILE", "value": f"{API_DIR}/token"},
        {"name": "DISPATCH_SIDECAR_CA_FILE", "value": f"{API_DIR}/ca.crt"},
        {"name": "DISPATCH_SIDECAR_INTERVAL_SECONDS", "value": "1"},
        {"name": "DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS", "value": "0.5"},
        {"name": "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS", "value": "1"},
    ])
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "verified", "labels": {names.JOBSET_NAME_LABEL: trainjob["metadata"]["name"],
                                                    names.JOBSET_UID_LABEL: "jobset-uid-1", names.RESTART_LABEL: "0"},
                     "annotations": {names.ADMISSION_ANNOTATION: "1"}},
        "spec": {
            "serviceAccountName": names.SIDECAR_SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,  # the projected token below is the only one
            "initContainers": [sidecar],
            "containers": [{"name": "main", "image": kit.BUSYBOX, "command": ["sleep", "600"]}],
            "volumes": [render.podinfo_volume(), render.sidecar_state_volume(), token_volume(TOKEN_SECONDS)],
        },
    })

    def verdicts_after(n: int) -> list[dict[str, Any]]:
        lines = sidecar_lines(core, namespace, "verified")[n:]
        return [line for line in lines if line.get("message") == "verdict"]
    kit.wait("the sidecar's first check", lambda: verdicts_after(0))
    pod = kit.pod(core, namespace, "verified")
    token_file = (node.kubelet_root / "pods" / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~projected"
                  / VOLUME / "token")
    first = token_file.read_text()
    account = core.read_namespaced_service_account(names.SIDECAR_SERVICE_ACCOUNT, namespace)
    first_claims = claims(first)
    assert first_claims["exp"] - first_claims["iat"] == TOKEN_SECONDS
    assert first_claims["kubernetes.io"]["serviceaccount"]["uid"] == account.metadata.uid

    # The same account name with a new UID: the apiserver no longer takes token 1.
    core.delete_namespaced_service_account(names.SIDECAR_SERVICE_ACCOUNT, namespace)
    kit.wait("the old account to go", lambda: harness.gone(
        lambda: core.read_namespaced_service_account(names.SIDECAR_SERVICE_ACCOUNT, namespace)))
    remade = core.create_namespaced_service_account(
        namespace, yaml.safe_load((kit.SIDECAR_RBAC / "serviceaccount.yaml").read_text()))
    assert remade.metadata.uid != account.metadata.uid
    seen = len(sidecar_lines(core, namespace, "verified"))

    def first_refusal() -> int | None:
        lines = sidecar_lines(core, namespace, "verified")
        return next((i for i in range(seen, len(lines))
                     if lines[i].get("message") == "request" and lines[i].get("status") == 401), None)
    since = kit.wait("the sidecar's requests to be refused with token 1", first_refusal)
    time.sleep(3)  # a few more checks, each refused: nothing but token 1 is there to send
    refused = len(sidecar_lines(core, namespace, "verified"))
    window = sidecar_lines(core, namespace, "verified")[since:refused]
    assert not [line for line in window if line.get("message") == "verdict"], window
    assert len([line for line in window if line.get("status") == 401]) >= 2, window
    assert token_file.read_text() == first  # the kubelet has not rotated it by itself

    node.restart("kubelet")
    second = kit.wait("the kubelet to rewrite the projected token",
                      lambda: (text := token_file.read_text()) != first and text, timeout=120)
    assert claims(second)["kubernetes.io"]["serviceaccount"]["uid"] == remade.metadata.uid
    # A check succeeds again: with a token the apiserver takes, which only the rewritten file holds.
    kit.wait("a successful check after the rewrite", lambda: verdicts_after(refused), timeout=60)
    status = kit.container_status(kit.pod(core, namespace, "verified"), names.SIDECAR_CONTAINER)
    assert status.get("restartCount", 0) == 0, status  # the same sidecar process throughout
