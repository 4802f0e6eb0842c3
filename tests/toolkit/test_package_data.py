"""The prologue ships in the wheel as a real file with the repository copy's
bytes (toolkit/data/prologue.sh is a committed symlink to prologue/prologue.sh)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import zipfile

REPO = pathlib.Path(__file__).parents[2]


def test_symlink_points_at_the_one_copy() -> None:
    link = REPO / "toolkit" / "data" / "prologue.sh"
    assert link.is_symlink() and os.readlink(link) == "../../prologue/prologue.sh"


def test_wheel_carries_the_prologue_bytes(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(tmp_path)],
        check=True, cwd=tmp_path, timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo("toolkit/data/prologue.sh")
        assert (info.external_attr >> 16) & 0o170000 == 0o100000, "a regular file, not a symlink"
        assert z.read(info) == (REPO / "prologue" / "prologue.sh").read_bytes()
