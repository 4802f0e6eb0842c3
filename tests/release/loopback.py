"""A registry of the tests' own on this machine's loopback (distribution's `registry`, the one the
local cluster runs, over plain HTTP on 127.0.0.1), and reading back what it serves: the release
tests push to it as `make release` pushes to a team's registry."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

from devcluster import local
from release import contexts


@contextlib.contextmanager
def registry(workdir: pathlib.Path) -> Iterator[str]:
    """host:port of a registry storing into WORKDIR on 127.0.0.1, stopped at the end."""
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


def served(registry: str, path: str, accept: str) -> bytes:
    request = urllib.request.Request(f"http://{registry}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())


def registries_conf(registry: str, path: pathlib.Path) -> pathlib.Path:
    """A registries.conf at PATH that takes REGISTRY over plain HTTP (for podman and skopeo alike)."""
    path.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    return path


def plain_http(registry: str, tmp_path: pathlib.Path) -> dict[str, str]:
    """podman's environment with REGISTRY taken over plain HTTP (`podman manifest inspect` has no
    --tls-verify), in a registries.conf of the test's own."""
    return {**os.environ, "CONTAINERS_CONF": str(contexts.REPO / "scripts" / "containers.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(registries_conf(registry, tmp_path / "registries.conf"))}
