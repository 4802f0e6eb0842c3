"""Our release installed on the local cluster as a user installs it.

`release_images(build, workdir)` (`make release-images`): this checkout's release images in local
storage as `localhost/dispatch/NAME:TAG`, each labelled with a hash of what it is built from
(INPUTS_LABEL), built only when no image of that tag carries the same hash; an image of another
tag (another commit's) built from the same files is given this build's labels instead, its
layers unchanged.

`prepare(D)`: release_images, before the cluster starts. `install(running, prepared, out_dir=D)`:
push them to the cluster's registry, render
the bundle with release.bundle (every reference `REGISTRY_NAME/dispatch/NAME:TAG@sha256:...`,
REGISTRY_NAME the name the node's containerd resolves to that registry), and apply controller.yaml
with `kubectl apply --server-side -f`, the kubectl built with the control plane. Our controller
then runs as the Deployment's pods on the node (two replicas, leader election over the Lease in
dispatch-system, in-cluster configuration, its own ServiceAccount); `wait_leading` returns once a
replica holds the Lease and is Ready.

`controller_pods(api)` is what `toolkit cluster status` says of them.

`check(running, installed)` is what the demo verifies and prints: the Lease holder is a pod in
dispatch-system; the manifest applied is byte-identical (sha256) to the bundle's file; every one of
our pods' containers has a registry digest of the release as its imageID.

Invariant: what is applied is the bundle's file itself, never a re-rendering of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import pathlib
import subprocess
import tempfile
import time
from typing import Any

import kubernetes.client

from devcluster import harness
from release import bundle, contexts, images, version as versioning

NAMESPACE = "dispatch-system"
LEASE = "dispatch-controller"
SELECTOR = "app.kubernetes.io/name=dispatch-controller"
READY_TIMEOUT_SECONDS = 240.0


class InstallError(harness.HarnessError):
    """A step of the install that did not happen; the message says which."""


@dataclasses.dataclass(frozen=True)
class Installed:
    release: bundle.Release
    applied_sha256: str  # of the bytes handed to kubectl apply (empty when no part was applied)
    build_seconds: float = 0.0  # making sure the images are in local storage (0 when built before)
    push_seconds: float = 0.0  # pushing them to the cluster's registry and rendering the bundle
    leader: str = ""  # the controller pod that held the Lease, Ready, once wait_leading returned


# The label that says what an image of ours was built from (inputs_hash): a build of a tree with
# uncommitted changes carries the same tag as the next edit's, so the tag alone does not say it.
INPUTS_LABEL = "dispatch.inputs"
# What the images' build contexts are made of (release/contexts.py), hashed by inputs_hash.
SOURCES = ("controller", "dispatcher", "sidecar", "toolkit", "images", "constraints.txt")


def inputs_hash() -> str:
    """A short hash of every file the release's images are built from (SOURCES)."""
    h = hashlib.sha256()
    for top in SOURCES:
        root = contexts.REPO / top
        files = [root] if root.is_file() else sorted(
            f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts
            and f.relative_to(contexts.REPO).as_posix() != "toolkit/data/release.json")
        for f in files:
            h.update(f.relative_to(contexts.REPO).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def release_images(build: versioning.Build, workdir: pathlib.Path) -> dict[str, str]:
    """BUILD's images in local storage, name -> local image: those already built from these
    inputs (INPUTS_LABEL) are kept, the others built now (in WORKDIR)."""
    inputs = inputs_hash()
    found = {}
    for name in images.NAMES:
        tag = images.local_name(name, build.tag)
        done = contexts.podman("image", "inspect", "--format", f'{{{{index .Labels "{INPUTS_LABEL}"}}}}', tag)
        if done.returncode == 0 and done.stdout.strip() == inputs:
            found[name] = tag
    workdir.mkdir(parents=True, exist_ok=True)
    for name in (n for n in images.NAMES if n not in found):
        tag = images.local_name(name, build.tag)
        labels = {**images.labels(build, name=name, repo=contexts.REPO), INPUTS_LABEL: inputs}
        with tempfile.TemporaryDirectory(dir=workdir) as sub:
            same = _built_from(name, inputs)
            if same:
                found[name] = _relabel(same, tag=tag, labels=labels, workdir=pathlib.Path(sub))
            else:
                found[name] = contexts.build(name, tag=tag, workdir=pathlib.Path(sub), labels=labels)
    return found


def _built_from(name: str, inputs: str) -> str | None:
    """An image of NAME in local storage built from INPUTS (under another tag: another commit's)."""
    done = contexts.podman("images", "--format", "{{.ID}}", "--filter", f"reference={images.local_name(name, '*')}",
                           "--filter", f"label={INPUTS_LABEL}={inputs}")
    ids = done.stdout.split() if done.returncode == 0 else []
    return ids[0] if ids else None


def _relabel(image: str, *, tag: str, labels: dict[str, str], workdir: pathlib.Path) -> str:
    """TAG: IMAGE's layers (built from the same files) with this build's LABELS, so no layer is rebuilt."""
    (workdir / "Containerfile").write_text(f"FROM {image}\n")
    done = contexts.podman("build", "-q", *(f"--label={k}={v}" for k, v in labels.items()),
                           "-f", str(workdir / "Containerfile"), "-t", tag, str(workdir), timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"podman build of {tag} from {image} exited {done.returncode}: "
                           f"{done.stderr.strip()[-2000:]}")
    return tag


def kubectl(running: Any) -> pathlib.Path:
    from devcluster import local

    return harness.binary(local.KUBECTL, running.plane.bin_dir)


@dataclasses.dataclass(frozen=True)
class Prepared:
    build: versioning.Build
    local_images: dict[str, str]  # name -> the local image (release_images)
    build_seconds: float


def prepare(out_dir: pathlib.Path) -> Prepared:
    """This checkout's build and its images in local storage (release_images), before the cluster
    starts: a build does not hold the host's node slot."""
    build = versioning.describe(bundle.REPO)
    start = time.monotonic()
    local_images = release_images(build, out_dir / ".build")
    return Prepared(build=build, local_images=local_images, build_seconds=time.monotonic() - start)


def install(running: Any, prepared: Prepared, *, out_dir: pathlib.Path, controller: bool = True) -> Installed:
    """Push PREPARED's images, render the bundle into OUT_DIR and apply its controller part on
    RUNNING (a local.start Stack), unless not CONTROLLER: a cluster without Kueue cannot take it
    (the AdmissionCheck API), and the dispatcher's suite needs only the images and dispatcher.yaml."""
    from devcluster import local  # which imports this module

    registry = running.node.registry
    start = time.monotonic()
    made = bundle.build_release(registry=registry.name, out_dir=out_dir, push=registry.push,
                                version=prepared.build.version, kustomize=local.kustomize(),
                                local_images=prepared.local_images)
    built, pushed = prepared.build_seconds, time.monotonic() - start
    applied = apply(running, made, "controller.yaml") if controller else ""
    running.sidecar_image = made.references["sidecar"]
    return Installed(release=made, applied_sha256=applied, build_seconds=built, push_seconds=pushed)


def apply(running: Any, release: bundle.Release, part: str) -> str:
    """Apply the bundle's file PART (controller.yaml, dispatcher.yaml) on RUNNING as released, with
    `kubectl apply --server-side -f`; the sha256 of the bytes applied."""
    manifest = release.files[part]
    return _apply(running, manifest.read_bytes(), str(manifest))


def apply_text(running: Any, text: str, what: str) -> str:
    """Apply the manifest TEXT (WHAT names it in an error) as `apply` applies a bundle's file."""
    return _apply(running, text.encode(), what)


def _apply(running: Any, data: bytes, what: str) -> str:
    done = subprocess.run([str(kubectl(running)), "--kubeconfig", running.plane.kubeconfig, "apply",
                           "--server-side", "-f", "-"], input=data, capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise InstallError(f"kubectl apply --server-side -f {what}: {done.stderr.decode().strip()}")
    return hashlib.sha256(data).hexdigest()


def wait_leading(running: Any, *, timeout: float = READY_TIMEOUT_SECONDS,
                 renewed_after: datetime.datetime | None = None) -> str:
    """The name of the controller pod that holds the Lease, once it is Ready (and, with
    RENEWED_AFTER, has renewed the Lease since then: a leader that could not renew while the
    apiserver was away campaigns again); fails after TIMEOUT."""
    deadline = time.monotonic() + timeout
    last = "no Lease yet"
    with running.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        coord = kubernetes.client.CoordinationV1Api(api)
        while time.monotonic() < deadline:
            renewed = None
            try:
                lease = coord.read_namespaced_lease(LEASE, NAMESPACE).spec
                holder, renewed = lease.holder_identity or "", lease.renew_time
            except kubernetes.client.ApiException as e:
                holder, last = "", f"Lease: {e.status}"
            pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items}
            pod = next((p for name, p in pods.items() if holder and holder.startswith(name)), None)
            fresh = renewed_after is None or (renewed is not None and renewed >= renewed_after)
            if pod is not None and fresh and any(c.type == "Ready" and c.status == "True"
                                                 for c in pod.status.conditions or []):
                return pod.metadata.name
            restarts = ", ".join(f"{n}: {p.status.phase}, restarts "
                                 f"{sum(c.restart_count for c in p.status.container_statuses or [])}"
                                 for n, p in sorted(pods.items()))
            if holder:
                last = f"Lease held by {holder!r}, renewed {renewed}; pods {restarts}"
            elif pods:
                last = f"pods {restarts}"
            time.sleep(1.0)
    raise InstallError(f"no Ready controller pod leads within {timeout:.0f}s ({last})")


def controller_pods(api: Any) -> list[str]:
    """One line per controller pod in NAMESPACE: its name, phase, readiness, and whether it holds the Lease."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        holder = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
            LEASE, NAMESPACE, _request_timeout=10).spec.holder_identity or ""
    except kubernetes.client.ApiException:
        holder = ""
    lines = []
    for pod in core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR, _request_timeout=10).items:
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        leads = bool(holder) and holder.startswith(pod.metadata.name)
        lines.append(f"{NAMESPACE}/{pod.metadata.name} {pod.status.phase}{', Ready' if ready else ', not Ready'}"
                     f"{', holds the Lease' if leads else ''}")
    return lines


def check(running: Any, installed: Installed) -> list[str]:
    """What the demo verifies; each line it prints. Raises InstallError on the first that fails."""
    leader = wait_leading(running)
    lines = [f"the Lease {NAMESPACE}/{LEASE} is held by pod {leader}"]
    expected = hashlib.sha256(installed.release.files["controller.yaml"].read_bytes()).hexdigest()
    if installed.applied_sha256 != expected:
        raise InstallError(f"applied manifest sha256 {installed.applied_sha256} != controller.yaml's {expected}")
    lines.append(f"controller.yaml applied as released: sha256 {expected}")
    reference = installed.release.references["controller"]
    repo, digest = reference.split("@")[0].rsplit(":", 1)[0], reference.split("@")[1]
    with running.plane.api_client() as api:
        pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    if len(pods) < 2:
        raise InstallError(f"{len(pods)} controller pod(s) in {NAMESPACE}, not 2")
    for pod in pods:
        for status in pod.status.container_statuses or []:
            if status.image_id != f"{repo}@{digest}":
                raise InstallError(f"pod {pod.metadata.name}: imageID {status.image_id!r}, not {repo}@{digest}")
        lines.append(f"pod {pod.metadata.name} on {pod.spec.node_name}: imageID {repo}@{digest}")
    return lines


# The modules our images run (`python3 -m NAME`): a process running one is our controller or dispatcher.
OUR_MODULES = ("controller", "dispatcher")


def ours_outside_pods(proc: pathlib.Path = pathlib.Path("/proc")) -> list[str]:
    """Every process on this host that runs our controller or dispatcher (`-m controller`,
    `-m dispatcher`) outside the node's pods (a cgroup under the kubelet's `kubepods` in the node's
    cgroup root): one 'PID: COMMAND' each. Empty when only the kubelet's pods run them."""
    from devcluster import node

    pods = f"/{node.CGROUP_ROOT}/kubepods"
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cgroups = (entry / "cgroup").read_text().splitlines()
        except OSError:
            continue  # gone meanwhile
        runs = any(argv[i] == b"-m" and argv[i + 1].decode(errors="replace") in OUR_MODULES
                   for i in range(len(argv) - 1))
        if runs and not any(line.split(":", 2)[-1].startswith(pods + "/") for line in cgroups):
            found.append(f"{entry.name}: {b' '.join(argv).decode(errors='replace').strip()}")
    return found


def main() -> int:
    """`make release-images`: build this checkout's release images into local storage (what
    `make demo`, `toolkit cluster up` and the e2e tests then push), and say how long it took."""
    build = versioning.describe(bundle.REPO)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dispatch-release-images-") as tmp:
        built = release_images(build, pathlib.Path(tmp))
    print(f"release images {build.tag} (inputs {inputs_hash()}): {', '.join(built.values())} "
          f"({time.monotonic() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
