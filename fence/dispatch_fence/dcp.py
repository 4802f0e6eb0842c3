"""PyTorch Distributed Checkpoint (torch.distributed.checkpoint) through the
fence: a collective save that publishes only after every rank's shards are
written, and a load from what LATEST names (docs/checkpoint.md, "PyTorch DCP").

    from dispatch_fence import dcp
    found = dcp.load(state_dict, root)                # None before the first save; in place otherwise
    ...
    dcp.save(state_dict, root, keep=3)                # on every rank; StaleEpoch on every rank if refused
    pending = dcp.async_save(state_dict, root, keep=3)  # returns once DCP holds a copy; written in the background
    ...
    pending.result()                                  # on every rank: publishes; StaleEpoch on every rank if refused

Every rank calls them all (they are collectives on the default process group, or
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

async_save starts DCP's own async_save into the same place and returns an
AsyncSave; nothing is published until its result(), a collective: every rank
waits for its write (DCP's future), the ranks learn whether every write
succeeded, and then the coordinator publishes exactly as save() does (on an
object store the uploads happen there, in result()). So LATEST never names a
checkpoint a rank is still writing, and a superseded execution's async save
is refused by the same comparison, at result(), on every rank.

Loading from an object store downloads the checkpoint into a local temporary
directory on each rank (removed after), then DCP loads it in place.

Needs torch and numpy (DCP's collectives of Python objects need numpy); not dependencies of the
package: training images bring their own. An integration, above the roots: it publishes and
reads through dispatch_fence.roots (and, for a URL root, the steps of dispatch_fence.objectstore),
and nothing of the fence imports it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp

from dispatch_fence import model, roots


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
    except model.CheckpointError as exc:
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


def _target(root: str, attempt: str, group: Any) -> str:
    """Where DCP writes on this rank: the staging directory in a POSIX root (one for every rank),
    or a local temporary directory of this rank's own for a URL root."""
    if model.is_url(root):
        return tempfile.mkdtemp(prefix="dispatch-fence-dcp-")
    return os.path.join(root, f".staging-{attempt}-{_broadcast(secrets.token_hex(4), group)}")


def _publish(target: str, root: str, *, epoch: int, attempt: str, keep: int | None,
             group: Any) -> model.Checkpoint:
    """Publish what DCP wrote into TARGET, once it finished on this rank; collective."""
    if model.is_url(root):
        return _publish_to_store(target, root, epoch=epoch, attempt=attempt, keep=keep, group=group)
    outcome: tuple[str, Any] = ("ok", None)
    if _rank(group) == 0:
        def publish() -> model.Checkpoint:
            open(os.path.join(target, model.MARKER), "wb").close()
            return roots.publish(target, root, epoch=epoch, attempt=attempt, keep=keep)
        outcome = _outcome(publish)
    return _result(_broadcast(outcome, group))


def save(state_dict: dict[str, Any], root: str, *, keep: int | None = None, epoch: int | str | None = None,
         attempt: str | None = None, process_group: Any = None) -> model.Checkpoint:
    """Save STATE_DICT with DCP and publish it into ROOT, fenced by the epoch; collective.

    Returns the published Checkpoint on every rank; raises StaleEpoch (or another CheckpointError)
    on every rank when the coordinator's publish is refused. EPOCH and ATTEMPT default to
    $DISPATCH_EPOCH and $DISPATCH_ATTEMPT."""
    group, root = process_group, os.fspath(root)
    epoch_value, attempt_value = model.execution(epoch, attempt)
    keep = model.parse_keep(keep)
    target = _target(root, attempt_value, group)
    try:
        torch_dcp.save(state_dict, checkpoint_id=target, process_group=group)
        return _publish(target, root, epoch=epoch_value, attempt=attempt_value, keep=keep, group=group)
    finally:
        if model.is_url(root):
            shutil.rmtree(target, ignore_errors=True)


class AsyncSave:
    """A save started by async_save: DCP writes in the background; result() publishes."""

    def __init__(self, future: Any, target: str, root: str, *, epoch: int, attempt: str, keep: int | None,
                 group: Any) -> None:
        self._future, self._target, self._root = future, target, root
        self._epoch, self._attempt, self._keep, self._group = epoch, attempt, keep, group
        self._outcome: tuple[str, Any] | None = None

    def result(self) -> model.Checkpoint:
        """Wait until DCP's write finished on every rank, then publish; collective (every rank calls
        it, at the same point). Returns the published Checkpoint on every rank, or raises StaleEpoch
        (or another CheckpointError) on every rank; LATEST is not touched before. Once resolved, it
        returns (or raises) the same again without a collective."""
        if self._outcome is None:
            self._outcome = _outcome(self._finish)
        return _result(self._outcome)

    def _finish(self) -> model.Checkpoint:
        try:
            failure = None
            try:
                self._future.result()
            except Exception as exc:  # DCP's own error on this rank: every rank learns of it below
                failure = exc
            failed = [(r, f) for r, f in enumerate(_gather(None if failure is None else
                                                           f"{type(failure).__name__}: {failure}", self._group)) if f]
            if failure is not None:
                raise failure
            if failed:
                rank, what = failed[0]
                raise model.UnwritableRoot(f"{self._root}: the DCP write of rank {rank} failed "
                                           f"({what.splitlines()[0][:300]}); nothing published")
            return _publish(self._target, self._root, epoch=self._epoch, attempt=self._attempt, keep=self._keep,
                            group=self._group)
        finally:
            if model.is_url(self._root):
                shutil.rmtree(self._target, ignore_errors=True)


def async_save(state_dict: dict[str, Any], root: str, *, keep: int | None = None, epoch: int | str | None = None,
               attempt: str | None = None, process_group: Any = None) -> AsyncSave:
    """Start saving STATE_DICT with DCP's async_save (a copy in memory is taken before it returns,
    then written in the background); collective. Nothing is published until AsyncSave.result(),
    which every rank calls: it waits for the write on every rank, then the coordinator publishes
    as save() does. Arguments as save()'s, checked before anything is written."""
    group, root = process_group, os.fspath(root)
    epoch_value, attempt_value = model.execution(epoch, attempt)
    keep = model.parse_keep(keep)
    if not root:
        raise model.BadInput("root is empty")
    if model.is_url(root):
        from dispatch_fence import objectstore

        objectstore.split_url(root)
    target = _target(root, attempt_value, group)
    try:
        started = torch_dcp.async_save(state_dict, checkpoint_id=target, process_group=group)
    except BaseException:
        if model.is_url(root):
            shutil.rmtree(target, ignore_errors=True)
        raise
    future = getattr(started, "upload_completion", started)  # an AsyncSaveResponse when staging is asynchronous
    return AsyncSave(future, target, root, epoch=epoch_value, attempt=attempt_value, keep=keep, group=group)


def _publish_to_store(local: str, root: str, *, epoch: int, attempt: str, keep: int | None,
                      group: Any) -> model.Checkpoint:
    from dispatch_fence import objectstore

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
            marker = os.path.join(local, model.MARKER)
            open(marker, "wb").close()
            outcome = _outcome(objectstore.finish, pending, marker, keep=keep)
    return _result(_broadcast(outcome, group))


def load(state_dict: dict[str, Any], root: str, *, process_group: Any = None) -> model.Checkpoint | None:
    """Load what ROOT/LATEST names into STATE_DICT, in place (DCP); collective. None (STATE_DICT
    untouched) before the first save. The coordinator reads LATEST once, so every rank loads the
    same checkpoint even if a save commits meanwhile."""
    group, root = process_group, os.fspath(root)
    found = _result(_broadcast(_outcome(roots.latest, root) if _rank(group) == 0 else None, group))
    if found is None:
        return None
    if not model.is_url(root):
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
