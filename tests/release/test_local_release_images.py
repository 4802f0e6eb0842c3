"""The release images the local cluster installs (devcluster/install.py `release_images`): kept
while what they are built from is unchanged, whatever the tag says.

`inputs_hash` follows the files the images' contexts are made of (a tree with uncommitted
changes keeps its tag from one edit to the next, so the tag alone cannot say an image is current)
and nothing else. An image of another tag (another commit's) built from the same files is given
the new build's labels with its layers unchanged; no build runs.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from devcluster import install
from release import contexts, images, version

pytestmark = pytest.mark.images

TAGS = ("0.0.0-test-release-images-a", "0.0.0-test-release-images-b")


def _tree(root: pathlib.Path) -> None:
    for top in install.SOURCES:
        if "." in top:
            (root / top).write_text(f"{top}\n")
        else:
            (root / top / "pkg").mkdir(parents=True)
            (root / top / "pkg" / "a.py").write_text(f"# {top}\n")


def test_the_inputs_hash_follows_the_sources_only(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path)
    monkeypatch.setattr(contexts, "REPO", tmp_path)
    first = install.inputs_hash()
    (tmp_path / "controller" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "controller" / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "toolkit" / "data").mkdir()
    (tmp_path / "toolkit" / "data" / "release.json").write_text("{}")  # not part of any image
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("x")
    assert install.inputs_hash() == first
    (tmp_path / "sidecar" / "pkg" / "a.py").write_text("# changed\n")
    assert install.inputs_hash() != first
    (tmp_path / "sidecar" / "pkg" / "a.py").write_text("# sidecar\n")
    assert install.inputs_hash() == first
    (tmp_path / "images" / "pkg" / "b.Containerfile").write_text("FROM x\n")
    assert install.inputs_hash() != first


def _build(tag: str) -> version.Build:
    return version.Build(version=tag, tag=tag, revision=tag.rsplit("-", 1)[1] * 40, created="2026-01-01T00:00:00Z")


def _inspect(image: str) -> dict:
    done = contexts.podman("image", "inspect", image)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]


@pytest.fixture
def cleanup() -> Iterator[None]:
    yield
    for tag in TAGS:
        contexts.podman("rmi", images.local_name("test-driver", tag))


@pytest.mark.usefixtures("cleanup")
def test_an_image_built_from_the_same_files_is_relabelled_not_rebuilt(tmp_path: pathlib.Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "NAMES", ("test-driver",))
    monkeypatch.setattr(install, "inputs_hash", lambda: "test-inputs-1")
    first, second = (images.local_name("test-driver", tag) for tag in TAGS)
    # The other commit's image: the busybox base under the first tag, labelled as built from test-inputs-1.
    install._relabel(contexts.BUSYBOX_BASE, tag=first, labels={install.INPUTS_LABEL: "test-inputs-1"},
                     workdir=tmp_path)

    def no_build(*args: object, **kwargs: object) -> str:
        raise AssertionError("built although an image of the same inputs was there")

    monkeypatch.setattr(contexts, "build", no_build)
    found = install.release_images(_build(TAGS[1]), tmp_path / "work")
    assert found == {"test-driver": second}
    old, new = _inspect(first), _inspect(second)
    assert new["RootFS"]["Layers"] == old["RootFS"]["Layers"]
    labels = new["Config"]["Labels"]
    assert labels[install.INPUTS_LABEL] == "test-inputs-1"
    assert labels["org.opencontainers.image.version"] == TAGS[1]
    assert labels["org.opencontainers.image.revision"] == "b" * 40
    # Found as it is the next time: same tag, same inputs.
    assert install.release_images(_build(TAGS[1]), tmp_path / "work") == {"test-driver": second}
    assert _inspect(second)["Id"] == new["Id"]


@pytest.mark.usefixtures("cleanup")
def test_an_image_of_the_same_tag_built_from_other_files_is_built_again(tmp_path: pathlib.Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "NAMES", ("test-driver",))
    tag = images.local_name("test-driver", TAGS[0])
    install._relabel(contexts.BUSYBOX_BASE, tag=tag, labels={install.INPUTS_LABEL: "test-inputs-old"}, workdir=tmp_path)
    monkeypatch.setattr(install, "inputs_hash", lambda: "test-inputs-new")
    built: list[str] = []

    def build(component: str, *, tag: str, workdir: pathlib.Path, labels: dict[str, str]) -> str:
        built.append(component)
        assert labels[install.INPUTS_LABEL] == "test-inputs-new"
        return tag

    monkeypatch.setattr(contexts, "build", build)
    assert install.release_images(_build(TAGS[0]), tmp_path / "work") == {"test-driver": tag}
    assert built == ["test-driver"]
