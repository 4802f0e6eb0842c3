"""`toolkit cluster up|down|status` (devcluster/local.py) as a person runs it:
up starts the control plane, the real controllers and the real node (kubelet,
kube-proxy, containerd) in the background, installs our release from its
manifests (our controller runs as the Deployment's pods, one of them holding
the Lease) and prints the kubeconfig, which reaches a cluster whose one node
runs a person's pod for real; a second up is refused; status names every live
component and our controller's pods; down leaves nothing running. A
missing podman or an unwritable cache dir is one line naming the cause.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

import kubernetes.client
import kubernetes.config
import pytest

from devcluster import node, procs, stack as stack_mod
from tests.node import kit

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLKIT = str(REPO / ".venv" / "bin" / "toolkit")
BUSYBOX = "localhost/dispatch-base/busybox:1.35-static"
# The release devcluster/go.mod pins: the apiserver and the kubectl built beside it report it.
K8S_RELEASE = next(line.split()[1] for line in (REPO / "devcluster" / "go.mod").read_text().splitlines()
                   if line.split()[:1] == ["k8s.io/kubernetes"])


def cluster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLKIT, "cluster", *args], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_up_status_down_a_whole_local_cluster(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "DISPATCH_CLUSTER_STATE": str(tmp_path / "state")}
    started = kit.when_the_slot_is_free(lambda: cluster("up", env=env))  # another run's node may hold the host
    assert started.returncode == 0, started.stderr
    groups = json.loads((tmp_path / "state" / "pids.json").read_text())
    try:
        # What `eval "$(toolkit cluster up)"` runs, then the kubectl it puts first on PATH.
        use = "kubectl version -o json | tr -d '\\n'; echo; kubectl get nodes -o name"
        shell = subprocess.run(["bash", "-c", started.stdout + use], env=env, capture_output=True, text=True,
                               timeout=60, check=False)
        assert shell.returncode == 0, shell.stderr
        version, _, nodes = shell.stdout.partition("\n")
        release = json.loads(version)
        assert release["clientVersion"]["gitVersion"] == release["serverVersion"]["gitVersion"] == K8S_RELEASE
        assert nodes.split() == [f"node/{node.NODE_NAME}"]
        kubeconfig = started.stdout.splitlines()[0].removeprefix("export KUBECONFIG=")
        with kubernetes.config.new_client_from_config(config_file=kubeconfig) as api:
            ready = {n.metadata.name for n in kubernetes.client.CoreV1Api(api).list_node().items}
            assert ready == {node.NODE_NAME}
            # A person's pod runs for real: the kubelet runs its command in its image, and it ends with its
            # exit code.
            core = kubernetes.client.CoreV1Api(api)
            core.create_namespaced_pod("default", {
                "metadata": {"name": "hello"},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": BUSYBOX, "command": ["/bin/sh", "-c", 'echo "hi from $POD"; exit 7'],
                    "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]}})
            deadline = time.monotonic() + 60
            while (pod := core.read_namespaced_pod("hello", "default")).status.phase not in ("Succeeded", "Failed"):
                assert time.monotonic() < deadline, pod.status
                time.sleep(0.3)
            assert pod.status.phase == "Failed"
            assert pod.status.container_statuses[0].state.terminated.exit_code == 7
            assert core.read_namespaced_pod_log("hello", "default", container="main") == "hi from hello\n"
        # `up` says how to push to the cluster's registry, whose state is in the state dir.
        assert "its registry registry.dispatch.test is at 127.0.0.1:" in started.stderr
        assert (tmp_path / "state" / "registry" / "registry.json").exists()
        # Our release, installed from its bundle: the controller runs as pods, not as a process of `up`.
        assert "our release installed from " in started.stderr and "holds the Lease" in started.stderr
        assert (tmp_path / "state" / "release" / "controller.yaml").exists()
        assert not any("controller" in name and "dispatch" in name for name in groups), groups
        again = cluster("up", env=env)
        assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
        assert "a cluster is already up" in again.stderr
        status = cluster("status", env=env)
        assert status.returncode == 0, status.stderr
        for name in ("kube-apiserver", "trainer-controller-manager", "jobset-controller", "kueue", "containerd",
                     "kubelet", "kube-proxy", "registry"):
            assert name in status.stdout
        pods = next(line for line in status.stdout.splitlines() if line.startswith("our controller's pods: "))
        assert pods.count("dispatch-system/dispatch-controller-") == 2, pods
        # One replica holds the Lease, Ready; the other stands by (Ready too once the kubelet probed it).
        assert pods.count("Running, Ready, holds the Lease") == 1 and pods.count("Running, ") == 2, pods
    finally:
        stopped = cluster("down", env=env)
    assert stopped.returncode == 0 and "cluster down" in stopped.stderr
    assert stack_mod.still_running((name, procs.Group(g["pgid"], g["id"])) for name, g in groups.items()) == []
    after = cluster("status", env=env)
    assert after.returncode == 1 and "no cluster is up" in after.stderr


def test_up_without_podman_is_one_line(tmp_path: pathlib.Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("go", "openssl"):
        (bin_dir / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True,
                                                   check=True).stdout.strip())
    env = {**os.environ, "PATH": str(bin_dir), "DISPATCH_CLUSTER_STATE": str(tmp_path / "state")}
    proc = cluster("up", env=env)
    assert (proc.returncode, proc.stderr) == (1, "toolkit cluster up: podman is not installed (run `make deps`)\n")
    assert not (tmp_path / "state").exists()


def test_up_with_an_unwritable_cache_dir_is_one_line(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "DISPATCH_K8S_CACHE": str(blocker / "cache"), "DISPATCH_CLUSTER_STATE": str(tmp_path / "s")}
    proc = cluster("up", env=env)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"cache dir {blocker / 'cache'} is not writable" in proc.stderr


def test_up_with_a_registry_name_outside_test_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "DISPATCH_CLUSTER_STATE": str(tmp_path / "state")}
    proc = cluster("up", "--registry-name", "registry.example.com", env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--registry-name" in proc.stderr and "under .test" in proc.stderr
    assert not (tmp_path / "state").exists()
