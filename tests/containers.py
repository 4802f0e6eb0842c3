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
import functools
import os
import pathlib
import tempfile
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


# Run in an image made by images/mkroot.py, with its interpreter as its entry point runs it (-S -E
# -B): imports every module whose bytecode the image carries under /opt/dispatch or in the zip
# archive on the interpreter's path (ours and the third-party ones: the whole closure mkroot kept),
# each in turn, and prints how many and each that failed. A module the image carries whose own
# imports are missing fails here, not in production.
EVERY_MODULE = """
import importlib, pathlib, sys, zipfile
root = pathlib.Path("/opt/dispatch")
files = [str(p.relative_to(root)) for p in root.rglob("*.pyc")]
for entry in sys.path:
    if entry.endswith(".zip") and pathlib.Path(entry).is_file():
        files += [n for n in zipfile.ZipFile(entry).namelist() if n.endswith(".pyc")]
names = sorted({n.removesuffix(".pyc").replace("/", ".").removesuffix(".__init__") for n in files} - {"__init__"})
failed = {}
for name in names:
    if name.rpartition(".")[2] == "__main__":
        continue
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = repr(exc)
print(len(names), len(failed))
for name, why in sorted(failed.items()):
    print(name, why)
"""


def import_every_module(c: docker.DockerClient, image: str) -> tuple[int, list[str]]:
    """How many modules IMAGE carries (EVERY_MODULE), and a line for each that does not import."""
    ran = run_to_end(c, image, ["-c", EVERY_MODULE], entrypoint=["/usr/bin/python3.11", "-S", "-E", "-B"],
                     network_mode="none", read_only=True, user="65532:65532")
    assert ran.exit_code == 0, ran.stderr
    first, *failures = ran.stdout.decode().splitlines()
    return int(first.split()[0]), failures


def assert_no_shell(c: docker.DockerClient, image: str) -> None:
    """IMAGE has no /bin/sh: the runtime cannot start one (the container is created, never runs)."""
    shell = c.containers.create(image, ["-c", "true"], entrypoint=["/bin/sh"], network_mode="none")
    try:
        with pytest.raises(docker.errors.APIError, match="/bin/sh"):
            shell.start()
    finally:
        shell.remove(force=True)


@functools.cache
def release_image(name: str) -> str:
    """This checkout's release image NAME (release/images.py) in local storage: what the release
    ships and the cluster runs. `make release-images` builds them; one missing or built from other
    files is built now."""
    from devcluster import install  # its imports (the kubernetes client) only for the tests that ask
    from release import bundle, version

    with tempfile.TemporaryDirectory(prefix="dispatch-release-images-") as tmp:
        return install.release_images(version.describe(bundle.REPO), pathlib.Path(tmp))[name]


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
