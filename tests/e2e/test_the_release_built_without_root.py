"""The release built by a user without root: `python -m release --bases FILE` (what `make release
BASES=FILE` runs) as a throwaway account (tests/release/rootless.py), with rootless podman, on the
bases root exported once (`python -m release.bases export FILE`, after make images).

The user works in a clone of this checkout with the working tree's tracked files as they are (so
the code under test is this tree's), with a copy of the kustomize built from its module, and
pushes to a registry on loopback. What it made is then read as root: the bundle's sums hold, every
image of the archive is an index of an amd64 and an arm64 image whose files are all owned by root
inside (no ID of the builder leaks into a layer), the registry serves the digests the release pins,
and the amd64 images, copied out of the archive into root's storage, run under root's podman as the
release's images do (each refuses a missing configuration in its one line; the test driver runs as
65532).

Then what a platform team does with it, on the local cluster with Trainer, JobSet and Kueue and
nothing of ours: the release directory is carried in; `toolkit mirror` copies its images archive
into the cluster's registry (TLS and a password, as a private registry is), digests kept, the chart
with them; `helm install oci://` installs the chart from there, `images.registry` naming that
registry as the nodes know it; a TrainJob on a runtime converted with the mirrored sidecar runs
through Kueue and our check with A raised. `helm uninstall` is refused by the chart's uninstall
guard while the ClusterQueue lists our check, nothing deleted; with the check off the queue it
leaves no object and no pod of ours, and the ClusterQueue Active.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

import kubernetes.client

from devcluster import install, local, scenario as flow, stack as stack_mod
from devcluster.scenario import KUEUE_API, Scenario
from release import bases, contexts, images
from tests.e2e.installing import CHECK, active, admitted_with_a_raised, queue_without_our_check, wait
from tests.release import loopback, rootless
from toolkit import mirror

REPO = pathlib.Path(__file__).resolve().parents[2]
VERSION = "0.0.0+rootless"
TAG = "0.0.0-rootless"
INDEX = "application/vnd.oci.image.index.v1+json"

# The whole build (four images, two architectures, into the user's vfs storage) runs in the fixture.
pytestmark = [pytest.mark.images, pytest.mark.cluster, pytest.mark.timeout(3600)]
E2E_KUEUE = True  # the cluster the release is installed into: Trainer, JobSet and Kueue
E2E_OURS = False  # and nothing of ours: the chart is what installs it
TOOLKIT = REPO / ".venv" / "bin" / "toolkit"


@pytest.fixture(scope="module")
def workdir() -> Iterator[pathlib.Path]:
    """A directory other users can reach (pytest's own temporary directories are root's alone)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-rootless-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def user(workdir: pathlib.Path) -> Iterator[rootless.User]:
    made = rootless.make(workdir)
    try:
        yield made
    finally:
        rootless.end(made)


def checkout(dest: pathlib.Path) -> pathlib.Path:
    """A clone of REPO at DEST with the working tree's tracked files as they are."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True, timeout=300)
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True, capture_output=True,
                            timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = REPO / name, dest / name
        if source.is_symlink() or source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
        else:
            target.unlink(missing_ok=True)
    return dest


@pytest.fixture(scope="module")
def registry(workdir: pathlib.Path) -> Iterator[str]:
    (workdir / "registry").mkdir()
    with loopback.registry(workdir / "registry") as running:
        yield running


@pytest.fixture(scope="module")
def built(user: rootless.User, registry: str, workdir: pathlib.Path) -> tuple[subprocess.CompletedProcess[str],
                                                                              pathlib.Path, pathlib.Path]:
    """`python -m release` run as USER; its process, the clone it ran in and its output directory."""
    archive = bases.export(workdir / "bases.tar")
    src = user.give(checkout(user.home / "src"))
    kustomize = user.home / "kustomize"
    shutil.copy(local.kustomize(), kustomize)
    user.give(kustomize)
    out = user.home / "out"
    done = user.run(str(user.python), "-m", "release", "--registry", registry, "--no-tls-verify",
                    "--kustomize", str(kustomize), "--out", str(out), "--bases", str(archive), "--version", VERSION,
                    cwd=src, timeout=3300)
    return done, src, out


def test_a_user_without_root_builds_the_release_with_rootless_podman(
        user: rootless.User, built: tuple[subprocess.CompletedProcess[str], pathlib.Path, pathlib.Path]) -> None:
    done, src, out = built
    assert done.returncode == 0, done.stderr[-4000:]
    assert user.uid != 0 and user.run("id", "-u").stdout.strip() == str(user.uid)
    info = user.run("podman", "info", "--format", "{{.Host.Security.Rootless}}")
    assert info.stdout.strip() == "true", info.stderr
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{mirror.archive_name(VERSION)}: OK" in checked.stdout
    # The clone's own code ran: it recorded the release in the clone, not in this checkout.
    recorded = json.loads((src / "toolkit" / "data" / "release.json").read_text())
    assert recorded == json.loads((out / "release.json").read_text())
    assert (recorded["version"], recorded["tag"]) == (VERSION, TAG)
    head = user.run("git", "rev-parse", "HEAD", cwd=src)  # the clone is the user's: git refuses root in it
    assert head.returncode == 0 and recorded["revision"] == head.stdout.strip(), head.stderr


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert member is not None, digest
    return member.read()


def _json(tar: tarfile.TarFile, digest: str) -> Any:
    return json.loads(_blob(tar, digest))


def test_every_archived_image_is_an_index_of_both_architectures_owned_by_root_inside(
        built: tuple[subprocess.CompletedProcess[str], pathlib.Path, pathlib.Path]) -> None:
    done, _, out = built
    assert done.returncode == 0, done.stderr[-4000:]
    with tarfile.open(out / mirror.archive_name(VERSION)) as tar:
        listed = {(e.get("annotations") or {}).get(mirror.REF_NAME): e for e in _json_member(tar, "index.json")}
        for name in images.NAMES:
            entry = listed[f"{images.repository(name)}:{TAG}"]
            assert entry["mediaType"] == INDEX, name
            index = _json(tar, entry["digest"])
            assert sorted(m["platform"]["architecture"] for m in index["manifests"]) == list(contexts.ARCHES), name
            for listed_image in index["manifests"]:
                manifest = _json(tar, listed_image["digest"])
                config = _json(tar, manifest["config"]["digest"])
                assert config["architecture"] == listed_image["platform"]["architecture"], name
                assert config["config"]["User"] == "65532:65532", name
                assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION, name
                for layer in manifest["layers"]:
                    with tarfile.open(fileobj=tar.extractfile(f"blobs/sha256/{layer['digest'][7:]}")) as files:
                        owners = {(f.uid, f.gid) for f in files}
                    assert owners == {(0, 0)}, (name, listed_image["platform"], layer["digest"], owners)


def _json_member(tar: tarfile.TarFile, path: str) -> list[dict[str, Any]]:
    member = tar.extractfile(path)
    assert member is not None, path
    return list(json.loads(member.read())["manifests"])


def test_the_registry_serves_the_indexes_the_release_pins(
        registry: str, built: tuple[subprocess.CompletedProcess[str], pathlib.Path, pathlib.Path]) -> None:
    done, _, out = built
    assert done.returncode == 0, done.stderr[-4000:]
    pinned = json.loads((out / "release.json").read_text())["images"]
    assert set(pinned) == set(images.NAMES)
    for name, reference in pinned.items():
        repository_tag, digest = reference.split("@")
        assert repository_tag == f"{registry}/{images.repository(name)}:{TAG}"
        served = loopback.served(registry, f"{images.repository(name)}/manifests/{TAG}", INDEX)
        assert "sha256:" + hashlib.sha256(served).hexdigest() == digest, name


# How each image, started with its own entry point and no configuration, answers (the image tests'
# own checks of the root-built images), and the test driver's user.
RUNS = {
    "sidecar": ([], 2, "dispatch-sidecar: KUBERNETES_SERVICE_HOST: not set"),
    "controller": ([], 1, "Error: --kubeconfig: cannot load a cluster config"),
    "dispatcher": ([], 2, "dispatcher: TCAB_BACKEND_URL is required and not set"),
    "test-driver": (["--entrypoint", "/bin/sh"], 0, None),
}


@pytest.mark.parametrize("name", images.NAMES)
def test_the_archived_amd64_image_runs_under_root_podman(
        name: str, built: tuple[subprocess.CompletedProcess[str], pathlib.Path, pathlib.Path]) -> None:
    done, _, out = built
    assert done.returncode == 0, done.stderr[-4000:]
    local_image = f"localhost/dispatch-rootless-test/{name}:{TAG}"
    copied = subprocess.run(["skopeo", "copy", "--quiet", "--override-arch", "amd64",
                             f"oci-archive:{out / mirror.archive_name(VERSION)}:{images.repository(name)}:{TAG}",
                             f"containers-storage:{local_image}"], capture_output=True, text=True, timeout=600,
                            check=False)
    assert copied.returncode == 0, copied.stderr
    try:
        options, status, first = RUNS[name]
        command = ["-c", "id -u; test -x /usr/local/bin/driver"] if name == "test-driver" else []
        ran = contexts.podman("run", "--rm", "--network", "none", "--read-only", *options, local_image, *command)
        assert ran.returncode == status, (ran.returncode, ran.stdout, ran.stderr)
        if first is None:
            assert ran.stdout == "65532\n", ran.stdout
        else:
            assert ran.stderr.count("\n") == 1 and ran.stderr.startswith(first), ran.stderr
    finally:
        contexts.remove(local_image)


def test_a_missing_or_unreadable_bases_archive_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    kustomize = local.kustomize()
    for path in (tmp_path / "missing.tar", tmp_path):
        ran = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "release", "--registry", "r.test",
                              "--kustomize", str(kustomize), "--bases", str(path)],
                             cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert ran.returncode == 2, ran.stderr
        assert ran.stderr == (f"release: --bases {path}: not a readable file "
                              "(python -m release.bases export FILE writes it)\n")


def test_an_archive_podman_cannot_load_or_a_missing_base_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not an archive")
    with pytest.raises(bases.BasesError, match=rf"^--bases {junk}: podman load: "):
        bases.load(junk)
    absent = "localhost/dispatch-rootless-test/absent:0"
    with pytest.raises(bases.BasesError, match=rf"^base {absent}: not in local storage \(make images builds it"):
        bases.check((absent,))
    with pytest.raises(bases.BasesError, match=rf"^base {absent}: not in local storage"):
        bases.export(tmp_path / "bases.tar", (absent,))
    assert not (tmp_path / "bases.tar").exists()


def helm(home: pathlib.Path, *args: str, ok: bool = True) -> str:
    """helm with its cache, configuration and data in HOME, never the user's; it must succeed
    unless not OK."""
    env = {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}
    done = subprocess.run([str(local.helm()), *args], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert (done.returncode == 0) == ok, f"helm {' '.join(args)}: {done.stdout} {done.stderr}"
    return done.stdout + done.stderr


def test_mirrored_from_its_archive_and_installed_with_its_chart_it_admits_a_trainjob_with_a_raised(
        built: tuple[subprocess.CompletedProcess[str], pathlib.Path, pathlib.Path], registry: str,
        stack: stack_mod.Stack, e2e_namespace: str, tmp_path: pathlib.Path) -> None:
    done, _, out = built
    assert done.returncode == 0, done.stderr[-4000:]
    namespace, queue = e2e_namespace, f"cq-{e2e_namespace}"
    ours = stack.node.registry
    released = json.loads((out / "release.json").read_text())

    # Mirrored into the cluster's registry, reached from here at its endpoint.
    to = f"{ours.endpoint}/platform"
    mirrored = subprocess.run([str(TOOLKIT), "mirror", str(out), "--to", to, "--out", str(tmp_path / "mirrored"),
                               "--authfile", str(ours.authfile), "--cert-dir", str(ours.cert_dir)],
                              capture_output=True, text=True, timeout=900, check=False)
    assert mirrored.returncode == 0, mirrored.stderr
    chart = json.loads((tmp_path / "mirrored" / "release.json").read_text())["chart"]
    assert chart.rpartition("@")[2] == released["chart"].rpartition("@")[2]

    with stack.plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        core = kubernetes.client.CoreV1Api(api)
        assert queue_without_our_check(api, namespace) == queue

        # The chart from the registry; the nodes know that registry by its name.
        home = tmp_path / "helm"
        kube = ["--kubeconfig", stack.plane.kubeconfig, "--namespace", "default"]
        shown = helm(home, "install", "dispatch-k8s", f"oci://{to}/dispatch/charts/dispatch-k8s", "--version", VERSION,
                     "--registry-config", str(ours.authfile), "--ca-file", str(ours.ca_file), *kube,
                     "--set", f"images.registry={ours.name}/platform", "--set", f"sidecar.namespaces={{{namespace}}}")
        assert f"Digest: {chart.rpartition('@')[2]}" in shown and "STATUS: deployed" in shown, shown
        assert install.wait_leading(stack).startswith("dispatch-controller-")
        sidecar, controller = (released["images"][name].replace(registry, f"{ours.name}/platform")
                               for name in ("sidecar", "controller"))
        assert sidecar in shown, shown  # the notes name the mirrored sidecar for `toolkit render runtime`
        running = core.list_namespaced_pod("dispatch-system",
                                           label_selector="app.kubernetes.io/name=dispatch-controller")
        assert {c.image for p in running.items for c in p.spec.containers} == {controller}

        # A TrainJob through Kueue and our check, on a runtime converted with the mirrored sidecar.
        custom.patch_cluster_custom_object(*KUEUE_API, "clusterqueues", queue, {
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}}})
        wait("the ClusterQueue with our check to be Active", lambda: active(custom, queue))
        stack.sidecar_image = sidecar
        job = Scenario(stack, api, namespace, service_account=False)
        job.create_runtime(flow.runtime("rootless", cpu="800m"))
        admitted_with_a_raised(job, "rootless", "rootless.first")

        # Uninstalled while the ClusterQueue still lists our check: the chart's guard refuses, and
        # nothing is deleted.
        refused = helm(home, "uninstall", "dispatch-k8s", *kube, "--wait", "--timeout", "180s", ok=False)
        assert "Job/dispatch-system/dispatch-uninstall-guard" in refused and "Failed" in refused, refused
        (guard,) = core.list_namespaced_pod("dispatch-system", label_selector="job-name=dispatch-uninstall-guard").items
        lines = core.read_namespaced_pod_log(guard.metadata.name, "dispatch-system")
        assert f"uninstall guard: ClusterQueue {queue} lists {CHECK}: remove it from the queue first" in lines, lines
        assert install.wait_leading(stack).startswith("dispatch-controller-")
        assert active(custom, queue)

        # Then as docs/install.md says: our check off the ClusterQueue first, then the chart.
        custom.patch_cluster_custom_object(*KUEUE_API, "clusterqueues", queue, {
            "spec": {"admissionChecksStrategy": None}})
        helm(home, "uninstall", "dispatch-k8s", *kube, "--wait", "--timeout", "180s")
        wait("no pod of ours", lambda: not core.list_pod_for_all_namespaces(
            label_selector="app.kubernetes.io/part-of=dispatch-k8s").items)
        assert not [c for c in custom.list_cluster_custom_object(*KUEUE_API, "admissionchecks")["items"]
                    if c["metadata"]["name"] == CHECK]
        wait("the ClusterQueue to be Active without our check", lambda: active(custom, queue))
