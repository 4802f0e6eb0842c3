"""check-image against the project's real images through the Docker API
(podman's Docker-compatible service: `. scripts/podman-service.sh` exports
DOCKER_HOST; scripts/build-images.sh builds the images), and against a root
filesystem directory through chroot. Nothing is skipped: no service or no
image fails."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess

import pytest
from click.testing import CliRunner

from toolkit import cli, image_check

pytestmark = pytest.mark.images

IMAGES = [
    "localhost/dispatch-base/busybox:1.35-static",
    "localhost/dispatch-base/alpine:busybox-1.35-ash-musl-static",
    "localhost/dispatch-base/debian:bookworm-minbase",
]
NO_SH = "localhost/dispatch-base/scratch:no-sh"


@pytest.fixture(scope="module", autouse=True)
def docker_api() -> None:
    assert os.environ.get("DOCKER_HOST"), "DOCKER_HOST is not set: source scripts/podman-service.sh first"


@pytest.mark.parametrize("image", IMAGES)
def test_images_with_sh_pass(image: str) -> None:
    r = CliRunner().invoke(cli.root, ["check-image", image])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == f"{image}: ok: DISPATCH_EPOCH=1000004000005 DISPATCH_ATTEMPT=check-image.job.4.7.3.2\n"


def test_image_without_sh_fails_in_one_line() -> None:
    r = CliRunner().invoke(cli.root, ["check-image", NO_SH])
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "has no /bin/sh" in r.stderr, r.stderr


def test_unknown_image_is_bad_input() -> None:
    r = CliRunner().invoke(cli.root, ["check-image", "localhost/dispatch/does-not-exist:1"])
    assert r.exit_code == 2 and "not found locally" in r.stderr


def test_a_wrong_answer_is_reported() -> None:
    with pytest.raises(image_check.CheckFailed, match="saw epoch '99', expected '1000004000005'"):
        image_check.verdict(target="t", status=0, stdout="epoch=99\n", stderr="")
    with pytest.raises(image_check.CheckFailed, match="exited 125: dispatch: no"):
        image_check.verdict(target="t", status=125, stdout="", stderr="dispatch: no\n")


def _rootfs(root: pathlib.Path, *, with_sh: bool) -> pathlib.Path:
    (root / "bin").mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is not installed"
    shutil.copy2(busybox, root / "bin" / "busybox")
    if with_sh:
        os.symlink("busybox", root / "bin" / "sh")
    (root / "dev").mkdir()
    os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return root


def test_rootfs_directory_via_chroot(tmp_path: pathlib.Path) -> None:
    root = _rootfs(tmp_path / "ok", with_sh=True)
    r = CliRunner().invoke(cli.root, ["check-image", str(root)])
    assert r.exit_code == 0, r.stderr
    assert "DISPATCH_EPOCH=1000004000005" in r.stdout
    bare = _rootfs(tmp_path / "bare", with_sh=False)
    r = CliRunner().invoke(cli.root, ["check-image", str(bare)])
    assert r.exit_code == 1 and "no /bin/sh" in r.stderr and r.stderr.count("\n") == 1
    os.unlink(root / "dev" / "null")
    r = CliRunner().invoke(cli.root, ["check-image", str(root)])
    assert r.exit_code == 1 and "no /dev/null" in r.stderr


def test_console_script_checks_an_image() -> None:
    toolkit = pathlib.Path(__file__).parents[2] / ".venv" / "bin" / "toolkit"
    out = subprocess.run([str(toolkit), "check-image", IMAGES[0]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
