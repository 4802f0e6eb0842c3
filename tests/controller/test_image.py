"""The controller image (images/controller.Containerfile) builds with podman
on the local Python base, runs as non-root on a read-only root filesystem,
loads its whole import graph, and refuses a missing cluster config in one
line. Its behaviour against a cluster is proven by the process tests here."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"
IMAGE = "localhost/dispatch/controller:test"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "scripts/containers.conf")}

pytestmark = pytest.mark.images


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=ENV, check=True, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    podman("image", "exists", PYTHON_BASE)  # made by scripts/build-images.sh (make images)
    context = tmp_path_factory.mktemp("controller-context")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(context / "wheels"),
                    str(REPO)], check=True, capture_output=True, timeout=600)
    podman("build", "--isolation", "chroot", "-q", "--build-arg", f"BASE={PYTHON_BASE}", "-t", IMAGE,
           "-f", str(REPO / "images/controller.Containerfile"), str(context))
    return IMAGE


def run(image: str, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return subprocess.run(["podman", "run", "--rm", "--read-only", "--network", "none", *extra, image, *args],
                          env=ENV, capture_output=True, text=True, timeout=120)


def test_the_image_runs_non_root_with_its_whole_import_graph(image: str) -> None:
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == "65532:65532"
    proc = run(image, "-c", "import toolkit.controller.app, kubernetes, prometheus_client; "
               "from toolkit import prologue; print(kubernetes.__version__, len(prologue.text()) > 0)",
               entrypoint="python3")
    assert (proc.returncode, proc.stdout.strip()) == (0, "37.0.2 True"), proc.stderr


def test_the_image_refuses_a_missing_cluster_config_in_one_line(image: str) -> None:
    proc = run(image, "--kubeconfig", "/nonexistent")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "Error: --kubeconfig: cannot load a cluster config from /nonexistent: "
        "Invalid kube-config file. No configuration found."
    ]
