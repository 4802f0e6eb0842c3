"""The tests' one way to build and run images: the docker SDK against
podman's Docker-compatible service (docs/images.md). scripts/run-tests.sh
sources scripts/podman-service.sh, which sets DOCKER_HOST; without it, or
without the local Python base (scripts/build-images.sh), a test fails, never
skips.

A container that runs to its end is run by `run_to_end`, never by the SDK's
attached `containers.run`: that follows the log stream until the engine
closes it, and podman's service sometimes never closes it for a container
that exits at once (seen: a test blocked in the stream for its whole
600 s timeout, the container long gone). `run_to_end` starts it detached,
waits for its exit with a bound, and reads the finished log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from collections.abc import Iterator
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class Ended:
    exit_code: int
    stdout: bytes
    stderr: bytes


def run_to_end(c: docker.DockerClient, image: str, command: list[str] | None = None, *, timeout: float = 120,
               **kwargs: Any) -> Ended:
    """Run IMAGE (with COMMAND) detached until it exits, at most TIMEOUT seconds; its exit code and
    its output. The container is removed on every path."""
    container = c.containers.run(image, command, detach=True, **kwargs)
    try:
        code = container.wait(timeout=timeout)["StatusCode"]
        return Ended(code, container.logs(stdout=True, stderr=False), container.logs(stdout=False, stderr=True))
    finally:
        container.remove(force=True)
