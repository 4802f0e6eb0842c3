"""The local cluster for a person: `toolkit cluster up|down|status`.

`up` starts the control plane and the real controllers (Trainer, JobSet,
Kueue with its TrainJob integration, kwok with two nodes, our admission-check
controller) and the pod runner (devcluster/podrunner.py: every Running pod's
containers run in podman) in the background, writes the admin kubeconfig and
records every process group in `<state>/pids.json`; `down` kills those groups and removes
the state; `status` says whether the recorded processes live.

`start` is the one way a cluster comes up, for `up`, `make demo` and the e2e
tests alike: the control plane, then the controllers on it, then the kwok
nodes; if any step fails, what it started is stopped before the error goes on.

Invariants: at most one cluster per state directory (a second `up` is refused
while `pids.json` exists); `pids.json` is written only after every component
is ready, and a failed `up` stops what it started; every refusal is one line
naming its cause (podman missing, the cache or state directory not writable,
a cluster already up).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

from devcluster import harness, stack as stack_mod

NODES = ("kwok-node-0", "kwok-node-1")
KUBECTL = "kubectl"  # built by build-controlplane.sh beside the control plane, from the same release


class ClusterError(Exception):
    """A one-line reason the local cluster cannot be started or stopped."""


def state_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DISPATCH_CLUSTER_STATE", str(harness.STATE_DIR)))


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


def start(plane: harness.ControlPlane, *, kueue: bool = True,
          controllers: pathlib.Path | None = None) -> stack_mod.Stack:
    """Start PLANE, the controllers on it (Kueue and ours too if KUEUE) and the NODES.

    On any failure, stops what it started (the stack, then the plane) and re-raises."""
    running: stack_mod.Stack | None = None
    try:
        plane.start()
        running = stack_mod.Stack(plane, kueue=kueue, bin_dir=controllers).start()
        with plane.api_client() as api:
            for node in NODES:
                running.add_node(api, node)
        return running
    except BaseException:
        if running is not None:
            running.stop()
        plane.stop()
        raise


def up() -> pathlib.Path:
    """Start everything in the background; return the kubeconfig path.

    `<state>/bin/kubectl` links to the kubectl built with the control plane."""
    preflight()
    state = state_dir()
    if (state / "pids.json").exists():
        raise ClusterError(f"a cluster is already up (KUBECONFIG={state / 'admin.kubeconfig'}); "
                           "run `toolkit cluster down` first")
    shutil.rmtree(state, ignore_errors=True)
    try:
        plane = harness.ControlPlane(workdir=state, detach=True)
        controllers = stack_mod.build_binaries()
    except harness.HarnessError as e:
        raise ClusterError(str(e).splitlines()[0]) from None
    try:
        running = start(plane, controllers=controllers)
    except (harness.HarnessError, OSError) as e:
        shutil.rmtree(state, ignore_errors=True)
        raise ClusterError(str(e).splitlines()[0]) from None
    try:
        running.start_pod_runner()  # a person's pods run for real; the demo and the tests run their own
    except (harness.HarnessError, OSError) as e:
        running.stop()
        plane.stop()
        shutil.rmtree(state, ignore_errors=True)
        raise ClusterError(str(e).splitlines()[0]) from None
    (state / "bin").mkdir(exist_ok=True)
    (state / "bin" / KUBECTL).symlink_to(harness.binary(KUBECTL, plane.bin_dir))
    groups = {**plane.pids(), **dict(running.started)}
    tmp = state / "pids.json.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(state / "pids.json")
    return pathlib.Path(plane.kubeconfig)


def status() -> Status:
    state = state_dir()
    pids_file = state / "pids.json"
    if not pids_file.exists():
        return Status(up=False, kubeconfig=state / "admin.kubeconfig", alive=[], dead=[])
    groups = json.loads(pids_file.read_text())
    alive = sorted(name for name, pgid in groups.items() if stack_mod.still_running([(name, pgid)]))
    dead = sorted(name for name in groups if name not in alive)
    return Status(up=True, kubeconfig=state / "admin.kubeconfig", alive=alive, dead=dead)


def down() -> bool:
    """Kill every recorded process group and remove the state; False if none was up."""
    state = state_dir()
    pids_file = state / "pids.json"
    was_up = pids_file.exists()
    if was_up:
        for pgid in reversed(list(json.loads(pids_file.read_text()).values())):
            harness._kill_group(pgid)
    shutil.rmtree(state, ignore_errors=True)
    return was_up
