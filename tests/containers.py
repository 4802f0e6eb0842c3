"""The tests' one way to build and run images: the docker SDK against
podman's Docker-compatible service (DESIGN.md §10). scripts/run-tests.sh
sources scripts/podman-service.sh, which sets DOCKER_HOST; without it, or
without the local Python base (scripts/build-images.sh), a test fails, never
skips.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator

import docker
import docker.errors
import pytest

PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"


@contextlib.contextmanager
def client(*, timeout: int = 600) -> Iterator[docker.DockerClient]:
    """A pinged client; `timeout` bounds every read (a log stream's too)."""
    if not os.environ.get("DOCKER_HOST"):
        pytest.fail("DOCKER_HOST is not set: source scripts/podman-service.sh (scripts/run-tests.sh does)")
    c = docker.from_env(timeout=timeout)
    try:
        assert c.ping()
        yield c
    finally:
        c.close()


def build_on_python_base(c: docker.DockerClient, *, context: pathlib.Path, containerfile: pathlib.Path,
                         tag: str) -> str:
    """Build CONTAINERFILE in CONTEXT on the local Python base, without network; returns TAG."""
    try:
        c.images.get(PYTHON_BASE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{PYTHON_BASE} is missing: run scripts/build-images.sh (make images)")
    (context / "Containerfile").write_bytes(containerfile.read_bytes())
    c.images.build(path=str(context), dockerfile="Containerfile", tag=tag, buildargs={"BASE": PYTHON_BASE},
                   rm=True, network_mode="none")
    return tag
