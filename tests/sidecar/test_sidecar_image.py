"""The sidecar's release image (built as the release builds it: `make release-images`), run as a
container: a minimal root (the
interpreter, its libraries, the modules the sidecar imports; no shell) of at
most 30 MB, non-root, read-only root filesystem, against the real apiserver
(host network), and stopped with SIGTERM (exit 0).

Run through the Docker Engine API (the docker SDK against podman's
Docker-compatible service, docs/images.md; scripts/run-tests.sh sources
scripts/podman-service.sh, which sets DOCKER_HOST). The build stage runs on the
local Python base, localhost/dispatch-base/python (Debian's python3.11 packages
on the debootstrap minbase), made by scripts/build-images.sh: no registry is
reachable. The build context holds only what the Containerfile copies.
"""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import pytest

from tests import containers
from tests.lint import test_layers
from devcluster import harness
from tests.sidecar import test_sidecar_cluster as cluster
from toolkit import names, render

pytestmark = [pytest.mark.images, pytest.mark.cluster]

REPO = pathlib.Path(__file__).resolve().parents[2]
setup = cluster.setup  # the fixture: the shipped RBAC and a dispatch-sidecar token


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    # The timeout bounds every read, the log stream's too: a silent container fails the test.
    with containers.client(timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def image() -> str:
    return containers.release_image("sidecar")


class Lines:
    """A container's stderr as JSON lines, read from the followed log stream."""

    def __init__(self, stream: Iterator[bytes]) -> None:
        self._stream = stream
        self._buffer = b""
        self.lines: list[dict[str, Any]] = []

    def _next(self) -> dict[str, Any] | None:
        while b"\n" not in self._buffer:
            chunk = next(self._stream, None)
            if chunk is None:
                return None
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\n", 1)
        line: dict[str, Any] = json.loads(raw)
        self.lines.append(line)
        return line

    def wait_for(self, msg: str, *, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while sum(1 for line in self.lines if line["message"] == msg) < count:
            assert time.monotonic() < deadline, f"no {count} x {msg!r} in {self.lines}"
            assert self._next() is not None, f"the container ended before {count} x {msg!r}: {self.lines}"
        return [line for line in self.lines if line["message"] == msg]

    def drain(self) -> None:
        while self._next() is not None:
            pass


def test_image_is_non_root_small_and_has_no_shell(client: docker.DockerClient, image: str) -> None:
    attrs = client.images.get(image).attrs
    assert attrs["Config"]["User"] == "65532:65532"
    assert "PATH=/usr/bin" in attrs["Config"]["Env"]  # where the startupProbe's exec finds python3
    size_mb = attrs["Size"] / 1e6
    print(f"sidecar image: {size_mb:.1f} MB")
    assert size_mb <= 30
    # No shell: the runtime cannot start one (the container is created, never runs).
    shell = client.containers.create(image, ["-c", "true"], entrypoint=["/bin/sh"], network_mode="none")
    try:
        with pytest.raises(docker.errors.APIError, match="/bin/sh"):
            shell.start()
    finally:
        shell.remove(force=True)
    # Bad settings: the interpreter starts, the sidecar refuses them in one line and exits 2.
    refused = containers.run_to_end(client, image, network_mode="none", read_only=True,
                                    environment={"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                                 "DISPATCH_SIDECAR_INTERVAL_SECONDS": "soon"})
    assert (refused.exit_code, refused.stdout) == (2, b""), refused.stderr
    assert refused.stderr.decode().splitlines() == [
        "dispatch-sidecar: DISPATCH_SIDECAR_INTERVAL_SECONDS='soon': expected a number of seconds from 0.01 to 86400"]


def test_the_image_carries_the_toolkit_core_alone(client: docker.DockerClient, image: str) -> None:
    # What a check may load is what the image holds: of the toolkit, the core's modules
    # (docs/architecture.md) and none of the identity domain, the client or the operations.
    container = client.containers.create(image, network_mode="none")
    try:
        stream, _ = container.get_archive("/opt/dispatch/toolkit")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            files = [m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(".pyc")]
    finally:
        container.remove(force=True)
    modules = {"toolkit" if f == "toolkit/__init__.pyc" else f.removesuffix(".pyc").replace("/", ".")
               for f in files}
    assert {"toolkit", "toolkit.names", "toolkit.detect"} <= modules, files
    assert sorted(m for m in modules if test_layers.layer_of(m) != "core") == []


def test_runs_read_only_against_the_apiserver_and_stops_on_sigterm(
        client: docker.DockerClient, image: str, setup: cluster.Setup,
        control_plane: harness.ControlPlane | harness.ExistingCluster, tmp_path: pathlib.Path) -> None:
    name = f"tj-{uuid.uuid4().hex[:6]}"
    setup.custom.create_namespaced_custom_object(*cluster.TRAINER, setup.namespace, "trainjobs", cluster.trainjob(
        name, annotations={names.FLOOR_ANNOTATION: "3", names.JOBSET_UID_ANNOTATION: cluster.RECORDED}))
    podinfo = cluster.write_podinfo(tmp_path / "podinfo", pod=f"{name}-node-0-0-x", namespace=setup.namespace,
                                    labels={names.JOBSET_NAME_LABEL: name, names.RESTART_LABEL: "0",
                                            names.JOBSET_UID_LABEL: cluster.RECORDED},
                                    annotations={names.ADMISSION_ANNOTATION: "2"})
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    shutil.copy(setup.env["DISPATCH_SIDECAR_TOKEN_FILE"], secrets / "token")
    shutil.copy(setup.env["DISPATCH_SIDECAR_CA_FILE"], secrets / "ca.crt")
    for path in (*podinfo.iterdir(), *secrets.iterdir()):
        path.chmod(0o644)
    for directory in (tmp_path, podinfo, secrets):
        directory.chmod(0o755)
    container = client.containers.run(
        image, name=f"sidecar-{uuid.uuid4().hex[:8]}", detach=True, read_only=True, network_mode="host",
        cap_drop=["ALL"], security_opt=["no-new-privileges"],
        volumes={str(podinfo): {"bind": "/etc/dispatch/podinfo", "mode": "ro"},
                 str(secrets): {"bind": "/secrets", "mode": "ro"}},
        environment={"DISPATCH_SIDECAR_API_SERVER": setup.env["DISPATCH_SIDECAR_API_SERVER"],
                     "DISPATCH_SIDECAR_TOKEN_FILE": "/secrets/token", "DISPATCH_SIDECAR_CA_FILE": "/secrets/ca.crt",
                     "DISPATCH_SIDECAR_INTERVAL_SECONDS": "0.2",
                     names.SIDECAR_STARTED_ENV: names.SIDECAR_STARTED_FILE},  # as render.sidecar_container sets it
        # The pod's emptyDir for the file the startupProbe waits for (toolkit/render.py).
        tmpfs={names.SIDECAR_STATE_DIR: "mode=1777"})
    try:
        lines = Lines(container.logs(stream=True, follow=True, stdout=False, stderr=True))
        verdicts = lines.wait_for("verdict", count=2, timeout=60)
        # The startupProbe's own command, as the kubelet execs it (render.sidecar_container): the first
        # check has run, so it answers 0.
        probe = render.sidecar_container(image="sidecar:test")["startupProbe"]["exec"]["command"]
        assert container.exec_run(probe, user="65532:65532").exit_code == 0
        assert [v["verdict"] for v in verdicts] == ["violation", "violation"]
        assert [v["rules"] for v in verdicts] == [["below-floor"], ["below-floor"]]
        container.kill(signal="SIGTERM")
        assert container.wait(timeout=20)["StatusCode"] == 0
        lines.drain()
    finally:
        container.remove(force=True)
    assert lines.lines[-1]["message"] == "stop"
    assert lines.lines[-1]["reason"] == "SIGTERM"
    (event,) = setup.events(name)
    assert event.message.startswith("below-floor: pod ")
