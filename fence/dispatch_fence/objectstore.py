"""The fence on an object store: the POSIX fence's rule, names, errors and exit
codes where there is neither a rename nor a lock (docs/checkpoint.md, "Object
stores").

A root is a URL, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`:

    PREFIX/LATEST                                    "ckpt-...\\n": replaced only by compare-and-set
    PREFIX/ckpt-<epoch>-<serial>-<attempt>/<files>   each created only if absent, the marker last

`publish` uploads a complete local staging directory:

  1. validate; walk the staging directory (regular files; the marker must be there)
  2. once per store and process: probe that the store honours conditional writes
     (a create-only write over an existing object and a write on a stale version
     must both be refused); a store that ignores them is refused: UnsupportedStore
  3. LIST the root, one request: the checkpoint names under it, and LATEST's version
     (S3 ETag, GCS generation)
  4. the fence (model.check_fence): an epoch lower than the highest in the root
     is refused, StaleEpoch, nothing written
  5. upload each file under PREFIX/<name>/, create-only; the marker last. The name
     carries epoch, serial and attempt, so no other execution can name it; the first
     object (the smallest file) claims it (two savers of one execution that chose one
     serial: the loser lists again and takes the next). The rest go up on the store's
     streams while the claim does, a file above the threshold in parts
     (dispatch_fence.transfer), and each becomes visible (its PutObject sent, its
     multipart upload completed) only once the claim has landed
  6. replace LATEST only if it is still the version listed in 3 (If-Match, or
     If-None-Match: * when there was none; GCS ifGenerationMatch): the commit point.
     A lost race (412): LIST again and fence again; refused, the objects of 5 are
     deleted and StaleEpoch raised; otherwise 6 again on the new version
  7. keep=K: remove all but the newest K checkpoints, never the one LATEST names nor
     any at or above it, the marker first (best effort, after the commit)

Why LATEST's epoch never decreases: the write in 6 succeeds only on the exact
version of LATEST that 3 listed, and what that version names was uploaded before
it, so it is among the names 3 listed, which the fence in 4 compared against.
A crash anywhere leaves LATEST as it was or replaced whole (a PUT is atomic);
what a crashed publish uploaded is never named, and still fences (its epoch
counts in 4, as a checkpoint directory LATEST does not name does on POSIX).

Built on dispatch_fence.model, beside dispatch_fence.posix (neither imports the
other); dispatch_fence.roots validates the caller's input and sends a URL root
here. Standard library only: the clients live in dispatch_fence.s3 and
dispatch_fence.gcs, below this module (they know only dispatch_fence.client and
dispatch_fence.transfer), and are imported only for a root of their scheme. A
publish costs two requests over a plain upload of the same files (the LIST and
the LATEST write) once the store has been probed.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
from dataclasses import dataclass

from dispatch_fence import client, model, transfer

STEPS = ("staged", "fenced", "uploading", "uploaded", "replaced", "pruning", "done")
"""Where the test hook (model.TEST_HOOK_FD) stops an object-store publish. The commit point
is between uploaded and replaced."""
SCHEMES = ("s3", "gs")
MAX_CLAIMS = 20
"""Names tried in step 5 before giving up (another saver of the same execution kept taking them)."""
MAX_COMMITS = 100
"""Writes of LATEST tried in step 6 before giving up (each lost one means another publish committed)."""


class UnsupportedStore(model.UnwritableRoot):
    """The store does not honour conditional writes: it cannot be fenced, so nothing is published. Exit 2."""


# The clients' interface lives in dispatch_fence.client (below the clients, which this module
# imports); its names stay names of this module too, for the code that used them from here.
Exists, Conflict, Listing, Store = client.Exists, client.Conflict, client.Listing, client.Store

_stores: dict[str, client.Store] = {}
_probed: set[str] = set()


def split_url(root: str) -> tuple[str, str, str]:
    """(scheme, bucket, prefix without slashes at either end); BadInput naming the root otherwise."""
    scheme, _, rest = root.partition("://")
    if scheme not in SCHEMES:
        raise model.BadInput(f"root {root}: the scheme {scheme!r} is not one of {', '.join(s + '://' for s in SCHEMES)}")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise model.BadInput(f"root {root} names no bucket")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise model.BadInput(f"root {root}: the prefix {prefix!r} has an empty, '.' or '..' segment")
    return scheme, bucket, prefix


def open_root(root: str) -> client.Store:
    """The store for ROOT, one per root and process (configured from the environment)."""
    if root in _stores:
        return _stores[root]
    scheme, bucket, prefix = split_url(root)
    url = f"{scheme}://{bucket}" + (f"/{prefix}" if prefix else "")
    try:
        if scheme == "s3":
            from dispatch_fence import s3 as kind
        else:
            from dispatch_fence import gcs as kind  # type: ignore[no-redef]
    except ImportError as exc:
        extra = "s3" if scheme == "s3" else "gcs"
        raise model.BadInput(
                             f"root {root} needs the {extra} extra (pip install 'dispatch-fence[{extra}]'): {exc}") from None
    store: client.Store = kind.Store(bucket=bucket, prefix=prefix, url=url)
    _stores[root] = store
    return store


def probe(store: client.Store) -> None:
    """Refuse a store that ignores conditional writes (UnsupportedStore), once per store and process.

    Three writes and a delete of a probe object under the root: create it; create it again
    (must be refused); replace it on a version it never had (must be refused)."""
    if store.url in _probed:
        return
    key = f".fence-probe-{os.getpid()}-{secrets.token_hex(6)}"
    where = f"{store.url} does not honour conditional writes"
    then = "the fence cannot be kept there; refused, nothing published (docs/checkpoint.md, Object stores)"
    try:
        store.create(key, b"probe 1\n")
    except client.Exists:  # a random name: only another process's probe could hold it
        raise model.UnwritableRoot(f"{store.url}/{key}, the probe's new object, exists already; "
                                   "nothing published") from None
    try:
        try:
            store.create(key, b"probe 2\n")
        except client.Exists:
            pass
        else:
            raise UnsupportedStore(f"{where}: a create-only write over an existing object succeeded; {then}")
        try:
            store.replace(key, b"probe 3\n", version=store.stale_version)
        except client.Conflict:
            pass
        else:
            raise UnsupportedStore(f"{where}: a write on a stale version succeeded; {then}")
    finally:
        store.delete(key)
    _probed.add(store.url)


def _known(store: client.Store, listing: client.Listing) -> list[model.Checkpoint]:
    found = (model.parse_name(store.url, name) for name in listing.names)
    return sorted((c for c in found if c is not None), key=lambda c: c.key)


def checkpoints(root: str) -> list[model.Checkpoint]:
    """Every checkpoint prefix under ROOT, oldest first (complete or not: a crashed publish's too)."""
    store = open_root(root)
    return _known(store, store.list_root())


def _read_latest(store: client.Store) -> model.Checkpoint | None:
    data = store.read(model.LATEST)
    if data is None:
        return None
    text = data.decode("ascii", "replace")
    found = model.parse_name(store.url, text[:-1]) if text.endswith("\n") and text.count("\n") == 1 else None
    if found is None:
        raise model.CorruptRoot(f"{store.url}/{model.LATEST} holds {text[:80]!r}, not one checkpoint name "
                                "on one line: not written by this fence")
    return found


def latest(root: str) -> model.Checkpoint | None:
    """The checkpoint ROOT/LATEST names; None before the first publish. CorruptRoot when LATEST is not
    one of ours or names a checkpoint whose marker is gone. LATEST is replaced whole, so a reader sees
    the old one or the new one."""
    store = open_root(root)
    found = _read_latest(store)
    if found is not None and not store.exists(f"{found.name}/{model.MARKER}"):
        raise model.CorruptRoot(f"{store.url}/{model.LATEST} names {found.name}, "
                                f"which is not a complete checkpoint in {store.url}")
    return found


def _files(staging: str) -> list[tuple[str, str]]:
    """(key under the checkpoint, local path) of every file in STAGING, the marker last."""
    model.check_staging(staging)
    out = []
    for dirpath, dirnames, filenames in os.walk(staging, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, staging).replace(os.sep, "/")
            if os.path.islink(path) or not os.path.isfile(path):
                raise model.BadInput(f"staging {staging} holds {rel}, which is not a regular file "
                                     "(an object store holds files only); nothing published")
            if rel != model.MARKER:
                out.append((rel, path))
    return out + [(model.MARKER, os.path.join(staging, model.MARKER))]


def _claim(store: client.Store, first: tuple[str, str | bytes], *, epoch: int, attempt: str, listing: client.Listing,
           alongside: list[tuple[str, str]]) -> tuple[model.Checkpoint, client.Listing]:
    """Step 5's start: take a name by creating its first object. ALONGSIDE go up meanwhile under the
    same name, and become visible only once the claim has landed (transfer.Gate): aborted when
    it did not, and sent again under the next name."""
    for _ in range(MAX_CLAIMS):
        serial = 1 + max((c.serial for c in _known(store, listing)), default=0)
        name = model.name_of(epoch, serial, attempt)
        gate = transfer.Gate()
        rest = transfer.behind(lambda name=name, gate=gate: _add(store, name, alongside, gate)) if alongside else None
        try:
            store.create(f"{name}/{first[0]}", first[1])
        except client.Exists:
            gate.open(False)
            _settle(rest)
            listing = store.list_root()  # another saver of this execution took the serial
            model.check_fence(epoch, _known(store, listing), root=store.url)
            continue
        except BaseException:
            gate.open(False)
            _settle(rest)
            raise
        gate.open(True)
        if rest is not None:
            rest.result()
        found = model.parse_name(store.url, name)
        assert found is not None
        return found, listing
    raise model.UnwritableRoot(f"{store.url}: {MAX_CLAIMS} names were taken while this publish claimed one; "
                               "nothing published")


def _settle(rest: concurrent.futures.Future[None] | None) -> None:
    """Wait for uploads whose gate closed; they aborted (what failed otherwise is moot now)."""
    if rest is not None:
        concurrent.futures.wait([rest])


def _add(store: client.Store, name: str, files: list[tuple[str, str | bytes]], gate: transfer.Gate | None = None) -> None:
    """Upload FILES under NAME, create-only, on the store's streams (each file above the threshold in
    parts); the first failure is raised once every upload started has ended."""

    def one(file: tuple[str, str | bytes]) -> None:
        rel, path = file
        try:
            store.create(f"{name}/{rel}", path, gate=gate)
        except client.Exists:
            raise model.CorruptRoot(f"{store.url}/{name}/{rel} exists already: not placed by this fence; "
                                    f"the checkpoint in {store.url}/{name} is incomplete, LATEST not advanced") from None

    transfer.each_file(store.settings.streams, one, files)


def _remove(store: client.Store, name: str) -> None:
    """Delete a checkpoint's objects, the marker first (a half-deleted checkpoint is never complete)."""
    store.delete(f"{name}/{model.MARKER}")
    for key in store.list_keys(name):
        store.delete(key)


def _commit(store: client.Store, new: model.Checkpoint, listing: client.Listing) -> None:
    """Step 6: compare-and-set LATEST on the listed version; on a lost race, fence again and retry."""
    for _ in range(MAX_COMMITS):
        try:
            store.replace(model.LATEST, f"{new.name}\n".encode("ascii"), version=listing.latest)
            return
        except client.Conflict:
            listing = store.list_root()
            try:
                model.check_fence(new.epoch, _known(store, listing), root=store.url)
            except model.StaleEpoch:
                _remove(store, new.name)
                raise
            if not store.exists(f"{new.name}/{model.MARKER}"):  # another save of this execution pruned it
                raise model.UnwritableRoot(f"{new.path} was removed by the retention of another save of the "
                                           "same execution before it was named; LATEST not advanced")
    raise model.UnwritableRoot(f"{store.url}: LATEST changed {MAX_COMMITS} times while this publish tried to "
                               f"replace it; the checkpoint is in {new.path}, LATEST not advanced")


def _prune(store: client.Store, keep: int, new: model.Checkpoint) -> None:
    """Step 7, after the commit, so best effort. Only checkpoints below what LATEST names now are
    candidates: one at or above it may be another publish's, about to be named."""
    try:
        named = _read_latest(store)
        if named is None:
            return
        for c in _known(store, store.list_root())[:-keep]:
            if c.name in (named.name, new.name) or c.key >= named.key:
                continue
            model.hook("pruning")
            _remove(store, c.name)
    except model.CheckpointError:
        pass


@dataclass(frozen=True)
class Pending:
    """A publish between its claim (`begin`) and its commit (`finish`): for a checkpoint whose files
    are uploaded by several processes (dispatch_fence.dcp: every rank its own shards)."""

    root: str
    checkpoint: model.Checkpoint
    listing: client.Listing


def begin(root: str, first: tuple[str, str | bytes], *, epoch: int, attempt: str,
          alongside: list[tuple[str, str]] | None = None) -> Pending:
    """Steps 2 to 5's start: probe, list, fence (StaleEpoch), claim a name by uploading FIRST
    (key under the checkpoint, local path or the bytes); ALONGSIDE go up under the name meanwhile."""
    store = open_root(root)
    probe(store)
    model.hook("staged")
    listing = store.list_root()
    model.check_fence(epoch, _known(store, listing), root=store.url)
    model.hook("fenced")
    new, listing = _claim(store, first, epoch=epoch, attempt=attempt, listing=listing, alongside=alongside or [])
    model.hook("uploading")
    return Pending(root, new, listing)


def add(root: str, name: str, files: list[tuple[str, str | bytes]]) -> None:
    """Step 5: upload FILES (key under the checkpoint, local path or the bytes) into the claimed checkpoint NAME,
    create-only; from any process."""
    _add(open_root(root), name, files)


def finish(pending: Pending, marker: str | bytes | None, *, keep: int | None) -> model.Checkpoint:
    """Step 5's end to 7: the marker last (None: it was the claim), the compare-and-set of LATEST
    (StaleEpoch when a newer execution committed meanwhile: what was uploaded is deleted), retention."""
    store, new = open_root(pending.root), pending.checkpoint
    if marker is not None:
        _add(store, new.name, [(model.MARKER, marker)])
    model.hook("uploaded")
    _commit(store, new, pending.listing)
    model.hook("replaced")
    if keep is not None:
        _prune(store, keep, new)
    model.hook("done")
    return new


def abandon(pending: Pending) -> None:
    """Delete what a publish that will not commit uploaded (best effort)."""
    try:
        _remove(open_root(pending.root), pending.checkpoint.name)
    except model.CheckpointError:
        pass


def _root_of(found: model.Checkpoint) -> client.Store:
    return open_root(found.path[:-len(found.name) - 1])


def read_file(found: model.Checkpoint, rel: str, span: tuple[int, int] | None = None) -> bytes:
    """The file REL of the checkpoint FOUND (from latest() or checkpoints() of a URL root): whole, or
    SPAN = (start, length) of it by one ranged GET. CorruptRoot when it is not there."""
    store, key = _root_of(found), f"{found.name}/{rel}"
    data = store.read(key) if span is None else store.read_range(key, *span)
    if data is None:
        raise model.CorruptRoot(f"{store.url}/{key} is missing: {found.name} is not whole")
    return data


def download(found: model.Checkpoint, dest: str) -> None:
    """Copy the checkpoint FOUND into the local directory DEST, each object into a file of the same
    relative path (read whole, in memory)."""
    store = _root_of(found)
    for key in store.list_keys(found.name):
        data = read_file(found, key[len(found.name) + 1:])
        path = os.path.join(dest, *key[len(found.name) + 1:].split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def publish(staging: str, root: str, *, epoch: int, attempt: str, keep: int | None) -> model.Checkpoint:
    """roots.publish for a URL root (validated by it): upload STAGING under a new name, then
    advance LATEST by compare-and-set. STAGING is left as it was. See the module's docstring."""
    files = _files(staging)
    # The claim is the smallest file; the rest go up while it does and appear once it has landed.
    first = min(files[:-1] or files, key=lambda f: os.stat(f[1]).st_size)
    pending = begin(root, first, epoch=epoch, attempt=attempt, alongside=[f for f in files[:-1] if f is not first])
    return finish(pending, files[-1][1] if first is not files[-1] else None, keep=keep)
