"""The dispatcher's release image (built as the release builds it: `make release-images`), a
minimal root on the local Python base (images/mkroot.py: no shell), run as a container through
the Docker Engine API (tests/containers.py): non-root, a read-only root filesystem, every module
it carries imports, at most 60 MB, a missing setting is one line and exit 2, and the Deployment's
liveness command (dispatcher.alive on the heartbeat file) runs in it as the kubelet would exec it."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator

import docker
import pytest
import yaml

from release import contexts
from tests import containers

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "deployments" / "k8s" / "base" / "dispatcher" / "deployment.yaml"


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    with containers.client() as c:
        yield c


@pytest.fixture(scope="module")
def image() -> str:
    return containers.release_image("dispatcher")


def test_the_image_runs_non_root_and_refuses_a_missing_variable_in_one_line(
    client: docker.DockerClient, image: str
) -> None:
    config = client.images.get(image).attrs["Config"]
    assert config["User"] == "65532:65532"
    assert "MALLOC_ARENA_MAX=2" in config["Env"]  # two malloc arenas, not one per thread (see the Containerfile)
    refused = containers.run_to_end(client, image, network_mode="none", read_only=True)
    assert (refused.exit_code, refused.stderr) == (2, b"dispatcher: TCAB_BACKEND_URL is required and not set\n")
    # The whole import graph (kubernetes client included) loads inside the image.
    probe = ["-c", "import dispatcher.app, kubernetes; print(kubernetes.__version__)"]
    ran = containers.run_to_end(client, image, probe, entrypoint=["python3"], network_mode="none", read_only=True)
    assert (ran.exit_code, ran.stdout.decode().strip()) == (0, "37.0.2"), ran.stderr


def test_every_module_the_image_carries_imports_and_it_has_no_shell(client: docker.DockerClient, image: str) -> None:
    carried, failures = containers.import_every_module(client, image)
    assert failures == [] and carried > 1000, (carried, failures)
    containers.assert_no_shell(client, image)
    assert contexts.size_bytes(image) <= 60_000_000, contexts.size_bytes(image)  # the target (docs/benchmarks.md)


def test_the_deployment_s_liveness_command_runs_in_the_image_on_the_heartbeat(
        client: docker.DockerClient, image: str, tmp_path: pathlib.Path) -> None:
    """The exact exec command of the shipped livenessProbe, in the image (no shell), with a directory
    mounted where the heartbeat is: 1 and one line while the file is missing, 0 once it is fresh."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    command = deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
    heartbeat = pathlib.PurePosixPath(command[-1])
    beats = tmp_path / "beats"
    beats.mkdir(mode=0o755)
    run = {"entrypoint": command[:1], "network_mode": "none", "read_only": True,
           "volumes": {str(beats): {"bind": str(heartbeat.parent), "mode": "ro"}}}
    missing = containers.run_to_end(client, image, command[1:], **run)
    assert (missing.exit_code, missing.stdout) == (1, b"")
    assert missing.stderr == f"dispatcher.alive: heartbeat {heartbeat} does not exist\n".encode()
    (beats / heartbeat.name).touch(mode=0o644)
    fresh = containers.run_to_end(client, image, command[1:], **run)
    assert (fresh.exit_code, fresh.stdout, fresh.stderr) == (0, b"", b"")


def test_the_dispatcher_runs_in_the_image_until_sigterm_then_exits_0(
        client: docker.DockerClient, image: str, tmp_path: pathlib.Path) -> None:
    """Past its settings, the dispatcher builds its worker pool and turns its loop (the modules a
    run imports on first use included, which importing every module does not reach), with no
    apiserver or backend to answer; SIGTERM stops it with exit 0, its last line `stopped`."""
    config = tmp_path / "config"
    config.mkdir(mode=0o755)
    (config / "kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "default"}}]}))
    (config / "kubeconfig").chmod(0o644)
    environment = {"TCAB_BACKEND_URL": "http://127.0.0.1:1", "TCAB_BACKEND_SERVICE_TOKEN": "s" * 32,
                   "TCAB_DISPATCHER_DRIVER_IMAGE": "dispatch/test-driver:unreleased",
                   "KUBECONFIG": "/config/kubeconfig"}
    container = client.containers.run(image, detach=True, network_mode="none", read_only=True,
                                      environment=environment, volumes={str(config): {"bind": "/config", "mode": "ro"}})
    try:
        deadline = time.monotonic() + 60
        while b'"started"' not in container.logs(stdout=False, stderr=True):
            container.reload()
            assert container.status == "running" and time.monotonic() < deadline, container.logs()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # a few turns of the loop, each failing to reach the apiserver and the backend
        container.reload()
        assert container.status == "running", container.logs()[-3000:]
        container.kill(signal="SIGTERM")
        status = container.wait(timeout=60)
        lines = container.logs(stdout=False, stderr=True).decode().splitlines()
        assert status["StatusCode"] == 0, lines[-20:]
        assert json.loads(lines[-1])["message"] == "stopped", lines[-5:]
    finally:
        container.remove(force=True)
