"""The harness itself: restarts keep state, and nothing outlives a stopped plane."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import kubernetes.client
import pytest

from tests.controlplane import harness

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]


def own_plane(plane: harness.ControlPlane | harness.ExistingCluster) -> harness.ControlPlane:
    if not isinstance(plane, harness.ControlPlane):
        pytest.skip("process control applies only to the harness's own control plane, not TEST_KUBECONFIG's")
    return plane


def alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def port_listening(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def test_apiserver_restart_keeps_data_and_port(
        control_plane: harness.ControlPlane | harness.ExistingCluster, namespace: str) -> None:
    plane = own_plane(control_plane)
    server = plane.server
    with plane.api_client() as api:
        kubernetes.client.CoreV1Api(api).create_namespaced_config_map(namespace, {"metadata": {"name": "kept"}})
    plane.stop_apiserver()
    assert not port_listening(server)
    plane.start_apiserver()
    assert plane.server == server
    with plane.api_client() as api:
        assert kubernetes.client.CoreV1Api(api).read_namespaced_config_map("kept", namespace).metadata.name == "kept"


CHILD = """
import json, sys, time
from tests.controlplane import harness
plane = harness.ControlPlane(bin_dir=harness.pathlib.Path(sys.argv[1]), scheduler=False, crds=False).start()
print(json.dumps({"pids": plane.pids(), "workdir": str(plane.workdir), "server": plane.server,
                  "etcd": plane.etcd_url}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_harness_leaves_no_process_port_or_dir(
        control_plane: harness.ControlPlane | harness.ExistingCluster, signum: int) -> None:
    plane = own_plane(control_plane)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(plane.bin_dir)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        state = json.loads(child.stdout.readline())
        assert all(alive(pid) for pid in state["pids"].values())
        child.send_signal(signum)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in state["pids"].values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [name for name, pid in state["pids"].items() if alive(pid)] == []
    assert not port_listening(state["server"]) and not port_listening(state["etcd"])
    assert not pathlib.Path(state["workdir"]).exists()
