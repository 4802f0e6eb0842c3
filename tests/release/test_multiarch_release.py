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
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import local
from release import bundle, contexts, images
from tests import containers
from tests.release import arm64, loopback

pytestmark = [pytest.mark.images, pytest.mark.cluster]

VERSION = "0.0.0+multiarch"
TAG = "0.0.0-multiarch"
INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a registry of our own on 127.0.0.1, stopped (and its storage gone) at the end."""
    with loopback.registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


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


def test_every_released_image_is_an_index_of_amd64_and_arm64_pinned_by_its_digest(
        registry: str, release: bundle.Release, tmp_path: pathlib.Path) -> None:
    assert set(release.references) == set(images.NAMES)
    for name, reference in release.references.items():
        repository_tag, digest = reference.split("@")
        assert repository_tag == f"{registry}/dispatch/{name}:{TAG}"
        raw = loopback.served(registry, f"dispatch/{name}/manifests/{TAG}", INDEX)
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest, name
        index = json.loads(raw)
        assert index["mediaType"] == INDEX
        assert sorted((m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]) == [
            ("linux", "amd64"), ("linux", "arm64")], name
        # As a user sees it: the pushed reference lists both (podman reads it from the registry).
        inspected = subprocess.run(["podman", "manifest", "inspect", repository_tag],
                                   env=loopback.plain_http(registry, tmp_path), capture_output=True, text=True, timeout=120,
                                   check=False)
        assert inspected.returncode == 0, inspected.stderr
        listed: dict[str, Any] = json.loads(inspected.stdout)
        assert sorted(m["platform"]["architecture"] for m in listed["manifests"]) == ["amd64", "arm64"], name
        # Each architecture's manifest names a config of that architecture.
        for entry in index["manifests"]:
            manifest = json.loads(loopback.served(registry, f"dispatch/{name}/manifests/{entry['digest']}", entry["mediaType"]))
            config = json.loads(loopback.served(registry, f"dispatch/{name}/blobs/{manifest['config']['digest']}", "*/*"))
            assert config["architecture"] == entry["platform"]["architecture"], (name, entry)
    meta = json.loads(release.files["release.json"].read_text())
    assert meta["images"] == release.references
