"""The release tests' shared release: four small images built here from the test driver's context,
one per release image name and each with its own OCI labels (so each has its own digest), and the
bundle `build_release` makes of them with its images archive, each copied from the archive's
layout by skopeo to a `dir:` destination, where the manifest is on disk."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from devcluster import local
from release import bundle, contexts, images, version

REPO = pathlib.Path(__file__).resolve().parents[2]
REGISTRY = "registry.test:5000/team"
VERSION = "0.1.0+gtest"
TAG = "0.1.0-gtest"


@pytest.fixture(scope="module")
def local_images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    build = version.describe(REPO, version=VERSION)
    built = {}
    try:
        for name in images.NAMES:
            built[name] = contexts.build("test-driver", tag=f"localhost/dispatch-release-test/{name}:{TAG}",
                                         workdir=tmp_path_factory.mktemp(name),
                                         labels=images.labels(build, name=name, repo=REPO))
        yield built
    finally:
        for image in built.values():
            contexts.remove(image)


@pytest.fixture(scope="module")
def made(local_images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[bundle.Release, pathlib.Path]:
    pushed = tmp_path_factory.mktemp("pushed")
    release = bundle.build_release(registry=REGISTRY, version=VERSION, out_dir=tmp_path_factory.mktemp("out"),
                                   push=images.skopeo_push(f"dir:{pushed}/{{name}}"), local_images=local_images,
                                   kustomize=local.kustomize(), images_archive=True)
    return release, pushed
