"""A real Kubernetes node on this host, for the local cluster's pods.

The kubelet and kube-proxy of the control plane's own release (build-controlplane.sh), containerd
2.x with its runc shim (build-controllers.sh), Debian's runc and CNI plugins, and the pause image
scripts/build-images.sh makes. Every pod of the local cluster runs here, for real: the Downward
API, native sidecars, restart policies, securityContext, probes, projected ServiceAccount tokens,
memory limits and OOM kills are the kubelet's own (docs/controlplane.md, "The node").

Invariants:
- One node per host at a time: `host_lock()` is an exclusive flock held from before the host is
  touched until after it is restored; a second node waits for it (`wait=True`) or is refused in
  one line.
- Everything the node does to the host is recorded before it is done, in `HOST_RECORD` (on /run,
  so a reboot forgets it with the changes): the owner (the cluster's workdir), the sysctls the
  kubelet rewrites and the forwarding switches the CNI bridge turns on, with their old values,
  both iptables families' rules as they were, whether the node address was added to `lo`, and
  each process group started with its leader's identity (devcluster/procs.py). `sweep()` undoes
  all of it from that record alone, so it also cleans up after a crash (everything SIGKILLed): it
  kills every process in the node's cgroup tree and every recorded process group that is still
  the one recorded, unmounts whatever is mounted under the node's directories (pod volumes,
  network namespaces, container root filesystems), deletes the CNI bridge, puts the KUBE- chains
  of both families back as they were (removing only chains made since, and rules that jump to
  them), removes the node address if it was added, removes the node's cgroups and restores the
  sysctls. With no record it touches nothing. `Node.stop()` ends with `sweep()`, and
  `local.start()` begins with it.
- Nothing of the host's own is touched beyond that record: a host that runs a kubelet or
  kube-proxy of its own is refused (`foreign_node`), as is one with a link named like the bridge
  or a node directory without our marker in it; the node's cgroups live under
  `CGROUP_ROOT`, its netns mounts under its containerd state dir, its CNI leases under its own
  data dir, its sockets and state under `RUN_DIR`; containerd reads no host config (imports = []).
- Images reach containerd two ways. Those named by the cluster's registry
  (`registry.dispatch.test/...@sha256:...`, devcluster/registry.py) are pulled by the kubelet, as on
  any node: containerd's registry configuration (`hosts.toml` under the node's own config dir) maps
  that name to the registry, with its CA and credentials. The local images the suites' pods name
  (`localhost/...`) are saved from podman and imported into containerd's `k8s.io` namespace when
  their podman image id differs from the one last imported (containerd's root is kept in the
  cache, like the binaries, so that is usually never).

The node address: the kubelet refuses a loopback node IP, and the host's own address may be
anything (or nothing). The node takes `NODE_IP`, from the range RFC 2544 sets aside for
benchmarking and which is never routed, as a /32 on `lo`: pods reach it through the bridge, the
apiserver binds to it, and no packet to it leaves the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import time
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml

from devcluster import harness, procs

NODE_NAME = "dispatch-node-0"
NODE_IP = "198.18.0.1"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "dispatch0"
CNI_NETWORK = "dispatch-pods"
CGROUP_ROOT = "dispatch-k8s"  # under each hierarchy's root: /sys/fs/cgroup/<controller>/dispatch-k8s
KUBELET_PORT = 10250
RUN_DIR = pathlib.Path("/run/dispatch-k8s/node")
VAR_DIR = pathlib.Path("/var/lib/dispatch-k8s/node")
HOST_RECORD = RUN_DIR / "host.json"
LOCK_FILE = pathlib.Path("/run/dispatch-k8s/node.lock")
CNI_BIN_DIR = pathlib.Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
PAUSE_IMAGE = "localhost/dispatch-base/pause:1"
# The cluster DNS Service's ClusterIP (devcluster/dns.py), in the control plane's Service range, and
# the domain it serves: what the kubelet writes into each pod's resolv.conf.
CLUSTER_DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
# The sysctls the kubelet sets on start when they differ (setupKernelTunables in the kubelet's
# container manager: the kernel defaults it protects), and the forwarding switches the CNI bridge
# plugin turns on for a gateway; each recorded before the node starts, put back by sweep().
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
FORWARDING_SYSCTLS = ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding")
HOST_SYSCTLS = KUBELET_SYSCTLS + FORWARDING_SYSCTLS
# The kubelet and kube-proxy write chains in both families.
IPTABLES_FAMILIES = ("iptables", "ip6tables")
# The processes that make a host a Kubernetes node; one not ours means `up` is refused.
NODE_PROCESSES = ("kubelet", "kube-proxy")
# Written into VAR_DIR when it is made: a directory there without it is not the node's.
VAR_MARKER = ".dispatch-k8s-node"
READY_TIMEOUT_SECONDS = 120.0
STOP_PODS_SECONDS = 60.0


class NodeError(harness.HarnessError):
    """A one-line reason the node cannot start (or a component that failed)."""


# -- preflight -------------------------------------------------------------------------


def cgroup_version() -> int:
    """2 when the unified hierarchy holds the memory controller, else 1."""
    controllers = pathlib.Path("/sys/fs/cgroup/cgroup.controllers")
    if controllers.exists() and "memory" in controllers.read_text().split():
        return 2
    return 1


def _v1_hierarchies() -> list[pathlib.Path]:
    """The mounted cgroup v1 hierarchies (one directory per controller set, no symlinks)."""
    found = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] == "cgroup":
            found.append(pathlib.Path(left.split()[4]))
    return sorted(set(found))


def memory_controller(*, mountinfo: str, controllers: str | None) -> bool:
    """Whether the kubelet finds a memory controller, from the text of /proc/self/mountinfo and
    of /sys/fs/cgroup/cgroup.controllers (None when that file is absent): cgroup v2 with memory
    among its controllers, or a mounted v1 hierarchy whose super options name memory. Pure, so
    the refusal is tested on texts as well as on this host."""
    if controllers is not None and "memory" in controllers.split():
        return True
    for line in mountinfo.splitlines():
        _, _, right = line.partition(" - ")
        fields = right.split()
        if len(fields) >= 3 and fields[0] == "cgroup" and "memory" in fields[2].split(","):
            return True
    return False


def _memory_controller_here() -> bool:
    controllers = pathlib.Path("/sys/fs/cgroup/cgroup.controllers")
    return memory_controller(mountinfo=pathlib.Path("/proc/self/mountinfo").read_text(),
                             controllers=controllers.read_text() if controllers.exists() else None)


def preflight(*, bin_dirs: tuple[pathlib.Path, pathlib.Path]) -> None:
    """The reasons a node cannot start here, each one line, before anything is touched (the
    kubelet's ports: `check_ports`, once the host's node slot is held)."""
    if os.geteuid() != 0:
        raise NodeError("a real node needs root (the kubelet and containerd manage mounts, cgroups and "
                        "network namespaces): run as root")
    if not _memory_controller_here():
        raise NodeError("no cgroup memory controller is mounted (neither cgroup v2 with memory nor a v1 "
                        "memory hierarchy): the kubelet cannot enforce limits")
    for tool in ("runc", "iptables", "ip", "podman"):
        if shutil.which(tool) is None:
            raise NodeError(f"{tool} is not installed (run `make deps`)")
    for plugin in CNI_PLUGINS:
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            raise NodeError(f"the CNI plugin {CNI_BIN_DIR / plugin} is missing (run `make deps`: "
                            "containernetworking-plugins)")
    plane_bin, controllers_bin = bin_dirs
    for directory, name in ((plane_bin, "kubelet"), (plane_bin, "kube-proxy"),
                            (controllers_bin, "containerd"), (controllers_bin, "containerd-shim-runc-v2"),
                            (controllers_bin, "ctr")):
        if not os.access(directory / name, os.X_OK):
            raise NodeError(f"{name} not found in {directory}: run `make controlplane controllers`")


def port_in_use(port: int) -> bool:
    """Something listens on PORT (any address). A connection of the last node's that is closing
    (TIME_WAIT, for a minute after a client probed the kubelet) does not count: the kubelet binds
    with SO_REUSEADDR, as Go's servers do, so neither does this check refuse for it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def check_ports() -> None:
    """The kubelet's ports are free. Asked with the host's node slot held: before it, a port in
    use is most likely the node of another cluster, which a test waits for and a person is told
    about by `host_lock`."""
    for port in (KUBELET_PORT,):
        if port_in_use(port):
            raise NodeError(f"port {port} (the kubelet's) is in use on this host: is another kubelet "
                            "running?")


def host_lock(*, wait: float) -> int:
    """Take the host's one node slot, waiting at most WAIT seconds (0: refuse at once); returns
    the locked descriptor. The kubelet and kube-proxy inherit it (not containerd, whose shims
    outlive it), so the slot stays taken while they live, also after the process that started
    them has gone (`toolkit cluster up`), and is free again once both are dead, however they died."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise NodeError(f"a node of the local cluster is already running on this host ({LOCK_FILE} is "
                                "held): run `toolkit cluster down` first") from None
            time.sleep(0.5)


# -- the host record and the sweep ------------------------------------------------------


def _read_record() -> dict[str, Any]:
    try:
        return dict(json.loads(HOST_RECORD.read_text()))
    except FileNotFoundError:
        return {}


def _write_record(record: dict[str, Any]) -> None:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    tmp = HOST_RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(HOST_RECORD)


def record_group(name: str, group: procs.Group) -> None:
    """Add a started process group to the host record, for the sweep to kill (a node component,
    or a service of the cluster the node runs beside, such as its registry)."""
    record = _read_record()
    record.setdefault("groups", {})[name] = group.pgid
    record.setdefault("group_ids", {})[name] = group.id
    _write_record(record)


def _run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return proc


def _shim_pids() -> list[int]:
    """The node's containerd shims: each runs in a session of its own (it outlives containerd),
    and names the node's containerd socket on its command line."""
    socket_path = str(RUN_DIR / "containerd.sock").encode()
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and socket_path in argv:
            pids.append(int(entry.name))
    return pids


def _cgroup_dirs() -> list[pathlib.Path]:
    """The node's cgroup root in each hierarchy (that exists or could)."""
    if cgroup_version() == 2:
        return [pathlib.Path("/sys/fs/cgroup") / CGROUP_ROOT]
    return [h / CGROUP_ROOT for h in _v1_hierarchies()]


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for root in _cgroup_dirs():
        if not root.is_dir():
            continue
        for listing in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in listing.read_text().split())
    return pids


def container_pids(pod_uid: str, container_id: str, proc: pathlib.Path = pathlib.Path("/proc")) -> list[int]:
    """The host processes of one container of a pod on this node: those whose cgroup is the
    container's own under the kubelet's `kubepods` in the node's cgroup root
    (`.../kubepods/[QOS/]pod<UID>/<CONTAINER ID>`, the cgroupfs driver's layout). CONTAINER_ID as
    the pod's status gives it (`containerd://<id>`) or bare."""
    cid = container_id.split("://", 1)[-1]
    pods, pod = f"/{CGROUP_ROOT}/kubepods/", f"/pod{pod_uid}/"
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            lines = (entry / "cgroup").read_text().splitlines()
        except OSError:
            continue  # gone meanwhile
        paths = {line.split(":", 2)[-1] for line in lines}
        if any(p.startswith(pods) and pod in p and p.endswith(f"/{cid}") for p in paths):
            found.append(int(entry.name))
    return sorted(found)


def _kill_cgroup_tree() -> None:
    """SIGKILL every process in the node's cgroups until none is left (a container's processes
    outlive a SIGKILLed shim: they are re-parented, not killed)."""
    deadline = time.monotonic() + 30
    while pids := _cgroup_pids():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NodeError(f"processes in the node's cgroups survive SIGKILL: {sorted(pids)[:10]}")
        time.sleep(0.1)


def _remove_cgroups() -> None:
    for root in _cgroup_dirs():
        if not root.is_dir():
            continue
        # Deepest first: a cgroup directory is removed with rmdir once it has no children.
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def _node_mounts() -> list[str]:
    """Mount points under the node's directories, deepest first."""
    prefixes = (str(RUN_DIR) + "/", str(VAR_DIR) + "/")
    points = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))


def _unmount_all() -> None:
    for _ in range(5):
        points = _node_mounts()
        if not points:
            return
        for point in points:
            _run("umount", "--lazy", point, check=False)
    raise NodeError(f"still mounted after 5 rounds of umount: {_node_mounts()[:5]}")


def _link_exists(name: str) -> bool:
    return _run("ip", "link", "show", name, check=False).returncode == 0


Ruleset = dict[str, dict[str, list[str]]]  # table -> chain -> its rules, in order


def iptables_state(family: str) -> Ruleset:
    """One family's rules as `<family>-save` prints them: table -> chain -> the text of each rule
    after `-A <chain> `. Empty when the family's tools are missing or fail (no IPv6, say)."""
    try:
        out = _run(f"{family}-save", check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    state: Ruleset = {}
    table: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("*"):
            table = state.setdefault(line[1:].strip(), {})
        elif line.startswith(":"):
            table.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            chain, _, rule = line[3:].partition(" ")
            table.setdefault(chain, []).append(rule)
    return state


def _target(rule: str) -> str:
    """The chain a rule jumps or goes to ('' for none)."""
    words = shlex.split(rule)
    for flag in ("-j", "--jump", "-g", "--goto"):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return ""


def _ours(chain: str) -> bool:
    return chain.startswith("KUBE-")


def restore_iptables(family: str, before: Ruleset) -> list[str]:
    """Put one family's KUBE- chains back as BEFORE had them; what was changed, one line each.

    Only what touches a KUBE- chain is ours (the kubelet's and kube-proxy's; podman's and the
    host's own chains and rules are never touched): a KUBE- chain made since is flushed and deleted
    once no rule jumps to it; a KUBE- chain that was there before gets its rules back (made again
    if it went); a rule jumping to a KUBE- chain, added to any other chain since, is deleted."""
    now = iptables_state(family)
    changed: list[str] = []

    def run(table: str, *args: str) -> None:
        _run(family, "-w", "-t", table, *args, check=False)

    for table, chains in now.items():
        old = before.get(table, {})
        made = [c for c in chains if _ours(c) and c not in old]
        for chain, rules in old.items():
            if _ours(chain) and chain not in chains:
                run(table, "-N", chain)
        for chain, rules in chains.items():
            if chain in made:
                continue
            if _ours(chain) and chain in old:
                if rules != old[chain]:
                    changed.append(f"{family} {table}/{chain} put back")
                    run(table, "-F", chain)
                    for rule in old[chain]:
                        run(table, "-A", chain, *shlex.split(rule))
                continue
            kept = list(old.get(chain, []))
            for rule in rules:
                if rule in kept:
                    kept.remove(rule)
                elif _ours(_target(rule)):
                    run(table, "-D", chain, *shlex.split(rule))
        for chain, rules in old.items():
            if _ours(chain) and chain not in chains:
                changed.append(f"{family} {table}/{chain} made again")
                for rule in rules:
                    run(table, "-A", chain, *shlex.split(rule))
        for chain in made:
            run(table, "-F", chain)
        for chain in made:
            run(table, "-X", chain)
        if made:
            changed.append(f"{len(made)} KUBE- chains in {family} {table}")
    return changed


def _address_present() -> bool:
    out = _run("ip", "-4", "-o", "addr", "show", "dev", "lo").stdout
    return f" {NODE_IP}/" in out


def record_owner() -> str | None:
    """The cluster (its workdir) whose node the host record describes; None with no record."""
    owner = _read_record().get("owner")
    return str(owner) if owner is not None else None


def sweep() -> list[str]:
    """Undo everything the record says a node did to this host; what was found, one line each.

    Idempotent. With no record nothing is touched: what no record claims is not known to be ours.
    Each destructive step checks what it removes is the node's: a process group only while it is
    the one recorded (devcluster/procs.py), shims that name the node's socket, processes in the
    node's cgroups, mounts under the node's directories, the bridge and the node address only if
    the record says they were made, iptables only what touches KUBE- chains and differs from the
    record's rules. Callers hold `host_lock`.
    """
    record = _read_record()
    if not record:
        return []
    found: list[str] = []
    identities = record.get("group_ids") or {}
    for name, pgid in sorted((record.get("groups") or {}).items()):
        recorded = identities.get(name)
        if recorded and procs.signal_group(int(pgid), str(recorded), signal.SIGKILL):
            found.append(f"process group {pgid} ({name})")
    shims = _shim_pids()
    if shims:
        found.append(f"{len(shims)} containerd shims")
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if _cgroup_pids():
        found.append("processes in the node's cgroups")
        _kill_cgroup_tree()
    if _node_mounts():
        found.append(f"{len(_node_mounts())} mounts under {RUN_DIR} and {VAR_DIR}")
        _unmount_all()
    if record.get("bridge_made", True) and _link_exists(BRIDGE):
        found.append(f"the bridge {BRIDGE}")
        _run("ip", "link", "delete", BRIDGE, check=False)
    for family, before in sorted((record.get("iptables") or {}).items()):
        found += restore_iptables(family, before)
    if record.get("address_added") and _address_present():
        found.append(f"the node address {NODE_IP} on lo")
        _run("ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo", check=False)
    if any(d.is_dir() for d in _cgroup_dirs()):
        found.append(f"cgroups under {CGROUP_ROOT}")
        _remove_cgroups()
    for key, value in sorted((record.get("sysctls") or {}).items()):
        path = pathlib.Path("/proc/sys") / key
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                found.append(f"sysctl {key.replace('/', '.')}")
                path.write_text(value)
    # The record is ours (on our RUN_DIR, written before VAR_DIR was made), so VAR_DIR is ours too.
    shutil.rmtree(VAR_DIR, ignore_errors=True)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    return found


def foreign_node() -> str | None:
    """A kubelet or kube-proxy running on this host that is not ours, as `<name> (pid N)`, or None.
    Asked with the host's node slot held: while it is held by us no node of ours runs, so any
    such process is another Kubernetes node's (the host is one), whose networking the local
    cluster's own kube-proxy and kubelet would rewrite."""
    for entry in sorted(pathlib.Path("/proc").iterdir(), key=lambda e: e.name):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            comm = (entry / "comm").read_text().strip()
            if comm in NODE_PROCESSES and (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                return f"{comm} (pid {entry.name})"
    return None


def prepare_host(*, owner: str) -> None:
    """Record, then make, the host changes the control plane needs before it starts: the node
    address on lo (the apiserver binds to it). The record also holds what the node will change
    (the sysctls, both iptables families) as they are now, and OWNER (the cluster's workdir).
    Refuses, touching nothing, a host whose node directory or bridge name is not ours. Callers
    hold `host_lock` and have swept."""
    if VAR_DIR.exists() and not (VAR_DIR / VAR_MARKER).exists():
        raise NodeError(f"{VAR_DIR} exists and is not this project's node directory (no {VAR_MARKER} in it): "
                        "move it away first")
    if _link_exists(BRIDGE):
        raise NodeError(f"a network link named {BRIDGE} exists and is not the local cluster's: delete it first")
    sysctls = {}
    for key in HOST_SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[key] = (pathlib.Path("/proc/sys") / key).read_text().strip()
    record = {"owner": owner, "sysctls": sysctls, "address_added": not _address_present(), "bridge_made": True,
              "iptables": {family: iptables_state(family) for family in IPTABLES_FAMILIES},
              "groups": {}, "group_ids": {}}
    _write_record(record)
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    (VAR_DIR / VAR_MARKER).touch()
    if record["address_added"]:
        _run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")


# -- the node ----------------------------------------------------------------------------


class Node:
    """containerd, the kubelet and kube-proxy for PLANE (started with `node_ip=NODE_IP`), and the
    cluster's registry (devcluster/registry.py) when one is given: started before containerd,
    which pulls from it by its name, and stopped after it."""

    def __init__(self, plane: harness.ControlPlane, *, plane_bin: pathlib.Path, controllers_bin: pathlib.Path,
                 images: tuple[str, ...], cache: pathlib.Path, lock_fd: int, registry: Any = None) -> None:
        self.plane = plane
        self.registry = registry
        self.lock_fd = lock_fd
        self.plane_bin = plane_bin
        self.controllers_bin = controllers_bin
        self.images = images
        self.containerd_root = cache / "containerd-root"
        self.containerd_state = RUN_DIR / "containerd"
        self.socket = RUN_DIR / "containerd.sock"
        self.kubelet_root = VAR_DIR / "kubelet"
        self.pod_logs = VAR_DIR / "pod-logs"
        self.config_dir = RUN_DIR / "config"
        self._procs: dict[str, harness._Process] = {}
        self.started: list[tuple[str, procs.Group]] = []

    # -- lifecycle -------------------------------------------------------

    def start(self) -> Node:
        try:
            self._configure()
            if self.registry is not None:
                self.registry.start()
                self._adopt("registry", self.registry.process)
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            self._start_kube_proxy()
            self._wait_ready()
        except BaseException:
            self.stop(pods=False)
            raise
        return self

    def stop(self, *, pods: bool = True) -> list[str]:
        """Delete every pod (so the kubelet tears down each sandbox), stop the processes, sweep.
        Returns what the sweep had to remove beyond the graceful stop."""
        if pods and "kubelet" in self._procs:
            with contextlib.suppress(Exception):
                self._delete_all_pods()
        for name in ("kube-proxy", "kubelet", "containerd", "registry"):
            if name in self._procs:
                self._procs[name].stop()
        try:
            return sweep()
        finally:
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1

    def check_alive(self) -> None:
        for proc in self._procs.values():
            proc.check_alive()

    def pids(self) -> dict[str, int]:
        """Each running component's process (containerd, the kubelet, kube-proxy, the registry)."""
        return {name: p.popen.pid for name, p in self._procs.items() if p.popen is not None}

    def restart(self, name: str) -> None:
        """Stop one component (kubelet, kube-proxy) and start it again with the same command line.
        Running pods keep running; a restarted kubelet finds them again, its in-memory state
        (the ServiceAccount tokens it got for them, among it) starting empty."""
        proc = self._procs[name]
        proc.stop()
        proc.start()
        self._record_group(name, proc)

    def logs(self, *, lines: int = 60) -> str:
        return "\n".join(f"---- {name} ({p.log_path})\n{p.tail(lines)}" for name, p in self._procs.items())

    def kill_container(self, container_id: str, sig: str = "SIGKILL") -> bool:
        """Send SIG to a container's task through containerd (the id a pod's status names after
        `containerd://`), as the runtime does when a container is killed; the kubelet sees it end.
        False when its task had already ended (the container exited, or was restarted, after the
        status that named it was read)."""
        done = self._ctr("tasks", "kill", "--signal", sig, container_id, check=False, timeout=30.0)
        if done.returncode != 0:
            if "no running task found" in done.stderr:
                return False
            raise NodeError(f"ctr tasks kill {container_id}: {done.stderr.strip() or done.stdout.strip()}")
        return True

    # -- pieces ------------------------------------------------------------

    def _record_group(self, name: str, proc: harness._Process) -> None:
        assert proc.group is not None
        self.started.append((name, proc.group))
        record_group(name, proc.group)

    def _adopt(self, name: str, proc: harness._Process) -> None:
        """A process started elsewhere (the registry), stopped, checked and swept with the node's."""
        self._procs[name] = proc
        self._record_group(name, proc)

    def _run_process(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> harness._Process:
        holds_lock = name in ("kubelet", "kube-proxy")
        proc = node_process(name, argv, pathlib.Path(self.plane.log_dir), env=env,
                            lock_fd=self.lock_fd if holds_lock else -1)
        self._procs[name] = proc
        proc.start()
        self._record_group(name, proc)
        return proc

    def _configure(self) -> None:
        for directory in (self.config_dir, self.containerd_state, self.kubelet_root, self.pod_logs,
                          self.containerd_root):
            directory.mkdir(parents=True, exist_ok=True)
        self._make_cgroup_root()
        cni_dir = self.config_dir / "cni"
        cni_dir.mkdir(exist_ok=True)
        (cni_dir / "10-dispatch.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                # No ipMasq: pods talk to the node's own addresses only, so no NAT rule is needed.
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(RUN_DIR / "cni-leases")}},
                {"type": "loopback"},
            ],
        }, indent=1))
        (self.config_dir / "registry-hosts").mkdir(mode=0o700, exist_ok=True)
        if self.registry is not None:
            self.registry.containerd_hosts(self.config_dir / "registry-hosts")
        (self.config_dir / "containerd.toml").write_text(self._containerd_config(cni_dir))

    def _make_cgroup_root(self) -> None:
        if cgroup_version() == 2:
            root = pathlib.Path("/sys/fs/cgroup") / CGROUP_ROOT
            root.mkdir(exist_ok=True)
            return
        for directory in _cgroup_dirs():
            directory.mkdir(exist_ok=True)
            if "cpuset" in directory.parent.name.split(","):
                # A new v1 cpuset starts empty and takes no task until it has CPUs and memory nodes.
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (directory / f).read_text().strip():
                        (directory / f).write_text((directory.parent / f).read_text())

    def _containerd_config(self, cni_dir: pathlib.Path) -> str:
        # Registry hosts from our own directory only (one hosts.toml per registry name); without a
        # registry, an empty directory: nothing is pulled, every image is imported.
        hosts_dir = self.config_dir / "registry-hosts"
        return f"""version = 3
root = '{self.containerd_root}'
state = '{self.containerd_state}'
imports = []

[grpc]
  address = '{self.socket}'

[ttrpc]
  address = '{self.socket}.ttrpc'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{hosts_dir}'

  [plugins.'io.containerd.cri.v1.runtime']
    # Some hosts (this project's CI VMs among them) withhold CAP_SYS_RESOURCE: runc cannot then
    # lower a sandbox's oom_score_adj below the runtime's own, and every sandbox would fail.
    restrict_oom_score_adj = true
    # The pods' network namespaces under our state dir, so a sweep finds every one of them.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{CNI_BIN_DIR}']
      conf_dir = '{cni_dir}'
"""

    def _start_containerd(self) -> None:
        env = {"PATH": f"{self.controllers_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
        self._run_process("containerd", [str(self.controllers_bin / "containerd"),
                                         f"--config={self.config_dir / 'containerd.toml'}", "--log-level=warn"],
                          env=env)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while self._ctr("version", check=False).returncode != 0:
            self._procs["containerd"].check_alive()
            if time.monotonic() > deadline:
                raise NodeError(f"containerd did not answer on {self.socket}\n{self._procs['containerd'].tail()}")
            time.sleep(0.1)

    def _ctr(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return _run(str(self.controllers_bin / "ctr"), f"--address={self.socket}", "--namespace=k8s.io", *args,
                    check=check, timeout=timeout)

    def _import_images(self) -> None:
        """Each image from podman into containerd, unless the same podman image was imported last."""
        stamps_file = self.containerd_root / "dispatch-imported.json"
        try:
            stamps = dict(json.loads(stamps_file.read_text()))
        except (FileNotFoundError, ValueError):
            stamps = {}
        have = set(self._ctr("images", "list", "--quiet").stdout.split())
        for image in (PAUSE_IMAGE, *self.images):
            inspect = _run("podman", "image", "inspect", "--format", "{{.Id}}", image, check=False)
            if inspect.returncode != 0:
                raise NodeError(f"image {image} is not in podman's store: run `make images`")
            image_id = inspect.stdout.strip()
            if stamps.get(image) == image_id and image in have:
                continue
            archive = RUN_DIR / "image.tar"
            _run("podman", "save", "--format", "docker-archive", "--output", str(archive), image, timeout=300)
            self._ctr("images", "import", "--no-unpack=false", str(archive), check=False)
            archive.unlink()
            if image not in set(self._ctr("images", "list", "--quiet").stdout.split()):
                raise NodeError(f"containerd did not take the image {image}")
            stamps[image] = image_id
            tmp = stamps_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(stamps, indent=1, sort_keys=True))
            tmp.replace(stamps_file)

    def _start_kubelet(self) -> None:
        pki_dir = pathlib.Path(self.plane.workdir) / "pki"
        client = self.plane.issue("kubelet-client", subject=f"/O=system:nodes/CN=system:node:{NODE_NAME}")
        serving = self.plane.issue("kubelet-serving", subject=f"/CN={NODE_NAME}", server=True,
                                   sans=(f"IP:{NODE_IP}", f"DNS:{NODE_NAME}"))
        kubeconfig = self.config_dir / "kubelet.kubeconfig"
        harness._write_kubeconfig(kubeconfig, server=self.plane.server, ca_file=self.plane.ca_file,
                                  user={"client-certificate": client[0], "client-key": client[1]})
        v1 = cgroup_version() == 1
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host kind has cgroup v1 only; the kubelet refuses v1 since 1.35 unless told.
            "failCgroupV1": not v1,
            "cgroupDriver": "cgroupfs",  # no systemd here
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.pod_logs),
            "address": NODE_IP,
            "port": KUBELET_PORT,
            "healthzPort": 0,  # no unauthenticated health port (nothing here asks it)
            "readOnlyPort": 0,
            "tlsCertFile": serving[0],
            "tlsPrivateKeyFile": serving[1],
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki_dir / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "failSwapOn": False,
            # A shared development host's disk and memory are not the node's to police: evict only
            # when nearly nothing is left, and never collect the images we imported.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # The cluster's DNS (devcluster/dns.py): pods resolve Services by name.
            "clusterDNS": [CLUSTER_DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "",
            "registerNode": True,
            "syncFrequency": "10s",
            "fileCheckFrequency": "20s",
            "nodeStatusUpdateFrequency": "5s",
            "serializeImagePulls": False,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
        }
        config_path = self.config_dir / "kubelet.yaml"
        config_path.write_text(yaml.safe_dump(config))
        self._run_process("kubelet", [
            str(self.plane_bin / "kubelet"),
            f"--config={config_path}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            f"--root-dir={self.kubelet_root}",
            "--v=1",
        ], env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})

    def _start_kube_proxy(self) -> None:
        """kube-proxy in iptables mode: the kubernetes Service's ClusterIP reaches the apiserver."""
        cert = self.plane.issue("kube-proxy", subject="/CN=system:kube-proxy")
        kubeconfig = self.config_dir / "kube-proxy.kubeconfig"
        harness._write_kubeconfig(kubeconfig, server=self.plane.server, ca_file=self.plane.ca_file,
                                  user={"client-certificate": cert[0], "client-key": cert[1]})
        self._run_process("kube-proxy", [
            str(self.plane_bin / "kube-proxy"),
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={POD_CIDR}",
            # A pod reaching a Service whose endpoint is a pod on the same bridge (CoreDNS, any
            # Deployment) gets its reply through the node, whatever the host's br_netfilter settings.
            "--masquerade-all",
            # No health server (a port any local user could read); the metrics server cannot be turned
            # off (its address must be IP:port) nor authenticated: loopback, read-only counters.
            f"--metrics-bind-address=127.0.0.1:{harness.free_port()}", "--healthz-port=0",
            # Leave the host's conntrack table sizes and timeouts as they are.
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-timeout-close-wait=0s",
            # No NodePorts on 127.0.0.1 (that would set net.ipv4.conf.all.route_localnet).
            "--iptables-localhost-nodeports=false",
            "--v=1",
        ], env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        with self.plane.api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            while True:
                self.check_alive()
                try:
                    node = core.read_node(NODE_NAME)
                    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
                    untainted = not any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
                    if ready and untainted:
                        return
                except kubernetes.client.ApiException as e:
                    if e.status != 404:
                        raise
                if time.monotonic() > deadline:
                    raise NodeError(f"node {NODE_NAME} not Ready and untainted after {READY_TIMEOUT_SECONDS}s\n"
                                    f"{self.logs()}")
                time.sleep(0.2)

    def _delete_all_pods(self) -> None:
        delete_pods(self.plane.kubeconfig, timeout=STOP_PODS_SECONDS)


def node_process(name: str, argv: list[str], log_dir: pathlib.Path, *, env: dict[str, str] | None,
                 lock_fd: int) -> harness._Process:
    """A node component: the harness's process (own group, own log), with an environment of its own
    and the host's node lock, which it holds while it lives."""
    return harness._Process(name, argv, log_dir, env=env, pass_fds=(lock_fd,) if lock_fd >= 0 else ())


def delete_pods(kubeconfig: str, *, timeout: float) -> None:
    """Delete every pod and wait (at most TIMEOUT) until the kubelet has torn each one down: it
    removes the object last, after the containers, the volumes and the sandbox. The workloads that
    would make their pods again (Deployments, then ReplicaSets, StatefulSets, DaemonSets, Jobs; the
    kube-controller-manager still runs) go first, their pods orphaned and deleted here with the
    rest. Best effort: an unreachable apiserver leaves the rest to the sweep."""
    try:
        with kubernetes.config.new_client_from_config(config_file=kubeconfig) as api:
            core = kubernetes.client.CoreV1Api(api)
            apps, batch = kubernetes.client.AppsV1Api(api), kubernetes.client.BatchV1Api(api)
            for listed, delete in ((apps.list_deployment_for_all_namespaces, apps.delete_namespaced_deployment),
                                   (apps.list_replica_set_for_all_namespaces, apps.delete_namespaced_replica_set),
                                   (apps.list_stateful_set_for_all_namespaces, apps.delete_namespaced_stateful_set),
                                   (apps.list_daemon_set_for_all_namespaces, apps.delete_namespaced_daemon_set),
                                   (batch.list_job_for_all_namespaces, batch.delete_namespaced_job)):
                for obj in listed(_request_timeout=10).items:
                    with contextlib.suppress(kubernetes.client.ApiException):
                        delete(obj.metadata.name, obj.metadata.namespace, propagation_policy="Orphan")
            for pod in core.list_pod_for_all_namespaces(_request_timeout=10).items:
                with contextlib.suppress(kubernetes.client.ApiException):
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=1)
            deadline = time.monotonic() + timeout
            while core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE_NAME}",
                                                   _request_timeout=10).items:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.2)
    except Exception:  # noqa: BLE001 - deliberately broad: whatever failed here, the sweep follows
        return


def _kube_rules(family: str) -> list[str]:
    """`<table> <chain>: <rule>` for every rule in or jumping to a KUBE- chain, and `<table> <chain>`
    for every KUBE- chain, of one family."""
    found = []
    for table, chains in iptables_state(family).items():
        for chain, rules in chains.items():
            if _ours(chain):
                found.append(f"{table} {chain}")
            found += [f"{table} {chain}: {rule}" for rule in rules if _ours(chain) or _ours(_target(rule))]
    return sorted(found)


def host_snapshot() -> dict[str, Any]:
    """What a node may leave on the host, to compare before and after: the node's mounts, its
    cgroups, the bridge, the node address, KUBE- chains and the rules in or to them (both
    families), the sysctls the kubelet and the CNI bridge write, the node's processes."""
    sysctls = {}
    for key in HOST_SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[key] = (pathlib.Path("/proc/sys") / key).read_text().strip()
    return {
        "mounts": _node_mounts(),
        "cgroups": sorted(str(d) for d in _cgroup_dirs() if d.is_dir()),
        "cgroup_pids": sorted(_cgroup_pids()),
        "shims": _shim_pids(),
        "bridge": _link_exists(BRIDGE),
        "node_address": _address_present(),
        **{f"{family}_kube": _kube_rules(family) for family in IPTABLES_FAMILIES},
        "sysctls": sysctls,
        "netns": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
        "dirs": [str(d) for d in (RUN_DIR, VAR_DIR) if d.exists()],
    }
