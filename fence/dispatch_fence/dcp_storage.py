"""The fence as a storage layer of PyTorch Distributed Checkpoint: a
StorageWriter that torch.distributed.checkpoint.save and async_save use
unchanged, and publishes through the fence (docs/checkpoint.md, "PyTorch DCP").

    writer = dcp_storage.Writer("s3://training/llama-ft", keep=3)   # epoch, attempt from the environment
    torch.distributed.checkpoint.save(state_dict, storage_writer=writer)
    future = torch.distributed.checkpoint.async_save(state_dict, storage_writer=writer)

DCP calls the writer in four steps; the fence takes part in two of them:

  prepare_global_plan  (coordinator) the fence, early: an epoch lower than one in the root
                       is refused before anything is written. An object-store root claims
                       the checkpoint's name here (objectstore.begin, a small `.claim`
                       object, create-only); a POSIX root makes the staging directory
                       ROOT/.staging-<attempt>-<nonce>. The plan tells every rank where.
  write_data           (every rank) its items into one file of its own, `__<rank>_0.distcp`,
                       each tensor by torch.save at its offset: into the staging directory,
                       or uploaded create-only under the claimed name straight from here, so
                       under async_save the upload runs in DCP's thread, beside training.
  finish               (coordinator, after every rank's write_data returned) `.metadata`, the
                       marker, then the publish: roots.publish (the rename under the lock) or
                       objectstore.finish (LATEST by compare-and-set). Both fence again; a
                       newer execution's LATEST refuses it (StaleEpoch) and nothing is named.

An error in either step of the coordinator reaches every rank: DCP raises a
CheckpointException on every rank whose `failures` hold it; `refusal` finds the
fence's error in one. The on-disk format is DCP's own (`.metadata` pickled, each
item a _StorageInfo), so FileSystemReader reads a POSIX checkpoint too.

async_save copies the state before it returns (Writer.stage: every tensor copied to the CPU),
so the writes in DCP's thread see the state as it was at the call while training changes it.
The writer is its own AsyncStager for one reason: torch 2.4's staging moves tensors to the CPU
without copying those already there, so a CPU tensor changed by training after async_save
returned was written as it then was. Newer torch's default stager copies (2.15's does), as this
one does at every version; an async_stager= given to async_save, where torch takes one, wins.

What a failed save leaves: a rank's failed write stops DCP before finish, so a
claimed name on an object store holds part of a checkpoint without the marker
(never named; it fences, as a crashed publish's objects do), and a POSIX
staging directory stays beside the checkpoints.

Needs torch; above dispatch_fence.roots and dispatch_fence.objectstore, and
nothing of the fence imports it but the DCP integration's other modules.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import pickle
import secrets
import tempfile
from typing import Any

import torch
from torch.distributed.checkpoint import filesystem as torch_fs
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from dispatch_fence import model, objectstore, roots

METADATA = ".metadata"
"""DCP's own name for the metadata file."""
CLAIM = ".claim"
"""On an object store: the object that claims a checkpoint's name before any rank uploads into it."""
SUFFIX = ".distcp"


def root_of(checkpoint_id: object, field: str = "checkpoint_id") -> str:
    """A root (a directory or an s3:// or gs:// URL) from what DCP passes; BadInput naming FIELD otherwise."""
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise model.BadInput(f"{field} must be a path or an s3:// or gs:// URL, found {type(checkpoint_id).__name__}")
    root = os.fspath(checkpoint_id)
    if not isinstance(root, str) or not root:
        raise model.BadInput(f"{field} is empty")
    if model.is_url(root):
        objectstore.split_url(root)
    return root


def refusal(exc: BaseException) -> model.CheckpointError | None:
    """The fence's error (StaleEpoch, UnwritableRoot, ...) in a CheckpointException DCP raised, the
    lowest rank's first; EXC itself when it is one; None when the fence did not refuse."""
    if isinstance(exc, model.CheckpointError):
        return exc
    failures = getattr(exc, "failures", None) or {}
    for rank in sorted(failures):
        found = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
        if isinstance(found, model.CheckpointError):
            return found
    return None


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a rank writes, as the coordinator's plan tells it (SavePlan.storage_data)."""

    where: str
    """The staging directory (a POSIX root) or the claimed checkpoint's name (a URL root)."""
    file: str


def _tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor torch.save writes as itself: on the CPU, and not a view that would drag its whole storage along."""
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size() or not tensor.is_contiguous():
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def staged(value: Any) -> Any:
    """A copy of a state dict VALUE that training cannot change: each tensor (a DTensor too) copied
    to the CPU, containers rebuilt, anything else but bytes and numbers deep-copied, as DCP's own
    stager does."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: staged(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [staged(item) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, io.BytesIO):
        return io.BytesIO(value.getvalue())
    if value is None or isinstance(value, (int, float, str, bytes)):
        return value
    return copy.deepcopy(value)


class Writer(StorageWriter, AsyncStager):
    """Writes a DCP checkpoint into ROOT (or the checkpoint_id DCP is given) and publishes it, fenced
    by EPOCH; see the module's docstring. EPOCH and ATTEMPT default to $DISPATCH_EPOCH and
    $DISPATCH_ATTEMPT, checked here; KEEP keeps the newest KEEP checkpoints. `checkpoint` is what
    the coordinator published last (None on the other ranks)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, keep: int | None = None,
                 epoch: int | str | None = None, attempt: str | None = None) -> None:
        super().__init__()
        self.epoch, self.attempt = model.execution(epoch, attempt)
        self.keep = model.parse_keep(keep)
        self.root: str | None = None if root is None else root_of(root, "root")
        self.checkpoint: model.Checkpoint | None = None
        self._pending: objectstore.Pending | None = None
        self._staging: str | None = None

    @property
    def checkpoint_id(self) -> str | None:
        return self.root

    # Staging copies before async_save returns: nothing is left for DCP to wait for after it.
    _synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """async_save's copy of STATE_DICT (see the module's docstring)."""
        result: dict[str, Any] = staged(state_dict)
        return result

    def synchronize_staging(self) -> None:
        """Nothing to wait for: stage copies before it returns."""

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.root = root_of(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            root_of(checkpoint_id)
        except model.BadInput:
            return False
        return True

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.root is None:
            raise model.BadInput("root: give Writer(root) or checkpoint_id= to save")
        if kwargs.get("use_collectives") is False:
            raise model.BadInput("use_collectives=False: the fence publishes once, after every rank wrote")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        where = self._begin()
        return [dataclasses.replace(plan, storage_data=Target(where, f"__{rank}_0{SUFFIX}"))
                for rank, plan in enumerate(plans)]

    def _begin(self) -> str:
        """The coordinator's start of a save: the fence, and where every rank writes."""
        assert self.root is not None
        self.checkpoint, self._pending, self._staging = None, None, None
        if model.is_url(self.root):
            claim = f"{self.epoch} {self.attempt}\n".encode()
            self._pending = objectstore.begin(self.root, (CLAIM, claim), epoch=self.epoch, attempt=self.attempt)
            return self._pending.checkpoint.name
        # Early, so a superseded execution writes nothing; publish fences again under the lock.
        model.check_fence(self.epoch, roots.checkpoints(self.root), root=self.root)
        staging = os.path.join(self.root, f".staging-{self.attempt}-{secrets.token_hex(4)}")
        try:
            os.makedirs(staging)
        except OSError as exc:
            raise model.UnwritableRoot(f"root {self.root}: cannot make {staging}: {exc.strerror}; "
                                       "nothing published") from None
        self._staging = staging
        return staging

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        assert self.root is not None
        target = plan.storage_data
        if not isinstance(target, Target):
            raise model.BadInput("the save plan carries no target of this writer: was another writer's plan used?")
        done: Future[list[WriteResult]] = Future()
        if not plan.items:
            done.set_result([])
            return done
        url = model.is_url(self.root)
        if url:
            fd, path = tempfile.mkstemp(prefix="dispatch-fence-dcp-", suffix=SUFFIX)
            os.close(fd)
        else:
            path = os.path.join(target.where, target.file)
        try:
            results = self._write(path, plan, planner, target.file)
            if url:
                objectstore.add(self.root, target.where, [(target.file, path)])
        finally:
            if url:
                os.unlink(path)
        done.set_result(results)
        return done

    def _write(self, path: str, plan: SavePlan, planner: SavePlanner, name: str) -> list[WriteResult]:
        """Every item of PLAN into PATH, one after another; where each landed (DCP's _StorageInfo)."""
        results = []
        try:
            with open(path, "wb") as f:
                for item in plan.items:
                    offset = f.tell()
                    data = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        f.write(data.getbuffer())
                    else:
                        torch.save(_tensor_bytes(data), f)
                    length = f.tell() - offset
                    results.append(WriteResult(index=item.index, size_in_bytes=length,
                                               storage_data=torch_fs._StorageInfo(name, offset, length)))
        except OSError as exc:
            raise model.UnwritableRoot(f"{path}: cannot write: {exc.strerror}; nothing published") from None
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        assert self.root is not None
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        if hasattr(torch_fs, "CURRENT_DCP_VERSION"):  # the format's version, where this torch has one
            metadata.version = torch_fs.CURRENT_DCP_VERSION
        blob = pickle.dumps(metadata)
        if self._pending is not None:
            objectstore.add(self.root, self._pending.checkpoint.name, [(METADATA, blob)])
            self.checkpoint = objectstore.finish(self._pending, b"", keep=self.keep)
            return
        assert self._staging is not None
        try:
            for name, data in ((METADATA, blob), (model.MARKER, b"")):
                with open(os.path.join(self._staging, name), "wb") as f:
                    f.write(data)
        except OSError as exc:
            raise model.UnwritableRoot(f"{self._staging}: cannot write: {exc.strerror}; nothing published") from None
        self.checkpoint = roots.publish(self._staging, self.root, epoch=self.epoch, attempt=self.attempt,
                                        keep=self.keep)
