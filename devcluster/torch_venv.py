"""The torch virtualenvs devcluster/build-torch-venv.sh makes and caches (`make torch-venv`): torch,
Lightning, transformers and the fence's object-store clients at the pinned versions, or at the
lowest the fence's extras allow. The fence's PyTorch suites run in them, and `make demo`'s fence
stage mounts the pinned one's site-packages into its trainer's pod (devcluster/demo_fence.py)."""

from __future__ import annotations

import pathlib
import subprocess

BUILD = pathlib.Path(__file__).resolve().parent / "build-torch-venv.sh"
SETS = ("pinned", "lowest")


class BuildFailed(RuntimeError):
    """build-torch-venv.sh failed; the message ends with what it printed last."""


def python(which: str = "pinned") -> pathlib.Path:
    """The python of the WHICH set's virtualenv, built first when the cache has none (a no-op when it has)."""
    if which not in SETS:
        raise ValueError(f"torch venv {which!r}: one of {', '.join(SETS)}")
    done = subprocess.run(["bash", str(BUILD), which], capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise BuildFailed(f"{BUILD.name} {which} exited {done.returncode}: {done.stderr[-3000:]}")
    return pathlib.Path(done.stdout.splitlines()[-1])


def site_packages(venv_python: pathlib.Path) -> pathlib.Path:
    """The site-packages directory of the virtualenv whose python is VENV_PYTHON."""
    (found,) = sorted((venv_python.parent.parent / "lib").glob("python3.*/site-packages"))
    return found
