"""Every Python file of the project, its scripts without the .py suffix included, read by ruff with
pyflakes' rules: a name used but never defined (the bench that lost a helper to a refactor failed
only when it ran), an import or a variable never used."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["toolkit", "controller", "sidecar", "dispatcher", "refbackend", "devcluster", "release", "fence",
            "tests", "scripts", "bench", "examples"]


def _python_scripts() -> list[str]:
    """Files without the .py suffix that run under python (ruff only finds *.py by itself)."""
    found = []
    for folder in ("bench", "scripts", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix == "" and path.read_bytes()[:64].startswith(b"#!") \
                    and b"python" in path.read_bytes().split(b"\n", 1)[0]:
                found.append(str(path.relative_to(ROOT)))
    return found


def test_scripts_are_found():
    assert "bench/dispatcher" in _python_scripts()


def test_no_undefined_or_unused_names():
    ruff = pathlib.Path(sys.executable).parent / "ruff"
    done = subprocess.run([str(ruff), "check", "--no-cache", "--select", "F", "--output-format", "concise",
                           *[p for p in PACKAGES if (ROOT / p).exists()], *_python_scripts()],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
