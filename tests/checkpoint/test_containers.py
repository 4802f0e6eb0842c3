"""Two real containers sharing one volume: an old execution (A=1, J=0) and
its replacement (A=2, J=0) of one TrainJob, each the sample trainer run
through the prologue (`toolkit wrap`), each publishing a checkpoint into the
same host directory through the fence. The old one stages its checkpoint
first and publishes late, after its replacement has published: it is refused
(exit 1, one line), and the replacement's checkpoint stands.

The image is localhost/dispatch/sample-trainer:python (scripts/build-images.sh:
the sample trainer on the local Python base, with dispatch_fence), run
through the Docker Engine API (the docker SDK against podman's service, as
tests/images/ do). A missing or stale image fails, never skips.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import time
from collections.abc import Iterator

import docker
import docker.errors
import docker.models.containers
import pytest

from tests import containers
from dispatch_fence import checkpoint
from tests.checkpoint import kit
from toolkit import wrap

pytestmark = pytest.mark.images

IMAGE = "localhost/dispatch/sample-trainer:python"
TRAINER_USER = (65532, 65532)  # the image's USER (images/sample-trainer.Containerfile)
SHIPPED = "/usr/local/lib/dispatch/dispatch_fence"  # the fence's POSIX files (kit.POSIX_FILES) in the image
PREFIX = {"DISPATCH_K8S_EPOCH_PREFIX": "2000007", "DISPATCH_K8S_TOKEN_PREFIX": "llama-ft.7.0"}
OLD = {**PREFIX, "DISPATCH_K8S_ADMISSION": "1", "DISPATCH_K8S_RESTART": "0"}  # epoch 2000007000001
NEW = {**PREFIX, "DISPATCH_K8S_ADMISSION": "2", "DISPATCH_K8S_RESTART": "0"}  # epoch 2000007000002


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    with containers.client(timeout=120) as c:
        try:
            c.images.get(IMAGE)
        except docker.errors.ImageNotFound:
            pytest.fail(f"{IMAGE} is missing: run scripts/build-images.sh (make images)")
        listed = containers.run_to_end(c, IMAGE, ["sh", "-c", f"cd {SHIPPED} && sha256sum *.py"],
                                       network_mode="none").stdout.decode()
        shipped = {name: digest for digest, name in (line.split() for line in listed.splitlines())}
        wanted = {name: hashlib.sha256((kit.FENCE / name).read_bytes()).hexdigest() for name in kit.POSIX_FILES}
        if shipped != wanted:
            differ = sorted(n for n in shipped.keys() | wanted.keys() if shipped.get(n) != wanted.get(n))
            pytest.fail(f"{IMAGE} carries other fence files than fence/dispatch_fence/ ({', '.join(differ)}): "
                        "run scripts/build-images.sh (make images)")
        yield c


def volume(tmp_path: pathlib.Path) -> pathlib.Path:
    """The shared checkpoint volume, writable by the image's non-root user (as fsGroup makes it)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, *TRAINER_USER)
    return shared


def start(client: docker.DockerClient, shared: pathlib.Path, env: dict[str, str],
          *args: str) -> docker.models.containers.Container:
    """The sample trainer through the prologue, as a TrainJob's trainer container runs it."""
    return client.containers.run(
        IMAGE, wrap.argv(["train", "--epochs", "3", "--checkpoint", "/ckpt", *args]), environment=env,
        volumes={str(shared): {"bind": "/ckpt", "mode": "rw"}}, network_mode="none", detach=True)


def finish(c: docker.models.containers.Container) -> tuple[int, str, str]:
    """Wait for C; its exit status, stdout and stderr. C is removed."""
    try:
        code = c.wait(timeout=60)["StatusCode"]
        return code, c.logs(stdout=True, stderr=False).decode(), c.logs(stdout=False, stderr=True).decode()
    finally:
        remove(c)


def remove(c: docker.models.containers.Container) -> None:
    try:
        c.remove(force=True)
    except docker.errors.NotFound:
        pass


def wait_for(path: pathlib.Path, c: docker.models.containers.Container) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        c.reload()
        assert c.status == "running" and time.monotonic() < deadline, c.logs().decode()
        time.sleep(0.05)


def test_the_old_execution_s_late_save_is_refused_and_the_new_one_stands(client: docker.DockerClient,
                                                                         tmp_path: pathlib.Path) -> None:
    shared = volume(tmp_path)
    old = start(client, shared, OLD, "--save-after", "/ckpt/.go")
    try:
        # The old execution has its checkpoint written and is slow to publish it ...
        wait_for(shared / ".staging-llama-ft.7.0.1.0" / checkpoint.MARKER, old)
        # ... while its replacement starts, trains, and publishes.
        code, out, err = finish(start(client, shared, NEW))
        new_name = "ckpt-0000002000007000002-000001-llama-ft.7.0.2.0"
        assert (code, err) == (0, ""), out + err
        assert out.splitlines() == [
            "pid=1 cwd=/ DISPATCH_EPOCH=2000007000002 DISPATCH_ATTEMPT=llama-ft.7.0.2.0 "
            "args=--epochs 3 --checkpoint /ckpt",
            "train: staged /ckpt/.staging-llama-ft.7.0.2.0",
            f"/ckpt/{new_name}",
        ]
        before = kit.tree(shared)
        (shared / ".go").touch()  # now the old one publishes: late
        code, out, err = finish(old)
    finally:
        remove(old)
    assert code == 1, out + err
    assert out.splitlines()[0] == ("pid=1 cwd=/ DISPATCH_EPOCH=2000007000001 DISPATCH_ATTEMPT=llama-ft.7.0.1.0 "
                                   "args=--epochs 3 --checkpoint /ckpt --save-after /ckpt/.go")
    assert err == (f"python -m dispatch_fence publish: epoch 2000007000001 is lower than epoch 2000007000002 "
                   f"({new_name}) in /ckpt: a superseded execution's save, refused; nothing published\n")
    # The new one's stands: LATEST and its checkpoint as they were; the old staging is left whole.
    assert kit.tree(shared) == before | {".go": ""}
    found = checkpoint.latest(shared)
    assert found is not None and found.name == new_name and found.epoch == 2000007000002
    assert (shared / new_name / "model.txt").read_text() == "weights of llama-ft.7.0.2.0, epoch 2000007000002\n"
    assert (shared / ".staging-llama-ft.7.0.1.0" / "model.txt").read_text() == (
        "weights of llama-ft.7.0.1.0, epoch 2000007000001\n")


def test_a_lock_held_outside_the_container_holds_its_publish(client: docker.DockerClient,
                                                             tmp_path: pathlib.Path) -> None:
    # The flock on the shared volume is one lock for every container on the node (and the host).
    shared = volume(tmp_path)
    fd = os.open(shared / checkpoint.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    os.fchown(fd, *TRAINER_USER)  # every rank of a job runs as one user: the lock is theirs
    fcntl.flock(fd, fcntl.LOCK_EX)
    c = None
    try:
        c = start(client, shared, NEW)
        wait_for(shared / ".staging-llama-ft.7.0.2.0" / checkpoint.MARKER, c)
        time.sleep(1.0)
        c.reload()
        assert c.status == "running" and checkpoint.latest(shared) is None  # waiting for the lock
    except BaseException:
        if c is not None:
            remove(c)
        raise
    finally:
        os.close(fd)
    code, out, err = finish(c)
    assert (code, err) == (0, "") and checkpoint.latest(shared).epoch == 2000007000002  # type: ignore[union-attr]
