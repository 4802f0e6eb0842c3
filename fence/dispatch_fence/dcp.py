"""PyTorch Distributed Checkpoint (torch.distributed.checkpoint) through the
fence: a collective save that publishes only after every rank's shards are
written, and a load from what LATEST names (docs/checkpoint.md, "PyTorch DCP").

    from dispatch_fence import dcp
    found = dcp.load(state_dict, root)                # None before the first save; in place otherwise
    ...
    dcp.save(state_dict, root, keep=3)                # on every rank; StaleEpoch on every rank if refused

Every rank calls both (they are collectives on the default process group, or
PROCESS_GROUP). The coordinator is the group's rank 0; its outcome (the
checkpoint, or the error) is broadcast, so every rank returns the same thing
or raises the same error, and a refused save stops the whole execution alike.

The writer is DCP's own FileSystemWriter, always to a directory:
- a POSIX root: every rank writes into one staging directory in the root
  (`ROOT/.staging-<attempt>-<nonce>`, on the root's filesystem, which every
  rank of a multi-node job shares), then the coordinator writes the marker and
  publishes it (a rename);
- an s3:// or gs:// root: every rank writes its shards into a local temporary
  directory, the coordinator claims the name (objectstore.begin), every rank
  uploads its own files create-only into it with the fence's client
  (objectstore.add), and after all have, the coordinator writes the marker and
  commits LATEST by compare-and-set (objectstore.finish). DCP's fsspec writer
  would reach the stores too, but with unconditional writes and another client
  (s3fs, gcsfs): the fence's client keeps one set of credentials and the
  create-only rule for every object.

Loading from an object store downloads the checkpoint into a local temporary
directory on each rank (removed after), then DCP loads it in place.

Needs torch and numpy (DCP's collectives of Python objects need numpy); not dependencies of the
package: training images bring their own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp

from dispatch_fence import checkpoint


def _rank(group: Any) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _broadcast(value: object, group: Any) -> Any:
    """VALUE from the group's rank 0, on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return box[0]


def _gather(value: object, group: Any) -> list[Any]:
    """Every rank's VALUE, on every rank, in rank order."""
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except checkpoint.CheckpointError as exc:
        return "error", exc


def _result(outcome: tuple[str, Any]) -> Any:
    kind, value = outcome
    if kind == "error":
        raise value
    return value


def _local_files(top: str) -> list[tuple[str, str]]:
    out = []
    for dirpath, _, filenames in os.walk(top):
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            out.append((os.path.relpath(path, top).replace(os.sep, "/"), path))
    return out


def save(state_dict: dict[str, Any], root: str, *, keep: int | None = None, epoch: int | str | None = None,
         attempt: str | None = None, process_group: Any = None) -> checkpoint.Checkpoint:
    """Save STATE_DICT with DCP and publish it into ROOT, fenced by the epoch; collective.

    Returns the published Checkpoint on every rank; raises StaleEpoch (or another CheckpointError)
    on every rank when the coordinator's publish is refused. EPOCH and ATTEMPT default to
    $DISPATCH_EPOCH and $DISPATCH_ATTEMPT."""
    group, root = process_group, os.fspath(root)
    epoch_value, attempt_value = checkpoint.execution(epoch, attempt)
    keep = checkpoint.parse_keep(keep)
    if checkpoint.is_url(root):
        return _save_to_store(state_dict, root, epoch=epoch_value, attempt=attempt_value, keep=keep, group=group)
    staging = os.path.join(root, f".staging-{attempt_value}-{_broadcast(secrets.token_hex(4), group)}")
    torch_dcp.save(state_dict, checkpoint_id=staging, process_group=group)
    outcome: tuple[str, Any] = ("ok", None)
    if _rank(group) == 0:
        def publish() -> checkpoint.Checkpoint:
            open(os.path.join(staging, checkpoint.MARKER), "wb").close()
            return checkpoint.publish(staging, root, epoch=epoch_value, attempt=attempt_value, keep=keep)
        outcome = _outcome(publish)
    return _result(_broadcast(outcome, group))


def _save_to_store(state_dict: dict[str, Any], root: str, *, epoch: int, attempt: str, keep: int | None,
                   group: Any) -> checkpoint.Checkpoint:
    from dispatch_fence import objectstore

    local = tempfile.mkdtemp(prefix="dispatch-fence-dcp-")
    try:
        torch_dcp.save(state_dict, checkpoint_id=local, process_group=group)
        files = _local_files(local)
        pending: objectstore.Pending | None = None
        claim: tuple[str, Any] = ("ok", None)
        if _rank(group) == 0:  # the claim: rank 0's first file, create-only, under a new name
            claim = _outcome(objectstore.begin, root, files[0], epoch=epoch, attempt=attempt)
            if claim[0] == "ok":
                pending = claim[1]
                claim = ("ok", claim[1].checkpoint.name)
            files = files[1:]
        name = _result(_broadcast(claim, group))
        uploads = _gather(_outcome(objectstore.add, root, name, files), group)
        outcome: tuple[str, Any] = ("ok", None)
        if _rank(group) == 0:
            assert pending is not None
            failed = next((o for o in uploads if o[0] == "error"), None)
            if failed is not None:
                objectstore.abandon(pending)
                outcome = failed
            else:
                marker = os.path.join(local, checkpoint.MARKER)
                open(marker, "wb").close()
                outcome = _outcome(objectstore.finish, pending, marker, keep=keep)
        return _result(_broadcast(outcome, group))
    finally:
        shutil.rmtree(local, ignore_errors=True)


def load(state_dict: dict[str, Any], root: str, *, process_group: Any = None) -> checkpoint.Checkpoint | None:
    """Load what ROOT/LATEST names into STATE_DICT, in place (DCP); collective. None (STATE_DICT
    untouched) before the first save. The coordinator reads LATEST once, so every rank loads the
    same checkpoint even if a save commits meanwhile."""
    group, root = process_group, os.fspath(root)
    found = _result(_broadcast(_outcome(checkpoint.latest, root) if _rank(group) == 0 else None, group))
    if found is None:
        return None
    if not checkpoint.is_url(root):
        torch_dcp.load(state_dict, checkpoint_id=found.path, process_group=group)
        return found
    from dispatch_fence import objectstore

    local = tempfile.mkdtemp(prefix="dispatch-fence-dcp-")
    try:
        failed = next((o for o in _gather(_outcome(objectstore.download, found, local), group) if o[0] == "error"), None)
        if failed is not None:
            raise failed[1]
        torch_dcp.load(state_dict, checkpoint_id=local, process_group=group)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return found
