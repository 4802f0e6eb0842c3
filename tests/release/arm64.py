"""The arm64 flavour of this checkout's release images, for the tests, and running what they carry
under emulation.

`image(name)` is the image NAME built for arm64 (release/contexts.py `build(..., arch="arm64")`,
as `make release` builds it) and kept in local storage under a name that carries the hash of what
it is built from (devcluster/install.py `inputs_hash`), so a run with the same sources builds
nothing; an image of other sources is removed when its successor is built. Its name is not a
release name (`localhost/dispatch/NAME:...`): the local cluster's lookup of its own images by label
and tag never finds it.

`rootfs(image, dest)` unpacks an image's root filesystem (podman create and export: nothing of it
runs). `emulated(root, *args)` is the command that runs ROOT's Python with ARGS under Debian's
qemu-user-static, named explicitly with ROOT as the loader's prefix (-L), so that nothing depends
on binfmt_misc, which may be empty here.
"""

from __future__ import annotations

import functools
import pathlib
import shutil
import subprocess
import tempfile

from devcluster import install
from release import contexts

ARCH = "arm64"
REPOSITORY = "localhost/dispatch-test-arm64"
QEMU = "qemu-aarch64-static"


@functools.cache
def image(name: str) -> str:
    """This checkout's release image NAME for arm64, built unless built before from the same files."""
    inputs = install.inputs_hash()
    tag = f"{REPOSITORY}/{name}:{inputs}"
    if contexts.podman("image", "exists", tag).returncode == 0 and contexts.architecture(tag) == ARCH:
        return tag
    with tempfile.TemporaryDirectory(prefix="dispatch-arm64-") as tmp:
        contexts.build(name, tag=tag, workdir=pathlib.Path(tmp), arch=ARCH)
    older = contexts.podman("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter",
                           f"reference={REPOSITORY}/{name}:*").stdout.split()
    for old in (o for o in older if o != tag):
        contexts.podman("rmi", old)
    return tag


def rootfs(image: str, dest: pathlib.Path) -> pathlib.Path:
    """IMAGE's root filesystem unpacked into DEST (made), nothing of it run."""
    dest.mkdir(parents=True)
    created = contexts.podman("create", "--platform", f"linux/{contexts.architecture(image)}", image, "unused")
    assert created.returncode == 0, created.stderr
    container = created.stdout.strip()
    try:
        with tempfile.TemporaryDirectory(prefix="dispatch-arm64-export-") as tmp:
            archive = pathlib.Path(tmp) / "rootfs.tar"
            exported = contexts.podman("export", "-o", str(archive), container, timeout=300)
            assert exported.returncode == 0, exported.stderr
            subprocess.run(["tar", "-x", "-C", str(dest), "-f", str(archive)], check=True, timeout=300)
    finally:
        contexts.podman("rm", container)
    return dest


def qemu() -> str:
    """The emulator's path; a missing one fails the test (make deps installs it), never skips it."""
    found = shutil.which(QEMU)
    assert found, f"{QEMU} is missing: make deps (scripts/install-host-packages.sh) installs qemu-user-static"
    return found


def emulated(root: pathlib.Path, *args: str) -> list[str]:
    """ROOT's /usr/bin/python3.11 with ARGS, as the image's entry point runs it (-S -E -B), emulated."""
    return [qemu(), "-L", str(root), str(root / "usr" / "bin" / "python3.11"), "-S", "-E", "-B", *args]
