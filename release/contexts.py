"""Build contexts of our own images, and building them with podman, for what
builds them outside scripts/build-images.sh: the release (release/images.py), the
local cluster's release images (devcluster/install.py), bench/sidecar (the size of
each image beside the sample trainer's) and the image tests; the local cluster's
registry and DNS run podman with `podman` here too.

Part of the release, which imports nothing of the local cluster: devcluster uses
this module, never the other way (tests/lint/test_layers.py).

A context holds only what its Containerfile copies:
  sidecar     src/sidecar/, src/toolkit/ and images/mkroot.py
  controller  src/controller/, src/toolkit/, src/wheels/ of its third-party
              dependencies (`pip wheel` on the host, at constraints.txt's versions)
              and images/mkroot.py
  dispatcher  src/dispatcher/, src/toolkit/, src/wheels/ of the client it uses
              and images/mkroot.py
  test-driver images/test-driver/driver (the reference driver the dispatcher's Jobs run)
The three Python images are minimal roots: their build stage runs images/mkroot.py,
which keeps only what the entry point imports. Every Containerfile takes its base
as the build argument BASE; here the local Python base that scripts/build-images.sh
makes (no registry is reachable), and its busybox base for the test driver.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
IMAGES = REPO / "images"
PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"
BUSYBOX_BASE = "localhost/dispatch-base/busybox:1.35-static"
# The build stage of the Python images carries this label, so that its image can be removed.
BUILD_STAGE_LABEL = "dispatch.stage=python-build"
_NO_CACHE = shutil.ignore_patterns("__pycache__")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """podman with the project's own containers.conf, as scripts/build-images.sh runs it (never /etc's)."""
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "scripts" / "containers.conf")}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _pip_wheel(dest: pathlib.Path, *requirements: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(dest), *requirements],
                   check=True, capture_output=True, timeout=600)


# The third-party distributions each image's package imports (their own dependencies come along).
DEPENDENCIES = {
    "controller": ("kubernetes", "urllib3", "click", "PyYAML", "prometheus-client", "cryptography"),
    "dispatcher": ("kubernetes", "urllib3"),
}


def _python_context(dest: pathlib.Path, package: str) -> pathlib.Path:
    for name in (package, "toolkit"):
        shutil.copytree(REPO / name, dest / "src" / name, ignore=_NO_CACHE)
    release_data = dest / "src" / "toolkit" / "data" / "release.json"
    release_data.unlink(missing_ok=True)  # a checkout's recorded release is not part of any image
    shutil.copy(IMAGES / "mkroot.py", dest / "mkroot.py")
    if package in DEPENDENCIES:
        _pip_wheel(dest / "src" / "wheels", "-c", str(REPO / "constraints.txt"), *DEPENDENCIES[package])
    return IMAGES / f"{package}.Containerfile"


def sidecar_context(dest: pathlib.Path) -> pathlib.Path:
    return _python_context(dest, "sidecar")


def dispatcher_context(dest: pathlib.Path) -> pathlib.Path:
    return _python_context(dest, "dispatcher")


def controller_context(dest: pathlib.Path) -> pathlib.Path:
    return _python_context(dest, "controller")


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
    if component in ("sidecar", "controller", "dispatcher"):
        remove_build_stage()
    return tag


def remove_build_stage() -> None:
    """Remove the Python images' build stage images (podman keeps them; ~180 MB or more each)."""
    ids = podman("images", "-q", "--filter", f"label={BUILD_STAGE_LABEL}").stdout.split()
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
