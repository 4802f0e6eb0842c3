"""The Docker Engine API path to the local images: the docker SDK against
podman's Docker-compatible service (scripts/podman-service.sh, which
scripts/run-tests.sh sources so that DOCKER_HOST names it).

Python code that runs images (toolkit check-image, the e2e runner) goes this
way, so this proves the path itself: the service answers, the project's
images are visible through it, and a container started through it runs the
prologue as PID 1 with its output and exit status read back. No DOCKER_HOST
is a failure, never a skip.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from tests import containers

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]
PROLOGUE = (REPO / "prologue" / "prologue.sh").read_text()
BUSYBOX = "localhost/dispatch-base/busybox:1.35-static"
SCRATCH = "localhost/dispatch-base/scratch:no-sh"
ENV = {
    "DISPATCH_K8S_ADMISSION": "2",
    "DISPATCH_K8S_RESTART": "1",
    "DISPATCH_K8S_EPOCH_PREFIX": "1000003",
    "DISPATCH_K8S_TOKEN_PREFIX": "job-9.3.0",
}


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    with containers.client() as c:
        yield c


def entry(*command: str) -> list[str]:
    """The trainer container's command line: the prologue, then COMMAND."""
    return ["/bin/sh", "-c", PROLOGUE, "dispatch-prologue", *command]


def test_the_busybox_image_runs_the_prologue_as_pid_1_through_the_docker_api(
    client: docker.DockerClient,
) -> None:
    ran = containers.run_to_end(client, BUSYBOX, entry("sh", "-c", 'echo "pid=$$ $DISPATCH_EPOCH $DISPATCH_ATTEMPT"'),
                                environment=ENV, network_mode="none")
    assert (ran.exit_code, ran.stdout) == (0, b"pid=1 1000003000003 job-9.3.0.2.1\n")


def test_a_refusal_reaches_the_docker_api_as_exit_125_with_its_one_line(client: docker.DockerClient) -> None:
    ran = containers.run_to_end(client, BUSYBOX, entry("sh", "-c", "echo ran"),
                                environment={**ENV, "DISPATCH_K8S_ADMISSION": "010"}, network_mode="none")
    assert (ran.exit_code, ran.stdout) == (125, b"")
    stderr = ran.stderr.decode()
    assert stderr.startswith("dispatch: DISPATCH_K8S_ADMISSION ") and stderr.count("\n") == 1


def test_an_image_without_bin_sh_cannot_start_through_the_docker_api(client: docker.DockerClient) -> None:
    container = client.containers.create(SCRATCH, entry("/hello"), environment=ENV, network_mode="none")
    try:
        with pytest.raises(docker.errors.APIError) as caught:
            container.start()
        assert "stat /bin/sh: no such file or directory" in str(caught.value)
        container.reload()
        assert container.status == "created"  # it never ran
    finally:
        container.remove(force=True)


@pytest.mark.parametrize("flavour", ["busybox", "alpine", "debian", "python"])
def test_the_sample_trainer_runs_as_a_non_root_user_that_can_write_its_checkpoint_dir(
        client: docker.DockerClient, flavour: str) -> None:
    image = f"localhost/dispatch/sample-trainer:{flavour}"
    assert client.images.get(image).attrs["Config"]["User"] == "65532:65532"
    # Shell built-ins only: the alpine flavour's busybox has neither touch nor id.
    script = (': > /work/checkpoints/probe && '
              'while read -r key uid _; do if [ "$key" = Uid: ]; then echo "$uid"; fi; done < /proc/self/status')
    ran = containers.run_to_end(client, image, ["/bin/sh", "-c", script], network_mode="none")
    assert (ran.exit_code, ran.stdout.decode().split()) == (0, ["65532"]), ran.stderr
