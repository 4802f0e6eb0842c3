"""PyTorch Distributed Checkpoint (torch.distributed.checkpoint) through the
fence, in one call each: DCP's own save, async_save and load with the fence's
storage layer (dispatch_fence.dcp_storage.Writer, dispatch_fence.dcp_reader.Reader),
and the fence's errors raised as themselves (docs/checkpoint.md, "PyTorch DCP").

    from dispatch_fence import dcp
    found = dcp.load(state_dict, root)                # None before the first save; in place otherwise
    ...
    dcp.save(state_dict, root, keep=3)                # on every rank; StaleEpoch on every rank if refused
    pending = dcp.async_save(state_dict, root, keep=3)  # returns once DCP holds a copy; uploaded meanwhile
    ...
    pending.result()                                  # on every rank: the checkpoint; StaleEpoch on every rank if refused

Every rank calls them all (they are collectives on the default process group, or
PROCESS_GROUP). The coordinator is the group's rank 0: it fences and claims in
DCP's global plan and publishes in DCP's finish (dispatch_fence.dcp_storage);
DCP carries an error of either to every rank as a CheckpointException, which
these functions turn back into the fence's own error, so every rank raises the
same StaleEpoch and a refused save stops the whole execution alike. The
published checkpoint is broadcast from the coordinator, so every rank returns it.

async_save is DCP's: it returns once the state is copied, and its thread then
plans, writes and uploads every rank's file and publishes once every rank's
write has ended, while training goes on. result() waits for that on every rank
(a collective: the checkpoint is broadcast), so LATEST never names a checkpoint
a rank is still writing; a superseded execution's save is refused when it plans
(before anything is written) or when it publishes (a newer execution published
while it was written; what it uploaded is deleted).

load: rank 0 reads LATEST once and broadcasts it, so every rank loads the same
checkpoint even if a save commits meanwhile; each rank reads only the byte
ranges its plan asks for (dispatch_fence.dcp_reader).

Needs torch and numpy (DCP's collectives of Python objects need numpy); not
dependencies of the package: training images bring their own. An integration,
above the storage layer; nothing of the fence imports it.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.api import CheckpointException

from dispatch_fence import dcp_reader, dcp_storage, model, roots


def _rank(group: Any) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _broadcast(value: object, group: Any) -> Any:
    """VALUE from the group's rank 0, on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return box[0]


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


def _fence_error(exc: CheckpointException) -> BaseException:
    """The fence's own error inside DCP's CheckpointException, else that exception itself."""
    return dcp_storage.refusal(exc) or exc


def _published(writer: dcp_storage.Writer, group: Any) -> model.Checkpoint:
    """The checkpoint the coordinator's writer published, on every rank; collective."""
    found = _broadcast(writer.checkpoint if _rank(group) == 0 else None, group)
    assert found is not None
    return found


def _writer(root: str | os.PathLike[str], keep: int | None, epoch: int | str | None,
            attempt: str | None) -> dcp_storage.Writer:
    return dcp_storage.Writer(dcp_storage.root_of(root, "root"), keep=keep, epoch=epoch, attempt=attempt)


def save(state_dict: dict[str, Any], root: str | os.PathLike[str], *, keep: int | None = None,
         epoch: int | str | None = None, attempt: str | None = None, process_group: Any = None) -> model.Checkpoint:
    """Save STATE_DICT with DCP and publish it into ROOT, fenced by the epoch; collective.

    Returns the published Checkpoint on every rank; raises StaleEpoch (or another CheckpointError)
    on every rank when the coordinator's fence refuses it. EPOCH and ATTEMPT default to
    $DISPATCH_EPOCH and $DISPATCH_ATTEMPT."""
    writer = _writer(root, keep, epoch, attempt)
    try:
        torch_dcp.save(state_dict, storage_writer=writer, process_group=process_group)
    except CheckpointException as exc:
        raise _fence_error(exc) from None
    return _published(writer, process_group)


class AsyncSave:
    """A save started by async_save: DCP writes, uploads and publishes in its thread; result() waits."""

    def __init__(self, future: Any, writer: dcp_storage.Writer, group: Any) -> None:
        self._future, self._writer, self._group = future, writer, group
        self._outcome: tuple[str, Any] | None = None

    def done(self) -> bool:
        """Whether this rank's part of the save has ended (result() then waits on the others only)."""
        return bool(self._future.done())

    def result(self) -> model.Checkpoint:
        """Wait until the save ended on every rank; collective (every rank calls it, at the same point).
        Returns the published Checkpoint on every rank, or raises StaleEpoch (or another
        CheckpointError) on every rank. Once resolved, it returns (or raises) the same again
        without a collective."""
        if self._outcome is None:
            self._outcome = _outcome(self._finish)
        return _result(self._outcome)

    def _finish(self) -> model.Checkpoint:
        try:
            self._future.result()
        except CheckpointException as exc:
            raise _fence_error(exc) from None
        return _published(self._writer, self._group)


def async_save(state_dict: dict[str, Any], root: str | os.PathLike[str], *, keep: int | None = None,
               epoch: int | str | None = None, attempt: str | None = None, process_group: Any = None) -> AsyncSave:
    """Start saving STATE_DICT with DCP's async_save: it returns once DCP holds a copy of the state;
    planning, every rank's upload and the publish run in DCP's thread, beside training; collective.
    AsyncSave.result(), on every rank, returns the checkpoint or raises the refusal. Arguments as
    save()'s, checked before anything is copied."""
    writer = _writer(root, keep, epoch, attempt)
    started = torch_dcp.async_save(state_dict, storage_writer=writer, process_group=process_group)
    future = getattr(started, "upload_completion", started)  # an AsyncSaveResponse when staging is asynchronous
    return AsyncSave(future, writer, process_group)


def load(state_dict: dict[str, Any], root: str | os.PathLike[str], *,
         process_group: Any = None) -> model.Checkpoint | None:
    """Load what ROOT/LATEST names into STATE_DICT, in place (DCP); collective. None (STATE_DICT
    untouched) before the first save. The coordinator reads LATEST once, so every rank loads the
    same checkpoint even if a save commits meanwhile; each rank reads only its plan's byte ranges."""
    group, root = process_group, dcp_storage.root_of(root, "root")
    found = _result(_broadcast(_outcome(roots.latest, root) if _rank(group) == 0 else None, group))
    if found is None:
        return None
    try:
        torch_dcp.load(state_dict, storage_reader=dcp_reader.Reader(found.path), process_group=group)
    except CheckpointException as exc:
        raise _fence_error(exc) from None
    return found
