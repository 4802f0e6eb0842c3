"""The release's images: built locally with their OCI labels, and pushed.

NAMES are the images a release builds; each is the repository `dispatch/NAME` in the release's
registry. They are built from the contexts release/contexts.py makes (the same ones the image tests
and the local cluster build), tagged `localhost/dispatch/NAME:TAG` in local storage only, and carry
the standard OCI labels: version, revision, source, licenses, created (the commit's time, so the
labels of a rebuilt commit are the same), title.

`podman_push(DESTINATION)` is a push for release.bundle: `podman push --digestfile` to
DESTINATION formatted with the repository name and the tag, for example
`docker://127.0.0.1:5000/{name}:{tag}` or, in a test, `dir:/tmp/out/{name}`; it answers the digest
of the manifest it pushed.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from collections.abc import Callable
import tomllib

from release import contexts, version

NAMES = ("controller", "dispatcher", "sidecar", "test-driver")
LICENSE = "Apache-2.0"


def repository(name: str) -> str:
    return f"dispatch/{name}"


def local_name(name: str, tag: str) -> str:
    """Where a build leaves image NAME in local storage (never a reference a manifest names)."""
    return f"localhost/{repository(name)}:{tag}"


def source_url(repo: pathlib.Path) -> str:
    with (repo / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["urls"]["Source"])


def labels(build: version.Build, *, name: str, repo: pathlib.Path) -> dict[str, str]:
    prefix = "org.opencontainers.image."
    return {prefix + "title": f"dispatch-k8s {name}", prefix + "version": build.version,
            prefix + "revision": build.revision, prefix + "source": source_url(repo),
            prefix + "licenses": LICENSE, prefix + "created": build.created}


def build_all(build: version.Build, *, workdir: pathlib.Path) -> dict[str, str]:
    """Build every image of NAMES for BUILD; answers name -> local image."""
    workdir.mkdir(parents=True, exist_ok=True)
    built = {}
    for name in NAMES:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            built[name] = contexts.build(name, tag=local_name(name, build.tag), workdir=pathlib.Path(tmp),
                                         labels=labels(build, name=name, repo=contexts.REPO))
    return built


def podman_push(destination: str, *, authfile: str | None = None,
                tls_verify: bool = True) -> Callable[[str, str, str], str]:
    """A release.bundle.Push that pushes to DESTINATION.format(name=..., tag=...) with podman."""

    def push(image: str, name: str, tag: str) -> str:
        target = destination.format(name=name, tag=tag)
        if target.startswith("dir:"):  # a directory per image: its parent must exist
            pathlib.Path(target.removeprefix("dir:")).parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            digestfile = pathlib.Path(tmp) / "digest"
            args = ["push", "-q", "--digestfile", str(digestfile),
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

