"""A pod whose admission annotation is absent (removed, or never raised through dispatch): the
real kubelet resolves the Downward API reference to an absent annotation to "", and the prologue
refuses that A: exit 125, one `dispatch: ...` line on stderr, nothing run, pod Failed.

The pod carries the prologue and the very env `wrap.env` renders into every TrainJob; a second
container with the same env prints what the kubelet resolved, so the "" is the kubelet's, seen
from inside a container. The same pod with the annotation runs its command: the refusal is the
annotation's absence, not the pod's shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from devcluster import stack as stack_mod
from tests.node import kit
from toolkit import names, wrap

pytestmark = pytest.mark.cluster

EPOCH_PREFIX, TOKEN_PREFIX = "3000007", "node.job.7.1"  # G = 3, N = 7; JobID node.job, attempt 1


@pytest.fixture(scope="module")
def core(node_cluster: stack_mod.Stack) -> Iterator[kubernetes.client.CoreV1Api]:
    with node_cluster.plane.api_client() as api:
        yield kubernetes.client.CoreV1Api(api)


def prologue_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    env = wrap.env(job={}, epoch_prefix=EPOCH_PREFIX, token_prefix=TOKEN_PREFIX)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {names.RESTART_LABEL: "0"}, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "node", "image": kit.BUSYBOX, "imagePullPolicy": "Never", "env": env,
                 "command": wrap.command(), "args": ["/bin/sh", "-c", "echo the command ran"]},
                {"name": "resolved", "image": kit.BUSYBOX, "imagePullPolicy": "Never", "env": env,
                 "command": ["/bin/sh", "-c", 'echo "A=[$DISPATCH_K8S_ADMISSION] J=[$DISPATCH_K8S_RESTART]"']},
            ],
        },
    }


def test_kubelet_gives_an_absent_annotation_as_empty_and_the_prologue_exits_125(
        node_cluster: stack_mod.Stack, core: kubernetes.client.CoreV1Api) -> None:
    namespace = kit.new_namespace(core.api_client)
    core.create_namespaced_pod(namespace, prologue_pod("no-admission", annotations={}))
    done = kit.finished(core, namespace, "no-admission")
    assert done["status"]["phase"] == "Failed"
    terminated = kit.container_status(done, "node")["state"]["terminated"]
    assert terminated["exitCode"] == 125, terminated
    assert kit.log(core, namespace, "no-admission", "resolved") == "A=[] J=[0]\n"
    refusal = kit.log(core, namespace, "no-admission", "node")
    assert refusal.count("\n") == 1 and refusal.startswith("dispatch: "), refusal
    assert "DISPATCH_K8S_ADMISSION" in refusal, refusal
    assert node_cluster.node is not None
    streams = kit.cri_log(node_cluster.node, namespace=namespace, pod_name="no-admission", container="node")
    assert streams == [("stderr", refusal.rstrip("\n"))]


def test_the_same_pod_with_its_annotation_runs_the_command_with_its_epoch(
        node_cluster: stack_mod.Stack, core: kubernetes.client.CoreV1Api) -> None:
    namespace = kit.new_namespace(core.api_client)
    core.create_namespaced_pod(namespace, prologue_pod("admitted", annotations={names.ADMISSION_ANNOTATION: "4"}))
    done = kit.finished(core, namespace, "admitted")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert kit.log(core, namespace, "admitted", "resolved") == "A=[4] J=[0]\n"
    assert kit.log(core, namespace, "admitted", "node") == "the command ran\n"
