"""A root of either kind: the one entry that validates the caller's input and
sends a publish or a read to the POSIX root (dispatch_fence.posix) or, for a
URL (s3://, gs://), to the object-store root (dispatch_fence.objectstore),
under the same rule, names, errors and exit codes (docs/checkpoint.md).

It sits above both roots and below everything that publishes: the CLI
(dispatch_fence.cli), the integrations (dispatch_fence.dcp,
dispatch_fence.lightning) and the public surface (dispatch_fence.checkpoint).
The object-store root and its clients are imported only for a URL, so a
POSIX root needs the standard library only (tests/checkpoint/test_imports.py
holds it to that).
"""

from __future__ import annotations

import os

from dispatch_fence import model, posix


def checkpoints(root: str | os.PathLike[str]) -> list[model.Checkpoint]:
    """Every checkpoint directory in ROOT, oldest first (by epoch, then serial). [] when ROOT does not exist."""
    root = os.fspath(root)
    if model.is_url(root):
        from dispatch_fence import objectstore

        return objectstore.checkpoints(root)
    return posix.checkpoints(root)


def latest(root: str | os.PathLike[str]) -> model.Checkpoint | None:
    """The checkpoint ROOT/LATEST names; None before the first publish (or when ROOT does not exist).

    Takes no lock: LATEST is only ever replaced by an atomic rename (a whole PUT on an
    object store), so a reader sees the old name or the new one. CorruptRoot when LATEST
    is not one of ours or names a checkpoint that is gone.
    """
    root = os.fspath(root)
    if model.is_url(root):
        from dispatch_fence import objectstore

        return objectstore.latest(root)
    return posix.latest(root)


def publish(
    staging_dir: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    epoch: int | str | None = None,
    attempt: str | None = None,
    keep: int | None = None,
) -> model.Checkpoint:
    """Publish the complete checkpoint in STAGING_DIR into ROOT, fenced by EPOCH.

    ROOT is a directory, or an object-store URL (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX): there
    STAGING_DIR is uploaded, not moved (dispatch_fence.objectstore), under the same rule.

    EPOCH and ATTEMPT default to $DISPATCH_EPOCH and $DISPATCH_ATTEMPT (set by
    the dispatch prologue). STAGING_DIR must hold MARKER and be on ROOT's
    filesystem; it is renamed, not copied, and is gone afterwards. KEEP: keep
    the newest KEEP checkpoints and remove the rest (None: remove nothing).

    Raises StaleEpoch when EPOCH is lower than the highest epoch in ROOT
    (nothing in ROOT touched, STAGING_DIR left where it is); BadInput,
    UnwritableRoot or CorruptRoot for bad input (nothing published, nothing
    lost). Returns the published Checkpoint, which LATEST now names.
    """
    staging, root = os.fspath(staging_dir), os.fspath(root)
    epoch_value, attempt_value = model.execution(epoch, attempt)
    keep = model.parse_keep(keep)
    if not root:
        raise model.BadInput("root is empty")
    if model.is_url(root):
        from dispatch_fence import objectstore

        return objectstore.publish(staging, root, epoch=epoch_value, attempt=attempt_value, keep=keep)
    return posix.publish(staging, root, epoch=epoch_value, attempt=attempt_value, keep=keep)
