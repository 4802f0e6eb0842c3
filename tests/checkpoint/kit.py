"""Helpers of the checkpoint tests: staging directories and a root's state."""

from __future__ import annotations

import os
import pathlib

from dispatch_fence import checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]
FENCE = REPO / "fence" / "dispatch_fence"
POSIX_FILES = ("__init__.py", "__main__.py", "checkpoint.py", "cli.py", "model.py", "posix.py", "roots.py")
"""The fence's files a POSIX root needs, standard library only: what importing dispatch_fence.checkpoint
and running `python -m dispatch_fence` load (test_imports.py), and what the sample trainer image carries
(test_containers.py)."""


def staging(parent: pathlib.Path, token: str, *, complete: bool = True, name: str | None = None) -> pathlib.Path:
    """A staging directory holding a model file (content TOKEN) and a nested shard, MARKER last."""
    path = parent / (name or f".staging-{token}")
    (path / "shards").mkdir(parents=True)
    (path / "model.bin").write_text(token)
    (path / "shards" / "0.bin").write_text(token * 3)
    if complete:
        (path / checkpoint.MARKER).write_text("")
    return path


def tree(root: pathlib.Path) -> dict[str, str | None]:
    """Everything under ROOT but the lock file: relative path -> content (None for a directory)."""
    out: dict[str, str | None] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if rel != checkpoint.LOCK:
                out[rel] = pathlib.Path(dirpath, f).read_text()
    return out


def env(epoch: int | str, attempt: str) -> dict[str, str]:
    return {"DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt}
