"""`toolkit mirror` (toolkit/mirror.py): the release's images archive copied into another registry
with the real skopeo, digests kept, and the manifests written for that registry.

The release is the shared one (tests/release/conftest.py: four small images, its images archive
written by `build_release`). The destination is distribution's registry as the local cluster runs
it (devcluster/registry.py): TLS with the cluster's CA and htpasswd authentication, so the copy
goes through what a private registry asks of a client. What the registry serves afterwards is read
over its API, with its credentials: each index under the new name, its sha256 the release's digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import tarfile
import urllib.request
from collections.abc import Iterator

import pytest

from devcluster import harness, local, registry as registry_mod
from release import bundle
from tests.release.conftest import REPO, VERSION
from toolkit import mirror

pytestmark = [pytest.mark.cluster, pytest.mark.images]

TOOLKIT = REPO / ".venv" / "bin" / "toolkit"
ACCEPT = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.docker.distribution.manifest.v2+json"])


@pytest.fixture(scope="module")
def registry() -> Iterator[registry_mod.Registry]:
    """A registry with TLS and a password, as a private registry is (the plane issues its certificate)."""
    with harness.ControlPlane(scheduler=False, crds=False) as plane:
        started = registry_mod.Registry(plane, bin_dir=local.services_bin(), name="mirror.registry.test").start()
        try:
            yield started
        finally:
            started.stop()


def release_dir(made: tuple[bundle.Release, pathlib.Path]) -> pathlib.Path:
    return made[0].files["SHA256SUMS"].parent


def served_digest(registry: registry_mod.Registry, repository: str, tag: str) -> str:
    request = urllib.request.Request(f"https://{registry.endpoint}/v2/{repository}/manifests/{tag}",
                                     headers={"Authorization": registry.authorization(), "Accept": ACCEPT})
    context = ssl.create_default_context(cafile=registry.ca_file)
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return "sha256:" + hashlib.sha256(response.read()).hexdigest()


def toolkit_mirror(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run([str(TOOLKIT), "mirror", *args], capture_output=True, text=True, timeout=600, check=False,
                          env=env)


def test_the_archive_is_one_layout_of_the_indexes_the_release_pins(
        made: tuple[bundle.Release, pathlib.Path], tmp_path: pathlib.Path) -> None:
    release, _ = made
    archive = mirror.check_sum(release_dir(made), mirror.archive_name(VERSION))
    with tarfile.open(archive) as tar:
        assert all(member.uid == 0 and member.mtime == tar.getmembers()[0].mtime for member in tar.getmembers())
    listed = mirror.unpack(archive, tmp_path)
    assert json.loads((tmp_path / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    chart = json.loads(release.files["release.json"].read_text())["chart"]
    assert chart.startswith(f"{release.registry}/dispatch/charts/dispatch-k8s:0.1.0_gtest@sha256:")
    assert listed == {ref.removeprefix(f"{release.registry}/").partition("@")[0]: ref.partition("@")[2]
                      for ref in [*release.references.values(), chart]}
    # The chart's artifact is Helm's: its config the Chart.yaml's metadata, its one layer the release's .tgz.
    manifest = json.loads((tmp_path / "blobs" / "sha256" / chart.rpartition(":")[2]).read_text())
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    tgz = (tmp_path / "blobs" / "sha256" / layer["digest"].partition(":")[2]).read_bytes()
    assert tgz == release.files["dispatch-k8s-0.1.0+gtest.tgz"].read_bytes()


def test_mirror_copies_every_image_with_its_digest_and_writes_the_manifests_for_the_registry(
        made: tuple[bundle.Release, pathlib.Path], registry: registry_mod.Registry, tmp_path: pathlib.Path) -> None:
    release, _ = made
    to = f"{registry.endpoint}/platform"
    out = tmp_path / "mirrored"
    done = toolkit_mirror(str(release_dir(made)), "--to", to, "--out", str(out), "--authfile", str(registry.authfile),
                          "--cert-dir", str(registry.cert_dir))
    assert done.returncode == 0, done.stderr
    moved = {}
    for name, reference in release.references.items():
        digest = reference.rpartition("@")[2]
        tag = reference.rpartition("@")[0].rpartition(":")[2]
        assert served_digest(registry, f"platform/dispatch/{name}", tag) == digest
        moved[reference] = f"{to}/dispatch/{name}:{tag}@{digest}"
        assert f"{name}: {moved[reference]}" in done.stdout.splitlines()
    for filename in mirror.MANIFESTS:
        text = (out / filename).read_text()
        assert text == mirror.retarget((release_dir(made) / filename).read_text(), moved)
        assert release.registry not in text or filename == "sidecar-rbac.yaml"
    meta = json.loads((out / "release.json").read_text())
    assert meta["registry"] == to and set(meta["images"].values()) == set(moved.values())
    # The chart too, digest kept: Helm installs it from the registry as the release wrote it.
    chart_digest = json.loads(release.files["release.json"].read_text())["chart"].rpartition("@")[2]
    assert served_digest(registry, "platform/dispatch/charts/dispatch-k8s", "0.1.0_gtest") == chart_digest
    assert meta["chart"] == f"{to}/dispatch/charts/dispatch-k8s:0.1.0_gtest@{chart_digest}"
    assert f"charts/dispatch-k8s: {meta['chart']}" in done.stdout.splitlines()
    pulled = tmp_path / "pulled"
    pulled.mkdir()
    helm = subprocess.run([str(local.helm()), "pull", f"oci://{to}/dispatch/charts/dispatch-k8s", "--version", VERSION,
                           "--registry-config", str(registry.authfile), "--ca-file", str(registry.ca_file),
                           "-d", str(pulled)], capture_output=True, text=True, timeout=120, check=False)
    assert helm.returncode == 0, helm.stderr
    assert f"Digest: {chart_digest}" in helm.stdout + helm.stderr
    assert (pulled / "dispatch-k8s-0.1.0+gtest.tgz").read_bytes() == (out / "dispatch-k8s-0.1.0+gtest.tgz").read_bytes()
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True, check=False)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 5, checked.stdout


def test_without_the_registry_s_credentials_the_copy_is_refused_in_one_line(
        made: tuple[bundle.Release, pathlib.Path], registry: registry_mod.Registry, tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "auth.json"
    empty.write_text('{"auths": {}}')
    out = tmp_path / "out"
    done = toolkit_mirror(str(release_dir(made)), "--to", f"{registry.endpoint}/denied", "--out", str(out),
                          "--authfile", str(empty), "--cert-dir", str(registry.cert_dir))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("toolkit mirror: copying dispatch/") and len(done.stderr.splitlines()) == 1
    assert "unauthorized" in done.stderr.lower() or "authentication required" in done.stderr.lower(), done.stderr
    assert not out.exists()


def test_a_damaged_archive_a_bad_registry_or_the_release_s_own_directory_is_refused_before_any_copy(
        made: tuple[bundle.Release, pathlib.Path], tmp_path: pathlib.Path) -> None:
    source = release_dir(made)
    damaged = tmp_path / "damaged"
    shutil.copytree(source, damaged)
    archive = damaged / mirror.archive_name(VERSION)
    with archive.open("r+b") as f:
        f.seek(1024)
        f.write(b"x")
    forged = tmp_path / "forged"
    shutil.copytree(source, forged)
    meta = json.loads((forged / "release.json").read_text())
    (forged / "release.json").write_text(json.dumps({**meta, "chart": "elsewhere.test/charts/dispatch-k8s:1"}))
    cases = [
        ([str(forged), "--to", "127.0.0.1:1", "--out", str(tmp_path / "d")],
         f"toolkit mirror: release.json chart: must be {meta['registry']}/dispatch/charts/dispatch-k8s:0.1.0_gtest@"
         "sha256:<64 hex>, found 'elsewhere.test/charts/dispatch-k8s:1'"),
        ([str(damaged), "--to", "127.0.0.1:1", "--out", str(tmp_path / "a")],
         f"toolkit mirror: {archive}: its sha256 is not the one SHA256SUMS lists (a damaged or partial copy)"),
        ([str(source), "--to", "Registry.Example", "--out", str(tmp_path / "b")],
         "toolkit mirror: registry 'Registry.Example': must be a host[:port][/path] in lower case"),
        ([str(source), "--to", "127.0.0.1:1", "--out", str(source)],
         f"toolkit mirror: --out {source}: the release's own directory; the mirrored manifests go elsewhere"),
        ([str(tmp_path), "--to", "127.0.0.1:1", "--out", str(tmp_path / "c")],
         f"toolkit mirror: {tmp_path}: no release.json (a directory `make release` wrote)"),
    ]
    for args, line in cases:
        done = toolkit_mirror(*args)
        assert done.returncode == 2 and done.stderr.startswith(line) and len(done.stderr.splitlines()) == 1, (
            args, done.stderr)
    # No skopeo on PATH: said before the archive is unpacked.
    done = toolkit_mirror(str(source), "--to", "127.0.0.1:1", "--out", str(tmp_path / "d"), path="/nonexistent")
    assert (done.returncode, done.stderr) == (
        2, "toolkit mirror: skopeo: 'skopeo' not found (install skopeo: it copies the images)\n")
