"""The dispatcher image, built with podman on a local Python base, run as a container."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"
IMAGE = "localhost/dispatch/dispatcher:test"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "scripts/containers.conf")}


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=ENV, check=True, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    podman("image", "exists", PYTHON_BASE)  # made by scripts/build-images.sh (make images)
    context = tmp_path_factory.mktemp("dispatcher-context")
    shutil.copytree(REPO / "dispatcher", context / "dispatcher", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(context / "wheels"),
                    "kubernetes==37.0.2", "urllib3==2.8.0"], check=True, capture_output=True, timeout=600)
    podman("build", "--isolation", "chroot", "-q", "--build-arg", f"BASE={PYTHON_BASE}", "-t", IMAGE,
           "-f", str(REPO / "images/dispatcher.Containerfile"), str(context))
    return IMAGE


def test_the_image_runs_non_root_and_refuses_a_missing_variable_in_one_line(image: str) -> None:
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == "65532:65532"
    proc = subprocess.run(["podman", "run", "--rm", "--read-only", "--network", "none", image], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (2, "dispatcher: TCAB_BACKEND_URL is required and not set\n")
    # The whole import graph (kubernetes client included) loads inside the image.
    proc = subprocess.run(["podman", "run", "--rm", "--read-only", "--network", "none", "--entrypoint", "python3",
                           image, "-c", "import dispatcher.app, kubernetes; print(kubernetes.__version__)"],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "37.0.2"), proc.stderr
