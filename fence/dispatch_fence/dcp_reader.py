"""The fence as a storage layer of PyTorch Distributed Checkpoint, the read
side: a StorageReader that torch.distributed.checkpoint.load uses unchanged
(docs/checkpoint.md, "PyTorch DCP").

    torch.distributed.checkpoint.load(state_dict, storage_reader=dcp_reader.Reader(found.path))
    torch.distributed.checkpoint.load(state_dict, storage_reader=dcp_reader.Reader("s3://training/llama-ft"))

It reads a published checkpoint: one named by its path (a directory or URL
whose last segment is a checkpoint's name), or what a root's LATEST names,
read by every rank in read_metadata (dispatch_fence.dcp.load reads LATEST on
one rank and hands every rank the same checkpoint, which a root alone cannot
promise while another save commits).

Each rank reads only what its load plan asks for: the byte ranges the
metadata gives for its items, those of one file that touch merged into one
read, each read one ranged GET (S3 `Range:`, GCS alt=media with a Range) or
one seek and read on a POSIX root. Nothing is downloaded whole but
`.metadata`. An item's bytes are what torch.save wrote (dispatch_fence.
dcp_storage, or DCP's FileSystemWriter without transforms); the tensor is
loaded from them, narrowed to the item's part and copied into the planner's.

Needs torch; above dispatch_fence.dcp_storage (the names of the format).
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
)
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from dispatch_fence import dcp_storage, model, objectstore, roots


def spans(entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges of one file, merged where they touch or overlap, in order: the reads."""
    out: list[list[int]] = []
    for start, length in sorted(entries):
        if out and start <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], start + length - out[-1][0])
        else:
            out.append([start, length])
    return [(s, n) for s, n in out]


def resolve(where: str) -> model.Checkpoint:
    """The checkpoint WHERE names: itself when its last segment is a checkpoint's name, else what the
    root's LATEST names; BadInput when the root has none yet."""
    parent, _, last = where.rstrip("/").rpartition("/")
    found = model.parse_name(parent, last) if parent else None
    if found is not None:
        return found
    found = roots.latest(where)
    if found is None:
        raise model.BadInput(f"{where} holds no checkpoint yet (no {model.LATEST}): nothing to load")
    return found


class Reader(StorageReader):
    """Reads the checkpoint WHERE names (or the checkpoint_id DCP is given); see the module's docstring.
    `checkpoint` is the one the last read_metadata found."""

    def __init__(self, where: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self.where: str | None = None if where is None else dcp_storage.root_of(where, "where")
        self.checkpoint: model.Checkpoint | None = None
        self._storage: dict[Any, Any] = {}

    @property
    def checkpoint_id(self) -> str | None:
        return self.where

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.where = dcp_storage.root_of(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return dcp_storage.Writer.validate_checkpoint_id(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.where is None:
            raise model.BadInput("where: give Reader(where) or checkpoint_id= to load")
        self.checkpoint = resolve(self.where)
        try:
            metadata = pickle.loads(self._read(dcp_storage.METADATA, None))
        except (pickle.UnpicklingError, EOFError, AttributeError) as exc:
            raise model.CorruptRoot(f"{self.checkpoint.path}/{dcp_storage.METADATA} is not DCP metadata: "
                                    f"{type(exc).__name__}") from None
        if not isinstance(metadata, Metadata):
            raise model.CorruptRoot(f"{self.checkpoint.path}/{dcp_storage.METADATA} is not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._storage = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _read(self, rel: str, span: tuple[int, int] | None) -> bytes:
        """The checkpoint's file REL, whole or SPAN = (start, length) of it."""
        found = self.checkpoint
        assert found is not None
        if model.is_url(found.path):
            return objectstore.read_file(found, rel, span)
        path = os.path.join(found.path, *rel.split("/"))
        try:
            with open(path, "rb") as f:
                if span is None:
                    return f.read()
                f.seek(span[0])
                data = f.read(span[1])
        except OSError as exc:
            raise model.CorruptRoot(f"{path}: cannot read: {exc.strerror}") from None
        if len(data) != span[1]:
            raise model.CorruptRoot(f"{path} ends before byte {span[0] + span[1]}: {found.name} is not whole")
        return data

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, list[tuple[Any, ReadItem]]] = {}
        for item in plan.items:
            info = self._storage.get(item.storage_index)
            if info is None:
                raise model.CorruptRoot(f"{self.where}: the metadata names no bytes for {item.storage_index.fqn}")
            if getattr(info, "transform_descriptors", None):
                raise model.BadInput(f"{item.storage_index.fqn} was written with transforms "
                                     f"{list(info.transform_descriptors)}, which this reader does not undo")
            by_file.setdefault(info.relative_path, []).append((info, item))
        for rel, entries in by_file.items():
            for start, length in spans([(info.offset, info.length) for info, _ in entries]):
                data = memoryview(self._read(rel, (start, length)))
                for info, item in entries:
                    if start <= info.offset < start + length:
                        self._load(item, data[info.offset - start:info.offset - start + info.length], planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _load(self, item: ReadItem, data: memoryview, planner: LoadPlanner) -> None:
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data))
            return
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths)):
            tensor = tensor.narrow(dim, offset, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise model.CorruptRoot(f"{item.storage_index.fqn}: the checkpoint holds {tuple(tensor.size())}, "
                                    f"the state {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(item, target)
