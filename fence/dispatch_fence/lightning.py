"""Lightning through the fence: a CheckpointIO plugin that publishes every
checkpoint Lightning saves, and resumes from what LATEST names
(docs/checkpoint.md, "Lightning").

    from dispatch_fence import lightning as fenced
    io = fenced.CheckpointIO(root, keep=3)
    trainer = L.Trainer(plugins=[io], callbacks=[ModelCheckpoint(every_n_train_steps=100)])
    trainer.fit(model, ckpt_path=io.resume_path())   # None before the first save: a fresh start

Lightning calls `save_checkpoint` on global rank 0 only, with the whole
checkpoint (its strategy has gathered it). The plugin writes it with
torch.save into a staging directory (in the root for a POSIX root, so the
publish is a rename; a local temporary one for an s3:// or gs:// root), writes
the marker, and publishes it, epoch and attempt from the environment. A
superseded execution's save raises StaleEpoch out of `trainer.fit` (its
staging directory removed): the old execution stops instead of overwriting.

The path Lightning passes (ModelCheckpoint's dirpath and filename) is not
used: the fence names checkpoints. `remove_checkpoint` does nothing:
retention is `keep`, which never removes what LATEST names. `load_checkpoint`
takes a Checkpoint's path (what `resume_path` returns) and reads the file in
it, downloading it from an object store, with torch.load's `weights_only` as
Lightning passes it (`trainer.fit(..., weights_only=...)`): None leaves torch's
default, as Lightning's own CheckpointIO does (True since torch 2.6: a
checkpoint holding an object of a class torch does not allow is refused).

Sharded checkpoints: Lightning's FSDPStrategy writes a sharded checkpoint with
torch.distributed.checkpoint itself, not through the CheckpointIO, and its
Trainer refuses the strategy without a GPU; with `state_dict_type="full"` it
gathers the checkpoint and saves it through this plugin on rank 0.

Needs lightning (and torch); not dependencies of the package. An integration,
above the roots: it publishes and reads through dispatch_fence.roots (and
downloads with dispatch_fence.objectstore), and nothing of the fence imports it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO as _Base

from dispatch_fence import model, roots

FILE = "checkpoint.ckpt"
"""The file a published checkpoint holds, beside the marker."""


class CheckpointIO(_Base):
    """Lightning's CheckpointIO over the fence; ROOT is a directory or an s3:// or gs:// URL."""

    def __init__(self, root: str | os.PathLike[str], *, keep: int | None = None, epoch: int | str | None = None,
                 attempt: str | None = None) -> None:
        self.root = os.fspath(root)
        self.keep = model.parse_keep(keep)
        self.epoch, self.attempt = epoch, attempt
        self.published: list[model.Checkpoint] = []

    def save_checkpoint(self, checkpoint_: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        epoch, attempt = model.execution(self.epoch, self.attempt)
        if model.is_url(self.root):
            staging = tempfile.mkdtemp(prefix=f"dispatch-fence-{attempt}-")
        else:
            os.makedirs(self.root, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=f".staging-{attempt}-", dir=self.root)
        try:
            torch.save(checkpoint_, os.path.join(staging, FILE))
            with open(os.path.join(staging, FILE), "rb") as f:
                os.fsync(f.fileno())
            open(os.path.join(staging, model.MARKER), "wb").close()
            found = roots.publish(staging, self.root, epoch=epoch, attempt=attempt, keep=self.keep)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after a rename; left after an upload or a refusal
        self.published.append(found)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        path = os.fspath(path)
        if not model.is_url(path):
            return _load(os.path.join(path, FILE), map_location, weights_only)
        from dispatch_fence import objectstore

        name = path.rstrip("/").rsplit("/", 1)[1]
        found = model.parse_name(path[:-len(name) - 1], name)
        if found is None:
            raise model.BadInput(f"{path} is not a checkpoint's path")
        local = tempfile.mkdtemp(prefix="dispatch-fence-")
        try:
            objectstore.download(found, local)
            return _load(os.path.join(local, FILE), map_location, weights_only)
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def remove_checkpoint(self, path: Any) -> None:
        """Nothing: retention is `keep` (it never removes what LATEST names)."""

    def resume_path(self) -> str | None:
        """The path of the checkpoint LATEST names, for `trainer.fit(ckpt_path=...)`; None before the first."""
        found = roots.latest(self.root)
        return found.path if found is not None else None


def _load(file: str, map_location: Any, weights_only: bool | None) -> dict[str, Any]:
    """torch.load, `weights_only` passed on as given (None: torch's default)."""
    return torch.load(file, map_location=map_location, weights_only=weights_only)  # type: ignore[no-any-return]
