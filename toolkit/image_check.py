"""check-image: prove that an image (or a root filesystem) runs the prologue.

It runs, in the target, exactly what a trainer container runs:

    /bin/sh -c <prologue> dispatch-prologue /bin/sh -c <probe>

with sample Downward API values (A = 3, J = 2, G = 1, N = 4, attempt 7,
workdir /), and the probe prints what the command saw: DISPATCH_EPOCH,
DISPATCH_ATTEMPT, the directory it runs in and whether any DISPATCH_K8S_*
variable leaked. The check passes when all four are what `identity` says
they must be. This catches an image without /bin/sh, a /bin/sh that is not
POSIX enough for the prologue, and an entrypoint wrapper that gets in the way
(the entrypoint is replaced, as Trainer replaces it with spec.trainer.command).

An image runs through the Docker Engine API (the `docker` SDK, imported
here only: DOCKER_HOST names Docker or podman's Docker-compatible service).
It is never pulled: a pipeline checks the image it just built. A directory
runs through `chroot DIR /bin/sh ...`, which needs root, and needs
DIR/dev/null as a container runtime would provide it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from toolkit import identity, names, wrap

SAMPLE_JOB_ID = "check-image.job"
SAMPLE = {"generation": 1, "submission": 4, "attempt": 7, "admission": 3, "restart": 2}
SAMPLE_WORKDIR = "/"
# Built-ins only, so it needs nothing beyond the /bin/sh the prologue needs.
PROBE = (
    'leak=none; for v in ADMISSION RESTART EPOCH_PREFIX TOKEN_PREFIX WORKDIR R E G N; do '
    'eval "[ -n \\"\\${DISPATCH_K8S_$v+set}\\" ]" && leak=DISPATCH_K8S_$v; done; '
    'echo "epoch=${DISPATCH_EPOCH-}"; echo "attempt=${DISPATCH_ATTEMPT-}"; echo "pwd=$PWD"; echo "leak=$leak"'
)


class CheckFailed(Exception):
    """The target cannot run the prologue as it must; one line."""


class TargetError(ValueError):
    """The target does not exist (bad input, exit 2)."""


def sample_env() -> dict[str, str]:
    s = SAMPLE
    return {
        names.ENV_ADMISSION: str(s["admission"]),
        names.ENV_RESTART: str(s["restart"]),
        names.ENV_EPOCH_PREFIX: identity.epoch_prefix(generation=s["generation"], submission=s["submission"]),
        names.ENV_TOKEN_PREFIX: identity.token_prefix(
            job_id=SAMPLE_JOB_ID, submission=s["submission"], attempt=s["attempt"]
        ),
        names.ENV_WORKDIR: SAMPLE_WORKDIR,
    }


def expected() -> dict[str, str]:
    s = SAMPLE
    return {
        "epoch": str(
            identity.execution_epoch(
                generation=s["generation"], submission=s["submission"], admission=s["admission"], restart=s["restart"]
            )
        ),
        "attempt": identity.attempt_token(
            job_id=SAMPLE_JOB_ID,
            submission=s["submission"],
            attempt=s["attempt"],
            admission=s["admission"],
            restart=s["restart"],
        ),
        "pwd": SAMPLE_WORKDIR,
        "leak": "none",
    }


def argv() -> list[str]:
    return wrap.argv([wrap.SHELL, "-c", PROBE])


def verdict(*, target: str, status: int, stdout: str, stderr: str) -> str:
    """The summary of a passing run, or CheckFailed naming the first difference."""
    if status != 0:
        line = next((ln for ln in stderr.splitlines() if ln.strip()), "no output on stderr")
        raise CheckFailed(f"{target}: the prologue exited {status}: {line}")
    seen: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            seen[key] = value
    for key, want in expected().items():
        if seen.get(key) != want:
            got = repr(seen[key]) if key in seen else "nothing"
            raise CheckFailed(f"{target}: the command saw {key} {got}, expected {want!r}")
    return f"DISPATCH_EPOCH={seen['epoch']} DISPATCH_ATTEMPT={seen['attempt']}"


def check(target: str, *, timeout: float = 60) -> str:
    """Run the check on an image name or a root filesystem directory."""
    if os.path.isdir(target):
        return check_rootfs(target, timeout=timeout)
    return check_image(target, timeout=timeout)


def check_rootfs(root: str, *, timeout: float = 60) -> str:
    if not os.path.lexists(os.path.join(root, "bin", "sh")):
        raise CheckFailed(f"{root}: no /bin/sh in this root filesystem; the prologue needs /bin/sh")
    if not os.path.exists(os.path.join(root, "dev", "null")):
        # Container runtimes provide /dev; a bare root filesystem often has none,
        # and the prologue's `cd DIR 2>/dev/null` needs it.
        raise CheckFailed(f"{root}: no /dev/null in this root filesystem (create it: mknod -m 666 {root}/dev/null c 1 3)")
    env: Mapping[str, str] = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **sample_env()}
    try:
        proc = subprocess.run(
            ["chroot", root, *argv()], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise CheckFailed("chroot is not installed (it checks a root filesystem directory)") from None
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{root}: the prologue did not finish within {timeout:g} s") from None
    if proc.returncode in (125, 126, 127) and proc.stderr.startswith("chroot:"):
        line = proc.stderr.splitlines()[0]
        raise CheckFailed(f"{root}: cannot run /bin/sh there: {line}")
    return verdict(target=root, status=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)


def check_image(image: str, *, timeout: float = 60) -> str:
    import docker
    import docker.errors
    import requests.exceptions

    try:
        client = docker.from_env(timeout=int(timeout) + 10)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        where = os.environ.get("DOCKER_HOST", "the default socket")
        raise CheckFailed(f"cannot reach the Docker API at {where}: {_first_line(exc)}") from None
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise TargetError(f"image {image} not found locally (check-image does not pull; build or pull it first)") from None
    except docker.errors.APIError as exc:
        raise CheckFailed(f"{image}: {_first_line(exc)}") from None

    container = None
    try:
        try:
            container = client.containers.create(
                image, entrypoint=argv(), command=[], environment=sample_env(), network_disabled=True, user="0"
            )
            container.start()
        except docker.errors.APIError as exc:
            text = _first_line(exc)
            if "/bin/sh" in text or "no such file" in text.lower() or "not found" in text.lower():
                raise CheckFailed(f"{image}: has no /bin/sh, which the prologue needs: {text}") from None
            raise CheckFailed(f"{image}: cannot start a container: {text}") from None
        try:
            status = int(container.wait(timeout=timeout)["StatusCode"])
        except requests.exceptions.RequestException:
            raise CheckFailed(f"{image}: the prologue did not finish within {timeout:g} s") from None
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        if status == 127 and "/bin/sh" in stderr:
            raise CheckFailed(f"{image}: has no /bin/sh, which the prologue needs: {_first_line(stderr)}")
        return verdict(target=image, status=status, stdout=stdout, stderr=stderr)
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
        client.close()


def _first_line(value: object) -> str:
    text = str(getattr(value, "explanation", None) or value)
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
