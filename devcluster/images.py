"""Build contexts of our own images, and building them with podman, for what
builds them outside scripts/build-images.sh: bench/sidecar (the size of each
image beside the sample trainer's) and the image tests.

A context holds only what its Containerfile copies:
  sidecar     sidecar/, toolkit/ and images/sidecar/mkroot.py (the build stage
              keeps only what the sidecar imports)
  dispatcher  dispatcher/, the toolkit modules the Containerfile names, and
              wheels/ of the client it uses (`pip wheel`, on the host)
  controller  wheels/ of the project and its dependencies (`pip wheel .`)
  test-driver images/test-driver/driver (the reference driver the dispatcher's Jobs run)
Every Containerfile takes its base as the build argument BASE; here the local
Python base that scripts/build-images.sh makes (no registry is reachable), and
its busybox base for the test driver.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
IMAGES = REPO / "images"
PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"
BUSYBOX_BASE = "localhost/dispatch-base/busybox:1.35-static"
# The build stage of images/sidecar.Containerfile carries this label, so that its image can be removed.
SIDECAR_BUILD_STAGE_LABEL = "dispatch.stage=sidecar-build"
_NO_CACHE = shutil.ignore_patterns("__pycache__")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """podman with the project's own containers.conf, as scripts/build-images.sh runs it (never /etc's)."""
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "scripts" / "containers.conf")}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _pip_wheel(dest: pathlib.Path, *requirements: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(dest), *requirements],
                   check=True, capture_output=True, timeout=600)


def sidecar_context(dest: pathlib.Path) -> pathlib.Path:
    for package in ("sidecar", "toolkit"):
        shutil.copytree(REPO / package, dest / package, ignore=_NO_CACHE)
    shutil.copy(IMAGES / "sidecar" / "mkroot.py", dest / "mkroot.py")
    return IMAGES / "sidecar.Containerfile"


def dispatcher_context(dest: pathlib.Path) -> pathlib.Path:
    containerfile = IMAGES / "dispatcher.Containerfile"
    shutil.copytree(REPO / "dispatcher", dest / "dispatcher", ignore=_NO_CACHE)
    (dest / "toolkit").mkdir()
    for path in re.findall(r"toolkit/\w+\.py", containerfile.read_text()):  # the modules it copies, read from it
        shutil.copy(REPO / path, dest / path)
    _pip_wheel(dest / "wheels", "kubernetes==37.0.2", "urllib3==2.8.0")
    return containerfile


def controller_context(dest: pathlib.Path) -> pathlib.Path:
    _pip_wheel(dest / "wheels", str(REPO))
    return IMAGES / "controller.Containerfile"


def test_driver_context(dest: pathlib.Path) -> pathlib.Path:
    (dest / "images" / "test-driver").mkdir(parents=True)
    shutil.copy(IMAGES / "test-driver" / "driver", dest / "images" / "test-driver" / "driver")
    return IMAGES / "test-driver.Containerfile"


CONTEXTS = {"sidecar": sidecar_context, "dispatcher": dispatcher_context, "controller": controller_context,
            "test-driver": test_driver_context}
BASES = {"test-driver": BUSYBOX_BASE}


def build(component: str, *, tag: str, workdir: pathlib.Path, labels: dict[str, str] | None = None) -> str:
    """Build COMPONENT's image as TAG with podman (a context made in WORKDIR), with LABELS; returns TAG."""
    context = workdir / f"{component}-context"
    context.mkdir()
    containerfile = CONTEXTS[component](context)
    done = podman("build", "-q", "--isolation", "chroot", "--build-arg", f"BASE={BASES.get(component, PYTHON_BASE)}",
                  *(f"--label={k}={v}" for k, v in (labels or {}).items()),
                  "-f", str(containerfile), "-t", tag, str(context), timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"podman build of {component} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    if component == "sidecar":
        remove_sidecar_build_stage()
    return tag


def remove_sidecar_build_stage() -> None:
    """Remove the sidecar build stage's images (podman keeps them; ~180 MB each)."""
    ids = podman("images", "-q", "--filter", f"label={SIDECAR_BUILD_STAGE_LABEL}").stdout.split()
    if ids:
        podman("rmi", *ids)


def size_bytes(image: str) -> int:
    """The image's uncompressed size as podman reports it (the sum of its layers)."""
    done = podman("image", "inspect", "--format", "{{.Size}}", image)
    if done.returncode != 0:
        raise RuntimeError(f"{image}: {done.stderr.strip()} (make images builds it)")
    return int(done.stdout.strip())


def remove(image: str) -> None:
    podman("rmi", image)
