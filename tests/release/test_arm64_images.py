"""The release's arm64 images (built as `make release` builds them, on this amd64 machine, with
nothing of arm64 run: images/mkroot.py's cross mode; tests/release/arm64.py keeps them while their
sources are unchanged) are for arm64 and within the budgets the amd64 ones are held to (sidecar
30 MB, controller and dispatcher 60 MB); every ELF file of a Python image is an aarch64 one whose
libraries are all in the image, found as the loader finds them (read, not run). Then, under
emulation (qemu-user-static, named explicitly: binfmt_misc is not needed): the controller and the
dispatcher import every module they carry, and the sidecar, against the control plane's apiserver
with the shipped RBAC's token and the cluster's CA, reads the TrainJob and its JobSet over TLS and
reports a violation as an Event: tests/sidecar/test_sidecar_cluster.py's own test of the amd64
sidecar, run with the arm64 one in its place.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from release import contexts
from tests.release import arm64
from tests.sidecar import test_sidecar_cluster as cluster

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]
BUDGETS = {"sidecar": 30_000_000, "controller": 60_000_000, "dispatcher": 60_000_000}
setup = cluster.setup  # the fixture: the shipped RBAC and a dispatch-sidecar token
EM_AARCH64 = 183


def _elf() -> Any:
    spec = importlib.util.spec_from_file_location("_test_elf", REPO / "images" / "elf.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


elf = _elf()


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, pathlib.Path]]:
    """Each Python image's root filesystem, unpacked."""
    base = tmp_path_factory.mktemp("arm64-roots")
    yield {name: arm64.rootfs(arm64.image(name), base / name) for name in BUDGETS}


@pytest.mark.parametrize("name", ["sidecar", "controller", "dispatcher", "test-driver"])
def test_arm64_each_image_is_for_arm64_and_within_its_budget(name: str) -> None:
    image = arm64.image(name)
    assert contexts.architecture(image) == "arm64"
    size = contexts.size_bytes(image)
    print(f"{name} arm64 image: {size / 1e6:.1f} MB")
    assert size <= BUDGETS.get(name, 5_000_000), size


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_arm64_every_elf_file_is_aarch64_and_finds_its_libraries_in_the_image(
        name: str, roots: dict[str, pathlib.Path]) -> None:
    root = roots[name]
    found = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        read = elf.read(path)
        found["/" + str(path.relative_to(root))] = read
        assert read.machine == EM_AARCH64, path
    assert "/usr/bin/python3.11" in found
    assert any(p.endswith(".cpython-311-aarch64-linux-gnu.so") for p in found), sorted(found)
    assert not any("x86_64" in p for p in found), sorted(found)
    for path in found:
        # Every library the loader would load, in the image itself (it has no /etc: the loader's own dirs).
        for library in elf.needed(root, path):
            assert elf.inside(root, library).is_file(), (path, library)


# Imports every module the image carries (its bytecode, its zip archive, its extension modules),
# then makes a key with cryptography where the image has it; one line of counts.
IMPORT_ALL = r"""
import importlib, pathlib, sys, zipfile
names = set()
def add(parts):
    parts = list(parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts and parts[-1] != "__main__":
        names.add(".".join(parts))
for p in pathlib.Path(".").rglob("*.pyc"):
    add(p.with_suffix("").parts)
for p in pathlib.Path(".").rglob("*.so"):
    add([*p.parts[:-1], p.name.split(".")[0]])
for archive in (p for p in sys.path if p.endswith(".zip") and pathlib.Path(p).exists()):
    for member in zipfile.ZipFile(archive).namelist():
        add(pathlib.PurePosixPath(member).with_suffix("").parts)
failed = {}
for name in sorted(names):
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)
if "cryptography" in names:
    from cryptography.hazmat.primitives.asymmetric import ec
    ec.generate_private_key(ec.SECP256R1())
import os
print(os.uname().machine, len(names), failed)
"""


@pytest.mark.parametrize("name", ["controller", "dispatcher"])
def test_arm64_emulated_the_image_imports_every_module_it_carries(name: str, roots: dict[str, pathlib.Path]) -> None:
    root = roots[name]
    # -c: the working directory, /opt/dispatch, first on sys.path, as with the entry point's -m.
    done = subprocess.run(arm64.emulated(root, "-c", IMPORT_ALL), cwd=root / "opt" / "dispatch", env={},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    machine, count, failed = done.stdout.split(" ", 2)
    assert (machine, failed.strip()) == ("aarch64", "{}"), done.stdout
    assert int(count) > 300, done.stdout


class EmulatedSidecar(cluster.Sidecar):
    """`python -S -E -B -m sidecar` of the arm64 image's root, under qemu, as the image runs it."""

    def __init__(self, root: pathlib.Path, env: dict[str, str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(arm64.emulated(root, "-m", "sidecar"), cwd=root / "opt" / "dispatch", env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.cluster
@pytest.mark.parametrize("case", ["jobset-uid from the JobSet", "ok, JobSet UID read from the JobSet", "below-floor"])
def test_arm64_emulated_sidecar_reads_over_tls_and_reports_a_violation_as_an_event(
        setup: cluster.Setup, roots: dict[str, pathlib.Path], tmp_path: pathlib.Path, case: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[EmulatedSidecar] = []

    def sidecar(env: dict[str, str]) -> EmulatedSidecar:
        started.append(EmulatedSidecar(roots["sidecar"], env))
        return started[-1]

    monkeypatch.setattr(cluster, "Sidecar", sidecar)
    cluster.test_verdict_event_and_request_count(setup, tmp_path, case)
    assert len(started) == 1 and started[0].proc.args[0] == arm64.qemu()
