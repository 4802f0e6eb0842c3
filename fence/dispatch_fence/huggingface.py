"""Hugging Face transformers' Trainer through the fence: a TrainerCallback that
publishes every checkpoint the Trainer saves, and the path to resume from what
LATEST names (docs/checkpoint.md, "Hugging Face Trainer").

    from dispatch_fence import huggingface as fenced
    fence = fenced.Callback(root, keep=3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[fence])
    trainer.train(resume_from_checkpoint=fence.resume_path())   # None before the first save: a fresh start

The Trainer writes a checkpoint into OUTPUT_DIR/checkpoint-STEP (weights,
optimizer, scheduler, RNG state, trainer_state.json) and then calls `on_save`.
The callback takes that directory as the staging directory: for a POSIX root
its files are moved into a staging directory in the root (a rename when
OUTPUT_DIR is on the root's filesystem, a copy otherwise), for an s3:// or
gs:// root they are uploaded from where they are; it writes the marker and
publishes, epoch and attempt from the environment, and removes what is left
of OUTPUT_DIR/checkpoint-STEP. A superseded execution's save raises
StaleEpoch out of `trainer.train` (nothing published): the old execution
stops instead of overwriting.

The fence names checkpoints, so nothing stays in OUTPUT_DIR: the Trainer's
`save_total_limit` finds nothing to rotate (retention is `keep`, which never
removes what LATEST names) and `load_best_model_at_end` has no directory to
load; leave both unset.

Several processes (torchrun on one node): every process writes its part of
the checkpoint into the OUTPUT_DIR they share, so each waits in `on_save` for
all (a barrier), the world's process zero publishes, and its outcome is
broadcast: every process records the same checkpoint or raises the same
StaleEpoch. Processes on several nodes would each write into a directory of
their own node, which process zero cannot publish: the callback refuses a run
whose world is larger than its node (LOCAL_WORLD_SIZE), before the first step.

Needs transformers (and torch); not dependencies of the package. An
integration, above the roots: it publishes and reads through
dispatch_fence.roots (and downloads with dispatch_fence.objectstore), and
nothing of the fence imports it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import transformers

from dispatch_fence import model, roots

PREFIX = "checkpoint"
"""The Trainer's name of a checkpoint directory in OUTPUT_DIR: PREFIX-STEP."""


class Callback(transformers.TrainerCallback):
    """The Trainer's saves through the fence; ROOT is a directory or an s3:// or gs:// URL."""

    def __init__(self, root: str | os.PathLike[str], *, keep: int | None = None, epoch: int | str | None = None,
                 attempt: str | None = None) -> None:
        self.root = os.fspath(root)
        self.keep = model.parse_keep(keep)
        self.epoch, self.attempt = epoch, attempt
        self.published: list[model.Checkpoint] = []

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size))
        if args.world_size != local:
            raise model.BadInput(f"world_size is {args.world_size}, LOCAL_WORLD_SIZE {local}: "
                                 "dispatch_fence.huggingface publishes from one node only (world_size <= LOCAL_WORLD_SIZE)")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        saved = os.path.join(args.output_dir, f"{PREFIX}-{state.global_step}")
        if args.world_size == 1:
            self.published.append(self.publish(saved))
            return
        import torch.distributed as dist

        dist.barrier()  # every process has written its part of SAVED
        outcome: list[Any] = [None]
        own: Exception | None = None
        if args.process_index == 0:
            try:
                outcome[0] = self.publish(saved)
            except Exception as exc:  # every process learns it; process zero raises its own
                own = exc
                outcome[0] = exc if isinstance(exc, model.StaleEpoch) else model.CheckpointError(
                    f"process zero did not publish {saved}: {exc}")
        dist.broadcast_object_list(outcome, src=0)
        if own is not None:
            raise own
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        self.published.append(outcome[0])

    def publish(self, saved: str | os.PathLike[str]) -> model.Checkpoint:
        """Publish the checkpoint directory SAVED (what the Trainer wrote) into the root; SAVED is gone after."""
        saved = os.fspath(saved)
        epoch, attempt = model.execution(self.epoch, self.attempt)
        staging = saved
        try:
            if not model.is_url(self.root):
                os.makedirs(self.root, exist_ok=True)
                staging = tempfile.mkdtemp(prefix=f".staging-{attempt}-", dir=self.root)
                for entry in os.listdir(saved):
                    shutil.move(os.path.join(saved, entry), os.path.join(staging, entry))
            open(os.path.join(staging, model.MARKER), "wb").close()
            return roots.publish(staging, self.root, epoch=epoch, attempt=attempt, keep=self.keep)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after a rename; left after an upload or a refusal
            shutil.rmtree(saved, ignore_errors=True)

    def resume_path(self, into: str | os.PathLike[str] | None = None) -> str | None:
        """The directory of the checkpoint LATEST names, for `trainer.train(resume_from_checkpoint=...)`;
        None before the first. For an s3:// or gs:// root the checkpoint is downloaded into INTO (a new
        temporary directory when None), which the caller removes after training."""
        found = roots.latest(self.root)
        if found is None:
            return None
        if not model.is_url(self.root):
            return found.path
        from dispatch_fence import objectstore

        local = os.fspath(into) if into is not None else tempfile.mkdtemp(prefix="dispatch-fence-")
        objectstore.download(found, local)
        return local
