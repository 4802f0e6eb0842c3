"""The release's images: built locally with their OCI labels, and pushed.

NAMES are the images a release builds; each is the repository `dispatch/NAME` in the release's
registry. They are built from the contexts release/contexts.py makes (the same ones the image tests
and the local cluster build), tagged `localhost/dispatch/NAME:TAG` in local storage only, and carry
the standard OCI labels: version, revision, source, licenses, created (the commit's time, so the
labels of a rebuilt commit are the same), title.

`skopeo_push(DESTINATION)` is the push of a release with its images archive: each image copied
from the archive's layout as it is. `podman_push(DESTINATION)` is a push for release.bundle: `podman push --digestfile` to
DESTINATION formatted with the repository name and the tag, for example
`docker://127.0.0.1:5000/{name}:{tag}` or, in a test, `dir:/tmp/out/{name}`; it answers the digest
of the manifest it pushed.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import tomllib
from collections.abc import Callable

from release import contexts, version
from toolkit import mirror

NAMES = ("controller", "dispatcher", "sidecar", "test-driver")
LICENSE = "Apache-2.0"


def repository(name: str) -> str:
    return f"dispatch/{name}"


def local_name(name: str, tag: str, arch: str = contexts.HOST_ARCH) -> str:
    """Where a build leaves image NAME for ARCH in local storage (never a reference a manifest names)."""
    return f"localhost/{repository(name)}:{tag}" + ("" if arch == contexts.HOST_ARCH else f"-{arch}")


def local_index(name: str, tag: str) -> str:
    """The local manifest list of image NAME's architectures (index)."""
    return f"localhost/{repository(name)}:{tag}-index"


def source_url(repo: pathlib.Path) -> str:
    with (repo / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["urls"]["Source"])


def labels(build: version.Build, *, name: str, repo: pathlib.Path) -> dict[str, str]:
    prefix = "org.opencontainers.image."
    return {prefix + "title": f"dispatch-k8s {name}", prefix + "version": build.version,
            prefix + "revision": build.revision, prefix + "source": source_url(repo),
            prefix + "licenses": LICENSE, prefix + "created": build.created}


def build_all(build: version.Build, *, workdir: pathlib.Path,
              arches: tuple[str, ...] = contexts.ARCHES) -> dict[str, str]:
    """Build every image of NAMES for BUILD and each of ARCHES, and gather each NAME's in a manifest
    list (index); answers name -> that local manifest list."""
    workdir.mkdir(parents=True, exist_ok=True)
    built = {}
    for name in NAMES:
        per_arch = {}
        for arch in arches:
            with tempfile.TemporaryDirectory(dir=workdir) as tmp:
                per_arch[arch] = contexts.build(name, tag=local_name(name, build.tag, arch), workdir=pathlib.Path(tmp),
                                                labels=labels(build, name=name, repo=contexts.REPO), arch=arch)
        built[name] = index(local_index(name, build.tag), per_arch)
    return built


def index(list_name: str, images: dict[str, str]) -> str:
    """LIST_NAME: a local manifest list of IMAGES (architecture -> local image), made anew; each
    image must be for its architecture. Answers LIST_NAME."""
    contexts.podman("manifest", "rm", list_name)  # an earlier build's, if any
    done = contexts.podman("manifest", "create", list_name)
    if done.returncode != 0:
        raise RuntimeError(f"podman manifest create {list_name}: {done.stderr.strip()}")
    for arch, image in sorted(images.items()):
        if contexts.architecture(image) != arch:
            raise RuntimeError(f"{image} is for {contexts.architecture(image)}, not {arch}")
        done = contexts.podman("manifest", "add", list_name, f"containers-storage:{image}")
        if done.returncode != 0:
            raise RuntimeError(f"podman manifest add {list_name} {image}: {done.stderr.strip()}")
    return list_name


def is_index(image: str) -> bool:
    return contexts.podman("manifest", "exists", image).returncode == 0


def podman_push(destination: str, *, authfile: str | None = None,
                tls_verify: bool = True) -> Callable[[str, str, str], str]:
    """A release.bundle.Push that pushes to DESTINATION.format(name=..., tag=...) with podman."""

    def push(image: str, name: str, tag: str) -> str:
        target = destination.format(name=name, tag=tag)
        if target.startswith("dir:"):  # a directory per image: its parent must exist
            pathlib.Path(target.removeprefix("dir:")).parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            digestfile = pathlib.Path(tmp) / "digest"
            command = ["manifest", "push", "--all", "--format", "oci"] if is_index(image) else ["push"]
            args = [*command, "-q", "--digestfile", str(digestfile),
                    *(["--authfile", authfile] if authfile else []),
                    *([] if tls_verify else ["--tls-verify=false"]),
                    image, target]
            done = contexts.podman(*args, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"podman push {image}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
            return digestfile.read_text().strip()

    return push


def inspect_labels(image: str) -> dict[str, str]:
    done = contexts.podman("image", "inspect", "--format", "{{json .Labels}}", image)
    if done.returncode != 0:
        raise RuntimeError(f"{image}: {done.stderr.strip()}")
    return dict(json.loads(done.stdout) or {})




def skopeo_push(destination: str, *, authfile: str | None = None, cert_dir: str | None = None,
                tls_verify: bool = True) -> Callable[[str, str, str], str]:
    """A release.bundle.Push for images in an OCI layout (`oci:LAYOUT:REF`): each is copied, with
    every image of an index, to DESTINATION.format(name=..., tag=...) byte for byte (toolkit.mirror's
    copy), and the digest answered is the layout's."""

    def push(source: str, name: str, tag: str) -> str:
        target = destination.format(name=name, tag=tag)
        if target.startswith("dir:"):
            pathlib.Path(target.removeprefix("dir:")).parent.mkdir(parents=True, exist_ok=True)
        try:
            return mirror.skopeo_copy(source, target, authfile=authfile, cert_dir=cert_dir, tls_verify=tls_verify)
        except (mirror.CopyError, mirror.MirrorError) as exc:
            raise RuntimeError(f"skopeo copy {source}: {exc}") from exc

    return push
