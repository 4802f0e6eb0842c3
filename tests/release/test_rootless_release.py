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
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import local
from release import bases, contexts, images
from tests.release import loopback, rootless
from toolkit import mirror

REPO = pathlib.Path(__file__).resolve().parents[2]
VERSION = "0.0.0+rootless"
TAG = "0.0.0-rootless"
INDEX = "application/vnd.oci.image.index.v1+json"

# The whole build (four images, two architectures, into the user's vfs storage) runs in the fixture.
pytestmark = [pytest.mark.images, pytest.mark.cluster, pytest.mark.timeout(3600)]


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
