"""`toolkit cluster up` and `down` on a shared host, through the CLI as a person runs them.

Up then down leaves the host as it was: what `node.host_snapshot()` describes (the node's mounts,
cgroups and their processes, shims, the bridge, the node address, the KUBE- chains and every rule
in or to them in both iptables families, the six sysctls the kubelet writes and the forwarding
switches the CNI bridge turns on, /run/netns, the node's directories), plus every network link,
every network namespace, every mount point, and every process of the cluster (any process whose
command line names the cluster's state dir or the node's directories). Two of the kubelet's six
sysctls already hold its values on a stock kernel; the test sets them one off first, so that the
kubelet does change them (`vm.panic_on_oom` is left at 0: any other value panics the kernel on
an OOM).

What was on the host before `up` stays after `down`: KUBE- chains of the host's own (as a host
that is a Kubernetes node has them, in both families, one of them a chain kube-proxy rewrites,
each with a rule jumping to it) and the node address, if it was there before. `down` with no
cluster up touches nothing.

After a crash (every recorded process group SIGKILLed: control plane, controllers, containerd,
kubelet, kube-proxy; the shims and the pods' processes, in sessions of their own, live on),
`up` sweeps what the dead cluster left, says what in one line, and comes up; `down` then leaves
the host as before the first `up`. A process that meanwhile got the number of a recorded process
group (its number written where the dead group's was, as the kernel's reuse of the number leaves
the records) is neither taken for the cluster nor signalled, by `up` after the crash and by `down` after the crash alike.

A second `up` while a cluster runs is refused in one line: from the same state dir (the cluster is
up) and from another (the host's one node is taken).

The snapshots are taken holding the host's node slot, so no other cluster's node is half-way
through starting or stopping; podman's own storage mounts are left out (other users' containers
on a shared host come and go).
"""
from __future__ import annotations

import contextlib
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

from devcluster import node, procs
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


@contextlib.contextmanager
def the_slot() -> Iterator[None]:
    """The host's node slot, held (waiting for any other cluster's node to finish)."""
    node.LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(node.LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def settled(state: pathlib.Path) -> dict[str, Any]:
    """The host, seen holding the node slot."""
    with the_slot():
        return host(state)


def up_when_free(env: dict[str, str], state: pathlib.Path) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """The host before, then `up`; again while another cluster's node took the slot in between."""
    before: list[dict[str, Any]] = []

    def attempt() -> subprocess.CompletedProcess[str]:
        before[:] = [settled(state)]
        return cluster("up", env=env)

    started = kit.when_the_slot_is_free(attempt)
    return before[0], started


def run_a_pod(state: pathlib.Path) -> None:
    """A pod on the node (its sandbox, network namespace, volumes, shim and cgroups), Running."""
    with kubernetes.config.new_client_from_config(config_file=str(state / "admin.kubeconfig")) as api:
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespaced_pod("default", {"metadata": {"name": "sleeper"}, "spec": {"containers": [
            {"name": "main", "image": kit.BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}})
        kit.wait("the pod to run", lambda: core.read_namespaced_pod("sleeper", "default").status.phase == "Running")


def differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {key: (before[key], after[key]) for key in before if before[key] != after[key]}


def crash(state: pathlib.Path) -> dict[str, int]:
    """SIGKILL every recorded process group of the cluster; their ids by name."""
    recorded = {name: procs.Group(g["pgid"], g["id"]) for name, g in json.loads((state / "pids.json").read_text()).items()}
    assert {"kube-apiserver", "containerd", "kubelet", "kube-proxy"} <= set(recorded), recorded
    for group in recorded.values():
        os.killpg(group.pgid, signal.SIGKILL)
    kit.wait("every killed process to be gone", lambda: not stack_mod.still_running(recorded.items()))
    return {name: group.pgid for name, group in recorded.items()}


def reuse(state: pathlib.Path, name: str) -> subprocess.Popen[bytes]:
    """A live process (its own group's leader) that a dead group's recorded number names now.

    The kernel hands a freed number out again (the unshare test in
    test_a_recorded_process_group_is_signalled_only_while_it_is_ours.py makes it do so); on a host
    whose other processes start threads all the time, steering the one number to ours is a race. So
    the new process's number is put where NAME's was, in `pids.json` and in the node's host record,
    with the identity recorded for NAME: what both files say after the kernel reused the number."""
    victim = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    pids = json.loads((state / "pids.json").read_text())
    pids[name]["pgid"] = victim.pid
    (state / "pids.json").write_text(json.dumps(pids))
    record = json.loads(node.HOST_RECORD.read_text())
    if name in record.get("groups", {}):
        record["groups"][name] = victim.pid
        node.HOST_RECORD.write_text(json.dumps(record))
    return victim


# The kubelet's values (setupKernelTunables) that a stock kernel already has; one off them before
# `up`, so that the kubelet changes them and `down` must put them back.
KUBELET_VALUES = {"kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000"}


@pytest.fixture
def kernel_off_the_kubelets_values() -> Iterator[None]:
    paths = {pathlib.Path("/proc/sys") / key: value for key, value in KUBELET_VALUES.items()}
    with the_slot():
        old = {path: path.read_text().strip() for path in paths}
        for path, value in paths.items():
            if old[path] == value:
                path.write_text(str(int(value) - 1))
    try:
        yield
    finally:
        with the_slot():
            for path, value in old.items():
                path.write_text(value)


# Chains of the host's own, as a host that is (or was) a Kubernetes node has them: one the
# kube-proxy of the local cluster rewrites (nat KUBE-SERVICES) and one it never names; each with
# a rule of its own and a rule in a built-in chain jumping to it.
FOREIGN = (("filter", "KUBE-HOST-OWN", "INPUT"), ("nat", "KUBE-SERVICES", "OUTPUT"))


def foreign_chains(action: str) -> None:
    """Add (`-A`) or remove (`-D`) the host's own KUBE- chains, in both families."""
    for family in node.IPTABLES_FAMILIES:
        for table, chain, builtin in FOREIGN:
            steps = [(builtin, ["-p", "tcp", "--dport", "9", "-j", chain]), (chain, ["-p", "tcp", "--dport", "9", "-j", "RETURN"])]
            if action == "-A":
                subprocess.run([family, "-w", "-t", table, "-N", chain], check=False)  # there already: kept
                for target, rule in reversed(steps):
                    subprocess.run([family, "-w", "-t", table, "-A", target, *rule], check=True)
            else:
                for target, rule in steps:
                    subprocess.run([family, "-w", "-t", table, "-D", target, *rule], check=False)
                subprocess.run([family, "-w", "-t", table, "-X", chain], check=False)


@pytest.fixture
def host_of_its_own() -> Iterator[None]:
    """The host's own KUBE- chains and the node address, there before `up` (and removed after)."""
    with the_slot():
        foreign_chains("-A")
        subprocess.run(["ip", "addr", "add", f"{node.NODE_IP}/32", "dev", "lo"], check=True)
    try:
        yield
    finally:
        with the_slot():
            foreign_chains("-D")
            subprocess.run(["ip", "addr", "del", f"{node.NODE_IP}/32", "dev", "lo"], check=False)


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[dict[str, str]]:
    state = tmp_path / "state"
    environment = {**os.environ, "DISPATCH_CLUSTER_STATE": str(state)}
    yield environment
    if (state / "pids.json").exists():  # a failed test: leave nothing running either way
        cluster("down", env=environment)


@pytest.mark.usefixtures("kernel_off_the_kubelets_values")
def test_up_then_down_leaves_the_host_as_before(env: dict[str, str], tmp_path: pathlib.Path) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before, started = up_when_free(env, state)
    assert started.returncode == 0, started.stderr
    assert "cleaned up" not in started.stderr, started.stderr  # nothing was left to clean
    run_a_pod(state)
    running = host(state)
    assert running["bridge"] and running["node_address"] and running["processes"], running
    assert running["shims"] and running["cgroup_pids"] and running["mounts"], running
    # What `down` must undo was done: every sysctl the kubelet writes holds its value (the two set
    # one off among them), forwarding is on, both families have the kubelet's chains.
    assert {k: running["sysctls"][k] for k in KUBELET_VALUES} == KUBELET_VALUES, running["sysctls"]
    assert running["sysctls"]["net/ipv4/ip_forward"] == "1", running["sysctls"]
    assert running["ip6tables_kube"] and running["iptables_kube"], running
    assert "a cluster is already up" in kit.refusal(cluster("up", env=env))
    other = cluster("up", env={**env, "DISPATCH_CLUSTER_STATE": str(tmp_path / "other")})
    assert "a node of the local cluster is already running on this host" in kit.refusal(other)
    stopped = cluster("down", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert differences(before, settled(state)) == {}


@pytest.mark.usefixtures("host_of_its_own")
def test_what_the_host_had_before_up_stays_after_down(env: dict[str, str]) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before, started = up_when_free(env, state)
    assert before["node_address"] and before["iptables_kube"] and before["ip6tables_kube"], before
    assert started.returncode == 0, started.stderr
    run_a_pod(state)
    running = host(state)
    assert running["iptables_kube"] != before["iptables_kube"], running  # kube-proxy rewrote KUBE-SERVICES
    stopped = cluster("down", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert differences(before, settled(state)) == {}


@pytest.mark.usefixtures("host_of_its_own")
def test_down_with_no_cluster_up_touches_nothing(env: dict[str, str]) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before = settled(state)
    stopped = cluster("down", env=env)
    assert (stopped.returncode, stopped.stderr) == (0, "no cluster was up\n")
    assert differences(before, settled(state)) == {}


def test_up_after_a_crash_cleans_the_leftovers_first(env: dict[str, str]) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before, started = up_when_free(env, state)
    assert started.returncode == 0, started.stderr
    run_a_pod(state)
    crash(state)
    crashed = host(state)
    assert crashed["shims"] and crashed["cgroup_pids"] and crashed["bridge"], crashed  # what the crash left
    victim = reuse(state, "containerd")  # recorded in pids.json and in the node's host record
    try:
        recovered = cluster("up", env=env)
        assert recovered.returncode == 0, recovered.stderr
        assert victim.poll() is None, "up signalled a process that reused a recorded group's number"
    finally:
        victim.kill()
        victim.wait()
    cleaned = [line for line in recovered.stderr.splitlines() if line.startswith("cleaned up after an earlier")]
    assert len(cleaned) == 1, recovered.stderr
    for left in ("containerd shims", "processes in the node's cgroups", f"the bridge {node.BRIDGE}"):
        assert left in cleaned[0], cleaned[0]
    assert cluster("status", env=env).returncode == 0
    stopped = cluster("down", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert differences(before, settled(state)) == {}


def test_down_after_a_crash_signals_no_reused_number(env: dict[str, str]) -> None:
    state = pathlib.Path(env["DISPATCH_CLUSTER_STATE"])
    before, started = up_when_free(env, state)
    assert started.returncode == 0, started.stderr
    run_a_pod(state)
    crash(state)
    victim = reuse(state, "kube-apiserver")
    try:
        status = cluster("status", env=env)
        assert status.returncode == 1 and "kube-apiserver" in status.stderr.splitlines()[-1], status.stderr
        stopped = cluster("down", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert victim.poll() is None, "down signalled a process that reused a recorded group's number"
    finally:
        victim.kill()
        victim.wait()
    assert differences(before, settled(state)) == {}
