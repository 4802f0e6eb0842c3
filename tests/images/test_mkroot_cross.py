"""images/mkroot.py's cross mode, without building an image: the libraries it finds by reading ELF
headers (images/elf.py) are the ones `ldd` finds for this machine's Python and every extension
module it ships; a root's symbolic links are followed inside the root; a root whose Python is not
this one's version is refused before anything is compiled for it; and a module this interpreter
loaded is taken from the root with the root's platform tag. (The images built this way are tested
in tests/release/test_arm64_images.py.)
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3.11"  # Debian's, as in the images' base


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_test_{name}", REPO / "images" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mkroot, elf = _load("mkroot"), _load("elf")


def ldd(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = set()
    for words in (line.split() for line in out.splitlines()):
        if "=>" in words and words[words.index("=>") + 1].startswith("/"):
            found.add(words[words.index("=>") + 1])
        elif words and words[0].startswith("/"):
            found.add(words[0])
    return {os.path.realpath(p) for p in found}


def test_the_libraries_read_from_elf_headers_are_the_ones_ldd_finds() -> None:
    binaries = [PYTHON, *sorted(str(p) for p in pathlib.Path("/usr/lib/python3.11/lib-dynload").glob("*.so"))]
    assert len(binaries) > 20
    for binary in binaries:
        read = {os.path.realpath(p) for p in elf.needed(pathlib.Path("/"), binary)}
        assert read == ldd(binary), binary


def test_a_roots_links_are_followed_inside_the_root(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "lib" / "triplet").mkdir(parents=True)
    (root / "usr" / "lib" / "triplet" / "libx.so.1.2").write_text("x")
    (root / "usr" / "lib" / "triplet" / "libx.so.1").symlink_to("libx.so.1.2")
    (root / "lib").symlink_to("/usr/lib")  # absolute: ROOT's /usr/lib, never this machine's
    assert elf.inside(root, "/lib/triplet/libx.so.1") == root / "usr" / "lib" / "triplet" / "libx.so.1.2"
    dest = tmp_path / "dest"
    mkroot.replicate("/lib/triplet/libx.so.1", dest, root)
    assert os.readlink(dest / "lib") == "/usr/lib" and os.readlink(dest / "usr/lib/triplet/libx.so.1") == "libx.so.1.2"
    assert (dest / "usr" / "lib" / "triplet" / "libx.so.1.2").read_text() == "x"


def fake_root(tmp_path: pathlib.Path, version: bytes) -> pathlib.Path:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3.11").write_bytes(b"\x7fELF\0junk\0" + version + b"\0more\0")
    stdlib = root / mkroot.STDLIB.relative_to("/")
    (stdlib / "importlib").mkdir(parents=True)
    (stdlib / "importlib" / "_bootstrap_external.py").write_text(
        (mkroot.STDLIB / "importlib" / "_bootstrap_external.py").read_text())
    return root


def test_a_root_of_another_python_version_is_refused(tmp_path: pathlib.Path) -> None:
    mine = "{}.{}.{}".format(*sys.version_info[:3]).encode()
    mkroot.check_version(fake_root(tmp_path / "same", mine), "/usr/bin/python3.11")
    with pytest.raises(SystemExit, match=r"is not Python 3\.11\.\d+ \(it names 3\.11\.99\)"):
        mkroot.check_version(fake_root(tmp_path / "other", b"3.11.99"), "/usr/bin/python3.11")


def test_a_module_is_taken_from_the_root_with_the_roots_platform_tag(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    stdlib = root / mkroot.STDLIB.relative_to("/")
    (stdlib / "lib-dynload").mkdir(parents=True)
    (stdlib / "lib-dynload" / "_ssl.cpython-311-aarch64-linux-gnu.so").write_bytes(b"arm")
    (stdlib / "json").mkdir()
    (stdlib / "json" / "__init__.py").write_text("# the root's\n")
    src = tmp_path / "src"
    (src / "yaml").mkdir(parents=True)
    (src / "yaml" / "_yaml.cpython-311-aarch64-linux-gnu.so").write_bytes(b"arm")
    here = mkroot.STDLIB / "lib-dynload" / "_ssl.cpython-311-x86_64-linux-gnu.so"
    probe = tmp_path / "probe"

    def take(origin: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
        return mkroot.source_of(origin, src=src, probe=probe, root=root, triplet="aarch64-linux-gnu")

    assert take(here) == (stdlib / "lib-dynload" / "_ssl.cpython-311-aarch64-linux-gnu.so",
                          mkroot.STDLIB / "lib-dynload" / "_ssl.cpython-311-aarch64-linux-gnu.so")
    assert take(mkroot.STDLIB / "json" / "__init__.py")[0] == stdlib / "json" / "__init__.py"
    arm = "_yaml.cpython-311-aarch64-linux-gnu.so"
    assert take(probe / "yaml" / "_yaml.cpython-311-x86_64-linux-gnu.so") == (src / "yaml" / arm,
                                                                               mkroot.APP / "yaml" / arm)
    with pytest.raises(SystemExit, match="_json.*is missing"):
        take(mkroot.STDLIB / "lib-dynload" / "_json.cpython-311-x86_64-linux-gnu.so")
