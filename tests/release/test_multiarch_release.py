"""The release as `make release` makes it (release.bundle.build_release: release.images.build_all,
the images archive, then skopeo_push from it) pushed to a registry on this machine's loopback (distribution's `registry`, the
one the local cluster runs, over plain HTTP on 127.0.0.1): every image of the release is one OCI
image index of an amd64 and an arm64 image, as `podman manifest inspect` of the pushed reference
lists it, and the digest each manifest pins is the sha256 of the index the registry serves.

The builds are the cached ones (this checkout's amd64 release images, tests/containers.py, and its
arm64 ones, tests/release/arm64.py), handed to build_all in place of a build, tagged as it tags
them: what is under test is the gathering into an index, the push and the pinning.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import local
from release import bundle, contexts, images
from tests import containers
from tests.release import arm64

pytestmark = [pytest.mark.images, pytest.mark.cluster]

VERSION = "0.0.0+multiarch"
TAG = "0.0.0-multiarch"
INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a registry of our own on 127.0.0.1, stopped (and its storage gone) at the end."""
    workdir = tmp_path_factory.mktemp("registry")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (workdir / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n")
    log = (workdir / "registry.log").open("w")
    proc = subprocess.Popen([str(local.services_bin() / "registry"), "serve", str(workdir / "config.yml")],
                            env={"PATH": "/usr/bin:/bin", "OTEL_TRACES_EXPORTER": "none"},
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (workdir / "registry.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "the registry did not answer within 30 s"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def release(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[bundle.Release]:
    cached = {(name, arch): containers.release_image(name) if arch == contexts.HOST_ARCH else arm64.image(name)
              for name in images.NAMES for arch in contexts.ARCHES}
    tagged: list[str] = []

    def build(component: str, *, tag: str, workdir: pathlib.Path, labels: dict[str, str], arch: str) -> str:
        done = contexts.podman("tag", cached[component, arch], tag)
        assert done.returncode == 0, done.stderr
        tagged.append(tag)
        return tag

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contexts, "build", build)
        try:
            yield bundle.build_release(registry=registry, version=VERSION, out_dir=tmp_path_factory.mktemp("out"),
                                       push=images.skopeo_push(f"docker://{registry}/{{name}}:{{tag}}",
                                                               tls_verify=False),
                                       kustomize=local.kustomize(), images_archive=True)
        finally:
            for name in images.NAMES:
                contexts.podman("manifest", "rm", images.local_index(name, TAG))
            for tag in tagged:
                contexts.podman("untag", tag, tag)


def served(registry: str, path: str, accept: str) -> bytes:
    request = urllib.request.Request(f"http://{registry}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())


def plain_http(registry: str, tmp_path: pathlib.Path) -> dict[str, str]:
    """podman's environment with REGISTRY taken over plain HTTP (`podman manifest inspect` has no
    --tls-verify), in a registries.conf of the test's own."""
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    return {**os.environ, "CONTAINERS_CONF": str(contexts.REPO / "scripts" / "containers.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(conf)}


def test_every_released_image_is_an_index_of_amd64_and_arm64_pinned_by_its_digest(
        registry: str, release: bundle.Release, tmp_path: pathlib.Path) -> None:
    assert set(release.references) == set(images.NAMES)
    for name, reference in release.references.items():
        repository_tag, digest = reference.split("@")
        assert repository_tag == f"{registry}/dispatch/{name}:{TAG}"
        raw = served(registry, f"dispatch/{name}/manifests/{TAG}", INDEX)
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest, name
        index = json.loads(raw)
        assert index["mediaType"] == INDEX
        assert sorted((m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]) == [
            ("linux", "amd64"), ("linux", "arm64")], name
        # As a user sees it: the pushed reference lists both (podman reads it from the registry).
        inspected = subprocess.run(["podman", "manifest", "inspect", repository_tag],
                                   env=plain_http(registry, tmp_path), capture_output=True, text=True, timeout=120,
                                   check=False)
        assert inspected.returncode == 0, inspected.stderr
        listed: dict[str, Any] = json.loads(inspected.stdout)
        assert sorted(m["platform"]["architecture"] for m in listed["manifests"]) == ["amd64", "arm64"], name
        # Each architecture's manifest names a config of that architecture.
        for entry in index["manifests"]:
            manifest = json.loads(served(registry, f"dispatch/{name}/manifests/{entry['digest']}", entry["mediaType"]))
            config = json.loads(served(registry, f"dispatch/{name}/blobs/{manifest['config']['digest']}", "*/*"))
            assert config["architecture"] == entry["platform"]["architecture"], (name, entry)
    meta = json.loads(release.files["release.json"].read_text())
    assert meta["images"] == release.references
