"""The local cluster for a person: `toolkit cluster up|down|status`.

`up` starts the control plane, the real controllers (Trainer, JobSet, Kueue with its TrainJob
integration), the cluster's registry (devcluster/registry.py), one real node (devcluster/node.py:
the kubelet and kube-proxy of the same release, containerd, runc) and CoreDNS on it
(devcluster/dns.py) in the background, then installs our release as a user installs it
(devcluster/install.py: its images pushed to the registry, `<state>/release/controller.yaml`
applied server-side), so that our controller runs as the Deployment's pods on the node; it writes
the admin kubeconfig and records every process group with its leader's identity
(devcluster/procs.py) in `<state>/pids.json`. `down` deletes the pods (so the kubelet tears each
one down), stops those groups that are still the ones recorded and sweeps the host clean if the
node it records is this cluster's; `status` says whether the recorded processes live, and lists
our controller's pods.

`start` is the one way a cluster comes up, for `up`, `make demo` and the e2e tests alike: the
host's node slot (one node per host), the refusal of a host that runs a kubelet or kube-proxy of
its own, a sweep of anything an earlier node left (a crash, a SIGKILL), the node address, the
control plane, the controllers on it, then the registry and the node, then the cluster's DNS, then
(given a release directory) our release and its Ready leader; if any step fails, what it started
is stopped and the host swept before the error goes on.

Invariants: at most one cluster per state directory (a second `up` is refused while a process
recorded in `pids.json` lives; with all of them dead it is a crashed cluster, cleaned up first)
and one node per host (devcluster/node.py's lock); a state directory is removed only if it holds
`STATE_MARKER` (written by `up`), a non-empty one without it is refused; `down` with no cluster
of ours touches nothing on the host; `pids.json` is written only after every component is ready,
and a failed `up` stops what it started; every refusal is one line naming its cause (not root,
no memory cgroup, a node port in use, a kubelet or kube-proxy not ours, podman or a binary
missing, the cache or state directory not writable or not ours, a cluster already up).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

from devcluster import controller_pods, dns, harness, install as install_mod, node as node_mod, procs
from devcluster import registry as registry_mod, stack as stack_mod

# The images the local cluster's pods use, moved from podman's store into the node's containerd.
# The sidecar the local cluster's runtimes name (render.runtime's sidecar_image): this checkout's build.
SIDECAR_IMAGE = "localhost/dispatch/sidecar:dev"
NODE_IMAGES = (
    "localhost/dispatch-base/busybox:1.35-static",
    SIDECAR_IMAGE,
    "localhost/dispatch/sample-trainer:busybox",
    "localhost/dispatch/sample-trainer:python",
)
# How long a test's cluster waits for the host's one node slot (another suite's node) before it fails
# (DISPATCH_NODE_WAIT_SECONDS, for a host where several suites queue for it).
NODE_WAIT_SECONDS = float(os.environ.get("DISPATCH_NODE_WAIT_SECONDS", "900"))
KUBECTL = "kubectl"  # built by build-controlplane.sh beside the control plane, from the same release
# Written into a state dir by `up`: `up` and `down` remove only a state dir that holds it.
STATE_MARKER = ".dispatch-cluster-state"


class ClusterError(Exception):
    """A one-line reason the local cluster cannot be started or stopped."""


def state_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DISPATCH_CLUSTER_STATE", str(harness.STATE_DIR))).absolute()


def cache_dir() -> pathlib.Path:
    default = pathlib.Path(os.environ.get("XDG_CACHE_HOME", str(pathlib.Path.home() / ".cache"))) / "dispatch-k8s"
    return pathlib.Path(os.environ.get("DISPATCH_K8S_CACHE", str(default)))


def _writable(path: pathlib.Path, what: str) -> None:
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ClusterError(f"{what} {path} is not writable ({probe} is not a writable directory)")


def preflight() -> None:
    """The causes a newcomer meets first, each as one line, before anything starts."""
    if os.geteuid() != 0:
        raise ClusterError("the local cluster runs a real node, which needs root: run as root")
    for tool in ("podman", "go", "openssl"):
        if shutil.which(tool) is None:
            raise ClusterError(f"{tool} is not installed (run `make deps`)")
    _writable(cache_dir(), "cache dir")
    _writable(state_dir(), "state dir")


@dataclasses.dataclass(frozen=True)
class Status:
    up: bool
    kubeconfig: pathlib.Path
    alive: list[str]
    dead: list[str]
    pods: list[str] = dataclasses.field(default_factory=list)  # our controller's pods (install.controller_pods)


def kubectl() -> pathlib.Path:
    """The kubectl built beside the control plane (build-controlplane.sh, a no-op when cached;
    KUBEBUILDER_ASSETS wins): the one whose kustomize renders the release (`make release`, the tests)."""
    return harness.binary(KUBECTL, harness.build_binaries())


def kustomize() -> pathlib.Path:
    """The kustomize built from its module (build-controllers.sh tools, a no-op when cached): the one
    that renders the release's manifests (`make release`, the local cluster's install, the tests)."""
    return stack_mod.build_binaries("tools") / "kustomize"


def helm() -> pathlib.Path:
    """The helm built from its module (build-controllers.sh tools, a no-op when cached)."""
    return stack_mod.build_binaries("tools") / "helm"


def services_bin() -> pathlib.Path:
    """Run build-controllers.sh for the cluster's services (CoreDNS, the registry); their bin dir."""
    return stack_mod.build_binaries("services")


def start(*, kueue: bool = True, training: bool = True, kwok: bool = False, plane_bin: pathlib.Path | None = None, controllers: pathlib.Path | None = None,
          workdir: pathlib.Path | None = None, detach: bool = False, wait_for_node: bool = True,
          images: tuple[str, ...] = NODE_IMAGES, registry_name: str = registry_mod.DEFAULT_NAME,
          release_dir: pathlib.Path | None = None, release_controller: bool = True) -> stack_mod.Stack:
    """Start the control plane, the controllers on it (Trainer and JobSet unless not TRAINING;
    Kueue too if KUEUE), the registry (named REGISTRY_NAME in image references), the
    real node, and CoreDNS on it; return the Stack (its `plane` and `node` attributes are the
    other two; `node.registry` is the registry). The caller stops the Stack (which stops the node
    and the registry), then the plane.

    KWOK: kwok runs too, for the simulated nodes a bench adds beside the real one
    (`Stack.add_node`: tainted, so that only what tolerates them lands there).

    WAIT_FOR_NODE: wait while another cluster's node holds this host (tests), else refuse at once.
    RELEASE_DIR: install our release as a user does (devcluster/install.py: the bundle written
    there, its images pushed to the registry, controller.yaml applied), so that our controller runs
    as the Deployment's pods; `running.installed` is what was installed, `running.ours` acts on it
    (devcluster/controller_pods.py). Without it nothing of ours runs: a cluster as a platform
    engineer has it before installing.
    RELEASE_CONTROLLER=False: the release's images pushed and its bundle rendered, controller.yaml
    not applied (a cluster without Kueue cannot take it).
    On any failure, stops what it started and sweeps the host, then re-raises."""
    registry_mod.check_name(registry_name)
    plane_bin = plane_bin or harness.build_binaries()
    controllers = controllers or stack_mod.build_binaries()
    services = services_bin()
    if release_dir is not None and not wait_for_node:
        os.close(node_mod.host_lock(wait=0))  # refused at once, not after a build of the images
    prepared = install_mod.prepare(release_dir) if release_dir is not None else None
    # The slot first: another cluster's kubelet holds the node's ports until it is done with them.
    lock = node_mod.host_lock(wait=NODE_WAIT_SECONDS if wait_for_node else 0)
    try:
        node_mod.preflight(bin_dirs=(plane_bin, controllers))
    except BaseException:
        os.close(lock)
        raise
    try:
        other = node_mod.foreign_node()
        if other is not None:
            raise node_mod.NodeError(f"this host runs a {other} that is not the local cluster's: the local "
                                     "cluster's node would rewrite its networking; run it on another host")
        node_mod.check_ports()
    except node_mod.NodeError:
        os.close(lock)
        raise
    plane = harness.ControlPlane(bin_dir=plane_bin, workdir=workdir, detach=detach, node_ip=node_mod.NODE_IP)
    running: stack_mod.Stack | None = None
    node: node_mod.Node | None = None
    try:
        swept = node_mod.sweep()
        node_mod.prepare_host(owner=owner(plane.workdir))
        plane.start()
        running = stack_mod.Stack(plane, kueue=kueue, kwok=kwok, training=training, bin_dir=controllers).start()
        registry = registry_mod.Registry(plane, bin_dir=services, name=registry_name)
        node = node_mod.Node(plane, plane_bin=plane_bin, controllers_bin=controllers, images=images,
                             cache=cache_dir(), lock_fd=lock, registry=registry)
        running.node = node.start()
        dns.install(plane, registry, bin_dir=services)
        if release_dir is not None:
            assert prepared is not None
            installed = install_mod.install(running, prepared, out_dir=release_dir, controller=release_controller)
            if release_controller:
                running.ours = controller_pods.ControllerPods(running)  # its logs kept from the first line
                installed = dataclasses.replace(installed, leader=install_mod.wait_leading(running))
            running.installed = installed
        running.swept = swept
        return running
    except BaseException:
        if running is not None:
            running.stop()
        if node is None:
            node_mod.sweep()
            os.close(lock)
        plane.stop()
        raise


def owner(workdir: pathlib.Path) -> str:
    """How the host record names the cluster whose node it describes: its workdir, resolved."""
    return str(pathlib.Path(workdir).resolve())


def _ours(state: pathlib.Path) -> bool:
    return (state / STATE_MARKER).is_file()


def _groups(state: pathlib.Path) -> dict[str, tuple[int, str]]:
    """The recorded process groups: name -> (process group id, its leader's identity)."""
    try:
        recorded = json.loads((state / "pids.json").read_text())
    except FileNotFoundError:
        return {}
    return {name: (int(g["pgid"]), str(g["id"])) for name, g in recorded.items()}


@dataclasses.dataclass(frozen=True)
class Up:
    kubeconfig: pathlib.Path
    swept: list[str]  # what an earlier cluster had left on the host (a crash), removed first
    registry: registry_mod.Registry  # the cluster's registry, to push to (`Registry.open(state)` later)
    release: pathlib.Path  # the release bundle installed (its controller.yaml applied)
    leader: str  # the controller pod that holds the Lease


def up(*, registry_name: str = registry_mod.DEFAULT_NAME) -> Up:
    """Start everything in the background; return the kubeconfig path and what was swept first.

    A state dir whose recorded processes are all gone is an earlier cluster that crashed (or was
    killed): it is removed, and `start` sweeps what that cluster left on the host. A state dir that
    is not empty and has no `STATE_MARKER` is not ours: refused, untouched.
    `<state>/bin/kubectl` links to the kubectl built with the control plane."""
    preflight()
    state = state_dir()
    if state.exists() and any(state.iterdir()) and not _ours(state):
        raise ClusterError(f"{state} is not empty and is not a local cluster's state dir (no {STATE_MARKER} in "
                           "it): set DISPATCH_CLUSTER_STATE to a new directory")
    if status().alive:
        raise ClusterError(f"a cluster is already up (KUBECONFIG={state / 'admin.kubeconfig'}); "
                           "run `toolkit cluster down` first")
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True, mode=0o700)  # keys and kubeconfigs: root's alone
    (state / STATE_MARKER).write_text("a state dir of `toolkit cluster up`, removed by `toolkit cluster down`\n")
    try:
        plane_bin = harness.build_binaries()
        controllers = stack_mod.build_binaries()
        running = start(plane_bin=plane_bin, controllers=controllers, workdir=state, detach=True,
                        wait_for_node=False, registry_name=registry_name, release_dir=state / "release")
    except (harness.HarnessError, OSError, RuntimeError) as e:
        shutil.rmtree(state, ignore_errors=True)
        raise ClusterError(str(e).splitlines()[0]) from None
    (state / "bin").mkdir(exist_ok=True)
    (state / "bin" / KUBECTL).symlink_to(harness.binary(KUBECTL, running.plane.bin_dir))
    assert running.node is not None
    recorded = {**running.plane.groups(), **dict(running.started), **dict(running.node.started)}
    groups = {name: group._asdict() for name, group in recorded.items()}
    tmp = state / "pids.json.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(state / "pids.json")
    return Up(kubeconfig=pathlib.Path(running.plane.kubeconfig), swept=list(running.swept),
              registry=running.node.registry, release=state / "release", leader=running.installed.leader)


def status() -> Status:
    state = state_dir()
    groups = _groups(state) if _ours(state) else {}
    if not groups:
        return Status(up=False, kubeconfig=state / "admin.kubeconfig", alive=[], dead=[])
    alive = sorted(name for name, (pgid, recorded) in groups.items() if procs.is_ours(pgid, recorded))
    dead = sorted(name for name in groups if name not in alive)
    kubeconfig = state / "admin.kubeconfig"
    pods: list[str] = []
    if "kube-apiserver" in alive:
        import kubernetes.client
        import kubernetes.config

        try:
            with kubernetes.config.new_client_from_config(config_file=str(kubeconfig)) as api:
                pods = install_mod.controller_pods(api)
        except (kubernetes.client.ApiException, OSError, ValueError) as e:
            pods = [f"unreadable: {str(e).splitlines()[0]}"]
    return Status(up=True, kubeconfig=kubeconfig, alive=alive, dead=dead, pods=pods)


def down() -> bool:
    """Delete the pods, stop every recorded process group that is still the one recorded, sweep
    the host if the node it records is this cluster's, and remove the state; False if no cluster
    was up (then nothing is touched). A state dir that is not ours is refused, untouched."""
    state = state_dir()
    if not state.exists():
        return False
    if not _ours(state):
        raise ClusterError(f"{state} is not a local cluster's state dir (no {STATE_MARKER} in it): not touched")
    groups = _groups(state)
    if groups:
        kubeconfig = state / "admin.kubeconfig"
        if kubeconfig.exists() and status().alive:
            node_mod.delete_pods(str(kubeconfig), timeout=30.0)
        for pgid, recorded in reversed(list(groups.values())):
            procs.stop_group(pgid, recorded, grace=harness.STOP_GRACE_SECONDS)
    if os.geteuid() == 0:
        try:
            lock = node_mod.host_lock(wait=30)
        except node_mod.NodeError:
            # Another cluster's node took the slot once ours was dead: it swept the host before it
            # started (`start`), and its own state is not ours to sweep.
            lock = -1
        if lock >= 0:
            try:
                if node_mod.record_owner() == owner(state):
                    node_mod.sweep()
            finally:
                os.close(lock)
    shutil.rmtree(state, ignore_errors=True)
    return bool(groups)
