"""Build contexts of our own images, and building them with podman, for what
builds them outside scripts/build-images.sh: the release (release/images.py), the
local cluster's release images (devcluster/install.py), bench/sidecar (the size of
each image beside the sample trainer's) and the image tests; the local cluster's
registry and DNS run podman with `podman` here too.

Part of the release, which imports nothing of the local cluster: devcluster uses
this module, never the other way (tests/lint/test_layers.py).

A context holds only what its Containerfile copies:
  sidecar     src/sidecar/, src/toolkit/ and mkroot/ (images/mkroot.py, images/elf.py)
  controller  src/controller/, src/toolkit/, mkroot/, and wheels/ of its third-party
              dependencies at constraints.txt's versions: any/ (pure Python),
              target/ (the image's platform's) and build/ (this machine's, for an
              image of another platform)
  dispatcher  src/dispatcher/, src/toolkit/, mkroot/ and wheels/ of the client it uses
  test-driver images/test-driver/driver (the reference driver the dispatcher's Jobs run)
The three Python images are minimal roots: their build stage runs images/mkroot.py,
which keeps only what the entry point imports. Every Containerfile takes its base
as the build argument BASE; here the local bases that scripts/build-images.sh
makes (no registry is reachable): the Python base, and the busybox base for the
test driver.

Each image is built for one architecture of ARCHES (`build(..., arch=A)`), this
machine's by default. Nothing of another architecture runs: the Python images'
build stage runs on this machine's Python base and takes the interpreter and
libraries from the base of A, mounted (ROOT); the test driver only copies a file
onto the busybox base of A. The bases of the architecture that is not this
machine's carry its name in their tag (python:3.11-bookworm-arm64 on amd64).
"""

from __future__ import annotations

import os
import pathlib
import platform
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
IMAGES = REPO / "images"
PYTHON_BASE = "localhost/dispatch-base/python:3.11-bookworm"
BUSYBOX_BASE = "localhost/dispatch-base/busybox:1.35-static"
# The architectures a release's images are built for (OCI's names), and this machine's.
ARCHES = ("amd64", "arm64")
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
# The platform tags of a wheel CPython 3.11 on Debian bookworm (glibc 2.36) loads, per architecture.
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
GLIBC_MINOR = 36
# The build stage of the Python images carries this label, so that its image can be removed.
BUILD_STAGE_LABEL = "dispatch.stage=python-build"
_NO_CACHE = shutil.ignore_patterns("__pycache__")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """podman with the project's own containers.conf, as scripts/build-images.sh runs it (never /etc's)."""
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "scripts" / "containers.conf")}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def base(image: str, arch: str) -> str:
    """The local base IMAGE (PYTHON_BASE, BUSYBOX_BASE) for ARCH: IMAGE itself on this machine's."""
    if arch not in ARCHES:
        raise ValueError(f"architecture {arch!r}: one of {', '.join(ARCHES)}")
    return image if arch == HOST_ARCH else f"{image}-{arch}"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, capture_output=True, timeout=600)


def _wheels(dest: pathlib.Path, arch: str, *requirements: str) -> None:
    """The wheels of REQUIREMENTS (and theirs) into DEST/any, DEST/target and DEST/build (the
    module docstring): `pip wheel` here, then, for another ARCH, the wheels of ARCH of the same
    distributions at the same versions (`pip download`, binary only)."""
    here = dest / "here"
    _pip("wheel", "-q", "-w", str(here), *requirements)
    for sub in ("any", "target", "build"):
        (dest / sub).mkdir(parents=True)
    native = []
    for wheel in sorted(here.glob("*.whl")):
        if wheel.name.endswith("-none-any.whl"):
            wheel.rename(dest / "any" / wheel.name)
        else:
            native.append(wheel.rename(dest / ("target" if arch == HOST_ARCH else "build") / wheel.name))
    here.rmdir()
    if arch != HOST_ARCH and native:
        machine = MACHINES[arch]
        platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 16, -1)] + [
            f"manylinux2014_{machine}"]
        pins = ["==".join(w.name.split("-")[:2]) for w in native]
        _pip("download", "-q", "--no-deps", "--only-binary", ":all:", "--implementation", "cp",
             "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}",
             *(f"--platform={p}" for p in platforms), "-d", str(dest / "target"), *pins)


# The third-party distributions each image's package imports (their own dependencies come along).
DEPENDENCIES = {
    "controller": ("kubernetes", "urllib3", "click", "PyYAML", "prometheus-client", "cryptography"),
    "dispatcher": ("kubernetes", "urllib3"),
}


def _python_context(dest: pathlib.Path, package: str, arch: str) -> pathlib.Path:
    for name in (package, "toolkit"):
        shutil.copytree(REPO / name, dest / "src" / name, ignore=_NO_CACHE)
    release_data = dest / "src" / "toolkit" / "data" / "release.json"
    release_data.unlink(missing_ok=True)  # a checkout's recorded release is not part of any image
    (dest / "mkroot").mkdir()
    for tool in ("mkroot.py", "elf.py"):
        shutil.copy(IMAGES / tool, dest / "mkroot" / tool)
    if package in DEPENDENCIES:
        _wheels(dest / "wheels", arch, "-c", str(REPO / "constraints.txt"), *DEPENDENCIES[package])
    return IMAGES / f"{package}.Containerfile"


def sidecar_context(dest: pathlib.Path, arch: str = HOST_ARCH) -> pathlib.Path:
    return _python_context(dest, "sidecar", arch)


def dispatcher_context(dest: pathlib.Path, arch: str = HOST_ARCH) -> pathlib.Path:
    return _python_context(dest, "dispatcher", arch)


def controller_context(dest: pathlib.Path, arch: str = HOST_ARCH) -> pathlib.Path:
    return _python_context(dest, "controller", arch)


def test_driver_context(dest: pathlib.Path, arch: str = HOST_ARCH) -> pathlib.Path:
    (dest / "images" / "test-driver").mkdir(parents=True)
    shutil.copy(IMAGES / "test-driver" / "driver", dest / "images" / "test-driver" / "driver")
    return IMAGES / "test-driver.Containerfile"


CONTEXTS = {"sidecar": sidecar_context, "dispatcher": dispatcher_context, "controller": controller_context,
            "test-driver": test_driver_context}
BASES = {"test-driver": BUSYBOX_BASE}


def build(component: str, *, tag: str, workdir: pathlib.Path, labels: dict[str, str] | None = None,
          arch: str = HOST_ARCH) -> str:
    """Build COMPONENT's image for ARCH as TAG with podman (a context made in WORKDIR), with LABELS;
    returns TAG."""
    context = workdir / f"{component}-{arch}-context"
    context.mkdir()
    containerfile = CONTEXTS[component](context, arch)
    image = BASES.get(component, PYTHON_BASE)
    # The build stage on this machine's base, ROOT the base of ARCH (the Python images'
    # Containerfiles); the test driver's one stage on the busybox base of ARCH.
    bases = ([f"BASE={base(image, arch)}"] if component in BASES else
             [f"BASE={image}", f"ROOT={base(image, arch)}", f"BUILDPLATFORM=linux/{HOST_ARCH}"])
    done = podman("build", "-q", "--isolation", "chroot", "--pull=never", "--platform", f"linux/{arch}",
                  *(f"--build-arg={b}" for b in bases), *(f"--label={k}={v}" for k, v in (labels or {}).items()),
                  "-f", str(containerfile), "-t", tag, str(context), timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"podman build of {component} for {arch} exited {done.returncode}: "
                           f"{done.stderr.strip()[-2000:]}")
    if component in ("sidecar", "controller", "dispatcher"):
        remove_build_stage()
    # A layer cache keyed without the platform could hand back another architecture's image.
    built = architecture(tag)
    if built != arch:
        raise RuntimeError(f"podman build of {component} for {arch} made an image for {built}")
    return tag


def architecture(image: str) -> str:
    """The architecture IMAGE in local storage is for (its config's)."""
    done = podman("image", "inspect", "--format", "{{.Architecture}}", image)
    if done.returncode != 0:
        raise RuntimeError(f"{image}: {done.stderr.strip()}")
    return done.stdout.strip()


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
