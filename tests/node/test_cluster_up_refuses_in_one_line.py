"""`toolkit cluster up` refuses, in one line naming the cause and before it touches the host, when
it is not root, when the kubelet's port is taken, when a kubelet or kube-proxy that is not the
local cluster's runs on the host, when the state dir is not empty and not a local cluster's, when
podman is missing, and when no cgroup memory controller is there (a second `up` while a cluster
runs: the up-and-down module). `toolkit cluster down` refuses a state dir that is not a local
cluster's, and leaves it as it was.

Each refusal is the real CLI in a subprocess under the condition made real: an unprivileged user
(uid 65534 in a user namespace), a socket bound to 10250, a process named kubelet (or kube-proxy)
running on the host, a directory holding a file of someone's, a PATH without podman, a private
mount namespace whose memory hierarchy (cgroup v1) or unified hierarchy (v2) is unmounted
(unshare; the host's own mounts are not touched). The memory check is also a pure function of the
mountinfo and cgroup.controllers texts, tested on this host's texts and on texts with the
controller taken out.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devcluster import node
from tests.node import kit

TOOLKIT = str(pathlib.Path(sys.executable).parent / "toolkit")
REFUSAL = "toolkit cluster up: "


def up(argv_prefix: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*argv_prefix, TOOLKIT, "cluster", "up"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[dict[str, str]]:
    environment = {**os.environ, "DISPATCH_CLUSTER_STATE": str(tmp_path / "state")}
    yield environment
    if (tmp_path / "state" / "pids.json").exists():  # it was not refused: leave nothing running
        subprocess.run([TOOLKIT, "cluster", "down"], env=environment, capture_output=True, timeout=300, check=False)


def test_not_root(env: dict[str, str], tmp_path: pathlib.Path) -> None:
    # Uid 65534 inside a user namespace of its own: the CLI sees a non-root user, while the files it
    # reads (a checkout in a private directory, say) are still opened with the caller's rights.
    nobody = ["unshare", "--user", "--map-user=65534", "--map-group=65534"]
    line = kit.refusal(up(nobody, {**env, "HOME": str(tmp_path)}))
    assert line == f"{REFUSAL}the local cluster runs a real node, which needs root: run as root"


def test_podman_missing(env: dict[str, str], tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    line = kit.refusal(up([], {**env, "PATH": str(empty)}))
    assert line == f"{REFUSAL}podman is not installed (run `make deps`)"


@pytest.mark.cluster
def test_a_node_port_in_use(env: dict[str, str]) -> None:
    for _ in range(20):
        # Bind the kubelet's port once no other cluster's node holds it (or the host's slot).
        fd = os.open(node.LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the last node's closing connections
        taken.bind(("0.0.0.0", node.KUBELET_PORT))
        taken.listen()
        os.close(fd)
        with taken:
            done = up([], env)
        if "a node of the local cluster is already running" not in done.stderr:
            break
    line = kit.refusal(done)
    assert line == (f"{REFUSAL}port {node.KUBELET_PORT} (the kubelet's) is in use on this host: "
                    "is another kubelet running?")
    assert not pathlib.Path(env["DISPATCH_CLUSTER_STATE"]).exists()


@pytest.mark.cluster
@pytest.mark.parametrize("name", node.NODE_PROCESSES)
def test_a_kubelet_or_kube_proxy_not_ours(env: dict[str, str], tmp_path: pathlib.Path, name: str) -> None:
    program = tmp_path / name  # a process the kernel calls `kubelet` (or `kube-proxy`), as a node's is
    shutil.copy("/bin/sleep", program)
    with subprocess.Popen([str(program), "600"]) as other:
        try:
            for _ in range(20):
                kit.wait_for_the_slot()  # then ask at once: another cluster's node would take the answer
                done = up([], env)
                if "a node of the local cluster is already running" not in done.stderr:
                    break
        finally:
            other.kill()
    line = kit.refusal(done)
    assert line == (f"{REFUSAL}this host runs a {name} (pid {other.pid}) that is not the local cluster's: the "
                    "local cluster's node would rewrite its networking; run it on another host")
    assert not pathlib.Path(env["DISPATCH_CLUSTER_STATE"]).exists()


def test_a_state_dir_not_ours(env: dict[str, str]) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    state.mkdir()
    (state / "notes.txt").write_text("someone's\n")
    line = kit.refusal(up([], env))
    assert line == (f"{REFUSAL}{state} is not empty and is not a local cluster's state dir (no "
                    ".dispatch-cluster-state in it): set DISPATCH_CLUSTER_STATE to a new directory")
    down = subprocess.run([TOOLKIT, "cluster", "down"], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    line = kit.refusal(down, command="toolkit cluster down")
    assert line == (f"toolkit cluster down: {state} is not a local cluster's state dir (no "
                    ".dispatch-cluster-state in it): not touched")
    assert [p.name for p in state.iterdir()] == ["notes.txt"]
    assert (state / "notes.txt").read_text() == "someone's\n"


@pytest.mark.cluster
def test_no_cgroup_memory_controller(env: dict[str, str]) -> None:
    mountinfo = pathlib.Path("/proc/self/mountinfo").read_text()
    memory = [line.split()[4] for line in mountinfo.splitlines()
              if (right := line.partition(" - ")[2].split())
              and (right[0] == "cgroup2" or (right[0] == "cgroup" and "memory" in right[2].split(",")))]
    assert memory, mountinfo  # preflight would refuse this host itself
    hide = " && ".join(f"umount {point}" for point in memory)
    line = kit.refusal(up(["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{hide} && exec "$@"', "sh"],
                      env))
    assert line == (f"{REFUSAL}no cgroup memory controller is mounted (neither cgroup v2 with memory nor a v1 "
                    "memory hierarchy): the kubelet cannot enforce limits")


def test_the_memory_check_reads_mountinfo_and_cgroup_controllers() -> None:
    mountinfo = pathlib.Path("/proc/self/mountinfo").read_text()
    controllers_file = pathlib.Path("/sys/fs/cgroup/cgroup.controllers")
    controllers = controllers_file.read_text() if controllers_file.exists() else None
    assert node.memory_controller(mountinfo=mountinfo, controllers=controllers)  # this host
    v1 = ("35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
          "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n")
    assert node.memory_controller(mountinfo=v1, controllers=None)
    assert not node.memory_controller(mountinfo=v1.splitlines()[1], controllers=None)
    # A directory named memory is not the controller: the super options say which it is.
    assert not node.memory_controller(
        mountinfo="35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,name=memory\n", controllers=None)
    v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert node.memory_controller(mountinfo=v2, controllers="cpuset cpu io memory hugetlb pids\n")
    assert not node.memory_controller(mountinfo=v2, controllers="hugetlb\n")  # seen on this host kind's v2
    assert not node.memory_controller(mountinfo=v2 + v1.splitlines()[1], controllers="")


def test_a_closing_connection_is_not_a_port_in_use() -> None:
    # A client that probed the kubelet leaves the port in TIME_WAIT for a minute after the node
    # stopped; the next node binds it all the same, so the check must not refuse. A listener must.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        assert node.port_in_use(port)
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: its end waits out TIME_WAIT
            assert client.recv(1) == b""
    waiting = [line for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]
               if int(line.split()[1].split(":")[1], 16) == port and line.split()[3] == "06"]
    assert waiting, "no TIME_WAIT connection on the port: the case is not made"
    assert not node.port_in_use(port)
