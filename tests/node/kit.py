"""What the real-node tests share: waiting on what the kubelet does, a namespace of their own,
the sidecar's shipped RBAC, container logs, and a running container's process as the host sees it.

Everything here reads what real components wrote (the kubelet's pod status and container logs,
containerd's task list, the kernel's /proc); nothing writes a status a component would."""

from __future__ import annotations

import os
import pathlib
import subprocess
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.utils
import yaml

from devcluster import harness, node as node_mod, scenario
from tests import waiting

T = TypeVar("T")
REPO = pathlib.Path(__file__).resolve().parents[2]
SIDECAR_RBAC = scenario.SIDECAR_RBAC
BUSYBOX = "localhost/dispatch-base/busybox:1.35-static"  # no USER: runs as root
NON_ROOT_IMAGE = "localhost/dispatch/sample-trainer:busybox"  # USER 65532:65532
WAIT_SECONDS = 90.0


def wait(what: str, predicate: Callable[[], T | None], *, timeout: float = WAIT_SECONDS,
         interval: float = 0.3) -> T:
    """The first truthy value of PREDICATE, polled until TIMEOUT."""
    return waiting.until(what, predicate, timeout=timeout, interval=interval)

TEST_LABEL = "dispatch.phpboyscout.uk/test"


def new_namespace(api: kubernetes.client.ApiClient, *, prefix: str = "node") -> str:
    """A namespace of the test's own, labelled TEST_LABEL: deleted after its module (tests/node/conftest.py)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    harness.create_namespace(api, name, labels={TEST_LABEL: "true"})
    return name


def sidecar_rbac(api: kubernetes.client.ApiClient, namespace: str) -> None:
    """The sidecar's ServiceAccount, Role and RoleBinding as deployments/k8s/base/sidecar ships them."""
    for path in sorted(SIDECAR_RBAC.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            kubernetes.utils.create_from_dict(api, yaml.safe_load(path.read_text()), namespace=namespace)


def pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    return dict(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace)))


def container_status(pod_obj: dict[str, Any], name: str) -> dict[str, Any]:
    return scenario.container_status(pod_obj, name) or {}


def finished(core: kubernetes.client.CoreV1Api, namespace: str, name: str, *,
             timeout: float = WAIT_SECONDS) -> dict[str, Any]:
    """The pod once the kubelet reports it Succeeded or Failed."""
    return wait(f"pod {name} to finish",
                lambda: (p := pod(core, namespace, name))["status"].get("phase") in ("Succeeded", "Failed") and p,
                timeout=timeout)


def log(core: kubernetes.client.CoreV1Api, namespace: str, name: str, container: str, *,
        previous: bool = False) -> str:
    """The container's log through pods/log (the apiserver asks the kubelet), as `kubectl logs` reads it."""
    return str(core.read_namespaced_pod_log(name, namespace, container=container, previous=previous))


def container_pid(node: node_mod.Node, container_id: str) -> int:
    """The host PID of a running container's first process, from containerd's own task list."""
    bare = container_id.split("://", 1)[-1]
    listed = subprocess.run([str(node.controllers_bin / "ctr"), f"--address={node.socket}", "--namespace=k8s.io",
                             "tasks", "list"], capture_output=True, text=True, timeout=30, check=True).stdout
    for line in listed.splitlines()[1:]:
        task, pid, status = line.split()[:3]
        if task == bare and status == "RUNNING":
            return int(pid)
    raise AssertionError(f"containerd runs no task {bare}: {listed}")


def proc_status(pid: int) -> dict[str, str]:
    """The kernel's /proc/PID/status as a mapping (Uid, Gid, Seccomp, NoNewPrivs, CapEff, ...)."""
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def parse_status(text: str) -> dict[str, str]:
    """A /proc/self/status listing printed into a log, as a mapping."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and " " not in key:
            fields[key] = value.strip()
    return fields


def cri_log(node: node_mod.Node, *, namespace: str, pod_name: str, container: str) -> list[tuple[str, str]]:
    """(stream, line) of each line the kubelet's CRI log of the container's first run holds
    (`<time> stdout|stderr F <line>`), read on the host: which stream a line came on."""
    found = sorted(node.pod_logs.glob(f"{namespace}_{pod_name}_*/{container}/0.log"))
    assert len(found) == 1, found
    lines = []
    for line in found[0].read_text().splitlines():
        _, stream, _, text = line.split(" ", 3)
        lines.append((stream, text))
    return lines


def describe(core: kubernetes.client.CoreV1Api, namespace: str) -> list[Any]:
    """Each pod's phase, each container's state and restarts, and the tail of each log: for a
    failure's message."""
    found: list[Any] = []
    for item in core.list_namespaced_pod(namespace).items:
        pod_obj = dict(core.api_client.sanitize_for_serialization(item))
        status = pod_obj.get("status") or {}
        containers = []
        for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            try:
                tail = log(core, namespace, pod_obj["metadata"]["name"], c["name"])[-300:]
            except kubernetes.client.ApiException as e:
                tail = f"(no log: {e.status})"
            containers.append((c["name"], c.get("state"), c.get("restartCount"), tail))
        found.append((pod_obj["metadata"]["name"], status.get("phase"), containers))
    return found


def refusal(done: subprocess.CompletedProcess[str], *, command: str = "toolkit cluster up") -> str:
    """The one line a refused CLI command printed (the build scripts may say `cached` before it):
    exit 1, nothing on stdout, no traceback, one line naming the command, and nothing after it."""
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line.startswith(f"{command}: ")] == lines[-1:], done.stderr
    assert done.stdout == ""
    return lines[-1]


SLOT_WAIT_SECONDS = 900.0  # another cluster's node holds the host at most this long
NODE_TAKEN = "a node of the local cluster is already running"  # `toolkit cluster up`'s refusal


def wait_for_the_slot() -> None:
    """Until no other cluster's node holds the host's slot (it is free again when this returns)."""
    os.close(node_mod.host_lock(wait=SLOT_WAIT_SECONDS))


def when_the_slot_is_free(attempt: Callable[[], subprocess.CompletedProcess[str]]) -> subprocess.CompletedProcess[str]:
    """ATTEMPT (a `toolkit cluster up`, which refuses at once while another cluster's node holds
    the host), again after the slot was freed while another cluster's node took it in between."""
    for _ in range(20):
        wait_for_the_slot()
        done = attempt()
        if NODE_TAKEN not in done.stderr:
            return done
    raise AssertionError(f"the host's node slot stayed taken: {done.stderr}")
