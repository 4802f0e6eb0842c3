"""`toolkit cluster up` and `down` on a shared host, through the CLI as a person runs them.

Up then down leaves the host as it was: what `node.host_snapshot()` describes (the node's mounts,
cgroups and their processes, shims, the bridge, the node address, KUBE- chains, the kubelet's
sysctls, /run/netns, the node's directories), plus every network link, every network namespace,
every mount point, and every process of the cluster (any process whose command line names the
cluster's state dir or the node's directories).

After a crash (every recorded process group SIGKILLed: control plane, controllers, containerd,
kubelet, kube-proxy; the shims and the pods' processes, in sessions of their own, live on),
`up` sweeps what the dead cluster left, says what in one line, and comes up; `down` then leaves
the host as before the first `up`.

A second `up` while a cluster runs is refused in one line: from the same state dir (the cluster is
up) and from another (the host's one node is taken).

The snapshots are taken holding the host's node slot, so no other cluster's node is half-way
through starting or stopping; podman's own storage mounts are left out (other users' containers
on a shared host come and go).
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest

from devcluster import node
from devcluster import stack as stack_mod
from tests.node import kit

pytestmark = pytest.mark.cluster

TOOLKIT = str(pathlib.Path(sys.executable).parent / "toolkit")
PODMAN_STORAGE = ("/var/lib/containers/", "/run/containers/")
NODE_DIRS = (str(node.RUN_DIR), str(node.VAR_DIR))


def cluster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLKIT, "cluster", *args], env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def processes(state: pathlib.Path) -> list[str]:
    """Command lines of the processes that name the cluster's state dir or the node's directories."""
    marks = (str(state), *NODE_DIRS)
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(mark in argv for mark in marks):
            found.append(f"{entry.name} {argv[:200]}")
    return sorted(found)


def host(state: pathlib.Path) -> dict[str, Any]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    mounts = [line.split()[4] for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()]
    return {
        **node.host_snapshot(),
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()),
        "all_netns": sorted(netns.split()),
        "all_mounts": sorted(m for m in mounts if not m.startswith(PODMAN_STORAGE)),
        "processes": processes(state),
    }


def settled(state: pathlib.Path) -> dict[str, Any]:
    """The host, seen holding the node slot (waiting for any other cluster's node to finish)."""
    fd = os.open(node.LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return host(state)
    finally:
        os.close(fd)


def up_when_free(env: dict[str, str], state: pathlib.Path) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """The host before, then `up`; again while another cluster's node took the slot in between."""
    for _ in range(20):
        before = settled(state)
        started = cluster("up", env=env)
        if "a node of the local cluster is already running" not in started.stderr:
            return before, started
    raise AssertionError(f"the host's node slot stayed taken: {started.stderr}")


def run_a_pod(state: pathlib.Path) -> None:
    """A pod on the node (its sandbox, network namespace, volumes, shim and cgroups), Running."""
    with kubernetes.config.new_client_from_config(config_file=str(state / "admin.kubeconfig")) as api:
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespaced_pod("default", {"metadata": {"name": "sleeper"}, "spec": {"containers": [
            {"name": "main", "image": kit.BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}})
        kit.wait("the pod to run", lambda: core.read_namespaced_pod("sleeper", "default").status.phase == "Running")


def differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {key: (before[key], after[key]) for key in before if before[key] != after[key]}


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[dict[str, str]]:
    state = tmp_path / "state"
    environment = {**os.environ, "DISPATCH_CLUSTER_STATE": str(state)}
    yield environment
    if (state / "pids.json").exists():  # a failed test: leave nothing running either way
        cluster("down", env=environment)


def test_up_then_down_leaves_the_host_as_before(env: dict[str, str], tmp_path: pathlib.Path) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before, started = up_when_free(env, state)
    assert started.returncode == 0, started.stderr
    assert "cleaned up" not in started.stderr, started.stderr  # nothing was left to clean
    run_a_pod(state)
    running = host(state)
    assert running["bridge"] and running["node_address"] and running["processes"], running
    assert running["shims"] and running["cgroup_pids"] and running["mounts"], running
    assert "a cluster is already up" in kit.refusal(cluster("up", env=env))
    other = cluster("up", env={**env, "DISPATCH_CLUSTER_STATE": str(tmp_path / "other")})
    assert "a node of the local cluster is already running on this host" in kit.refusal(other)
    stopped = cluster("down", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert differences(before, settled(state)) == {}


def test_up_after_a_crash_cleans_the_leftovers_first(env: dict[str, str]) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before, started = up_when_free(env, state)
    assert started.returncode == 0, started.stderr
    groups = json.loads((state / "pids.json").read_text())
    assert {"kube-apiserver", "containerd", "kubelet", "kube-proxy"} <= set(groups), groups
    run_a_pod(state)
    for pgid in groups.values():
        os.killpg(pgid, signal.SIGKILL)
    kit.wait("every killed process to be gone", lambda: not stack_mod.still_running(list(groups.items())))
    crashed = host(state)
    assert crashed["shims"] and crashed["cgroup_pids"] and crashed["bridge"], crashed  # what the crash left

    recovered = cluster("up", env=env)
    assert recovered.returncode == 0, recovered.stderr
    cleaned = [line for line in recovered.stderr.splitlines() if line.startswith("cleaned up after an earlier")]
    assert len(cleaned) == 1, recovered.stderr
    for left in ("containerd shims", "processes in the node's cgroups", f"the bridge {node.BRIDGE}"):
        assert left in cleaned[0], cleaned[0]
    assert cluster("status", env=env).returncode == 0
    stopped = cluster("down", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert differences(before, settled(state)) == {}
