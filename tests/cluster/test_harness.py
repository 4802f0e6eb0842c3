"""The harness itself: restarts keep state, and nothing outlives a stopped plane."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

import kubernetes.client
import kubernetes.config
import pytest

from devcluster import harness

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


# The child is a foreground program a person interrupts: Ctrl-C raises KeyboardInterrupt. A suite
# started in the background (a shell's `&`, as CI may start it) passes SIGINT ignored to every child,
# and Python then keeps it ignored; so the child sets Python's own handler first. On a machine
# loaded by the rest of the suite, tearing a plane down can take long; a child still running after
# STOP_WAIT seconds is asked for its stacks (SIGUSR1), which the failure then shows.
STOP_WAIT = 180
CHILD = """
import faulthandler, json, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1, all_threads=True)
from devcluster import harness
plane = harness.ControlPlane(bin_dir=harness.pathlib.Path(sys.argv[1]), scheduler=False, crds=False).start()
print(json.dumps({"pids": plane.pids(), "workdir": str(plane.workdir), "server": plane.server,
                  "etcd": plane.etcd_url}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_harness_leaves_no_process_port_or_dir(
        control_plane: harness.ControlPlane | harness.ExistingCluster, signum: int,
        tmp_path: pathlib.Path) -> None:
    plane = own_plane(control_plane)
    stderr = tmp_path / "child.stderr"
    with stderr.open("wb") as sink:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(plane.bin_dir)], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        assert child.stdout is not None
        state = json.loads(child.stdout.readline())
        assert all(alive(pid) for pid in state["pids"].values())
        child.send_signal(signum)
        try:
            child.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGUSR1)
            time.sleep(1)
            pytest.fail(f"the child still ran {STOP_WAIT} s after the signal; its stderr:\n"
                        f"{stderr.read_text(errors='replace')}")
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


def test_an_existing_cluster_over_the_planes_own_kubeconfig_answers(
        control_plane: harness.ControlPlane | harness.ExistingCluster, namespace: str) -> None:
    """The TEST_KUBECONFIG code path, on a cluster at hand: the plane's own
    kubeconfig, taken as someone else's cluster. It answers, keeps the CRDs it
    finds as they are, mints a working service-account kubeconfig, and
    refuses process control."""
    crd = "trainjobs.trainer.kubeflow.org"
    with control_plane.api_client() as api:
        crds = kubernetes.client.ApiextensionsV1Api(api)
        before = crds.read_custom_resource_definition(crd).metadata.resource_version
    existing = harness.ExistingCluster(control_plane.kubeconfig)
    workdir = existing.workdir
    try:
        assert existing.start() is existing  # creates only missing CRDs, waits for Established
        assert (existing.server, existing.ca_file) == (control_plane.server, control_plane.ca_file)
        with existing.api_client() as api:
            assert kubernetes.client.VersionApi(api).get_code().git_version.startswith("v1.")
            crds = kubernetes.client.ApiextensionsV1Api(api)
            assert crds.read_custom_resource_definition(crd).metadata.resource_version == before
        minted = existing.mint_kubeconfig(namespace=namespace, service_account="probe")
        assert pathlib.Path(minted).is_relative_to(workdir)
        with kubernetes.config.new_client_from_config(config_file=minted) as api:
            review = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:probe"
        with pytest.raises(harness.HarnessError, match="does not run"):
            existing.stop_apiserver()
        assert existing.logs().startswith(f"(existing cluster {control_plane.server}")
    finally:
        existing.stop()
    assert not workdir.exists()


def _etcd_answers(url: str, *, context: ssl.SSLContext | None) -> bool:
    """Whether etcd at URL answers a read of every key (a range from the empty key to the end)
    with 200: what anyone who can write to it could also do."""
    body = json.dumps({"key": "AA==", "range_end": "AA=="}).encode()  # base64 of \0: every key
    request = urllib.request.Request(f"{url}/v3/kv/range", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status == 200
    except OSError:  # refused, reset, a TLS alert (no or a wrong client certificate), an HTTP error
        return False


def test_etcd_answers_only_a_client_certificate_of_its_own_ca(
        control_plane: harness.ControlPlane | harness.ExistingCluster) -> None:
    """Whoever writes to etcd owns the cluster (and, with a node, the host: a privileged pod
    written there runs as root). Plain HTTP, TLS without a client certificate and TLS with a
    certificate the plane's CA signed for someone else are all refused, on the client and the
    peer port; the apiserver's own client certificate is answered."""
    plane = own_plane(control_plane)
    port = plane.etcd_url.rsplit(":", 1)[1]
    peer = next(a.split("=", 1)[1] for a in plane._procs["etcd"].argv if a.startswith("--listen-peer-urls="))
    assert not _etcd_answers(f"http://127.0.0.1:{port}", context=None)
    anonymous = ssl.create_default_context(cafile=plane.etcd_ca_file)
    assert not _etcd_answers(f"https://127.0.0.1:{port}", context=anonymous)
    other = ssl.create_default_context(cafile=plane.etcd_ca_file)
    other.load_cert_chain(*plane.issue("etcd-probe", subject="/O=system:masters/CN=probe"))
    assert not _etcd_answers(f"https://127.0.0.1:{port}", context=other)
    for context in (None, anonymous, other):
        scheme = "http" if context is None else "https"
        assert not _etcd_answers(f"{scheme}://{peer.split('://', 1)[1]}", context=context)
    assert plane.etcd_url.startswith("https://")
    assert _etcd_answers(plane.etcd_url, context=plane._etcd_context())
