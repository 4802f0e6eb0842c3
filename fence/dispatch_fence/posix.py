"""The fence on a POSIX root: a directory on a volume every rank shares
(docs/checkpoint.md, "A root on disk" and "The protocol").

A checkpoint is a directory `ROOT/ckpt-<epoch, 19 digits>-<serial>-<attempt>`;
`ROOT/LATEST` holds the name of the current one on one line. `publish` takes
an exclusive flock on `ROOT/.lock`, refuses an epoch lower than the highest
one in ROOT (LATEST's, or any checkpoint directory's), renames the staging
directory in, and replaces LATEST atomically (temporary file, fsync, rename,
fsync of the directory). An equal epoch advances: it is the same execution
saving again (every rank of one execution has the same epoch), and the
later save is the newer one; the serial keeps the names apart and orders
them.

Built on dispatch_fence.model alone, beside dispatch_fence.objectstore
(neither imports the other); dispatch_fence.roots picks one of them by the
root's kind and validates the caller's input first, so `publish` here takes
an epoch, attempt and keep already checked. Standard library only.
"""

from __future__ import annotations

import errno
import os
import shutil

from dispatch_fence import model

LOCK = ".lock"
STEPS = ("staged", "locked", "fenced", "moved", "written", "replaced", "pruning", "done")
"""The points at which the test hook stops a publish. The commit point is between written and replaced."""

_TMP_PREFIX = ".LATEST."
_TRASH_PREFIX = ".trash-"


# -- reading a root -----------------------------------------------------


def _read_latest(root: str) -> model.Checkpoint | None:
    """LATEST's checkpoint (not checked to exist); None when there is no LATEST."""
    path = os.path.join(root, model.LATEST)
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise model.BadInput(f"root {root} is not a directory") from None
    except OSError as exc:
        raise model.CorruptRoot(f"{path}: cannot read: {exc.strerror}") from None
    text = data.decode("ascii", "replace")
    found = model.parse_name(root, text[:-1]) if text.endswith("\n") and text.count("\n") == 1 else None
    if found is None:
        raise model.CorruptRoot(f"{path} holds {text[:80]!r}, not one checkpoint name on one line: "
                                "not written by this fence")
    return found


def checkpoints(root: str) -> list[model.Checkpoint]:
    """Every checkpoint directory in ROOT, oldest first (by epoch, then serial). [] when ROOT does not exist."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise model.BadInput(f"root {root} is not a directory") from None
    found = [c for c in map(lambda n: model.parse_name(root, n), names) if c is not None]
    return sorted((c for c in found if os.path.isdir(c.path) and not os.path.islink(c.path)), key=lambda c: c.key)


def latest(root: str) -> model.Checkpoint | None:
    """The checkpoint ROOT/LATEST names; None before the first publish (or when ROOT does not exist).

    Takes no lock: LATEST is only ever replaced by an atomic rename, so a
    reader sees the old name or the new one. CorruptRoot when LATEST is not
    one of ours or names a directory that is gone.
    """
    found = _read_latest(root)
    if found is not None and not os.path.isdir(found.path):
        raise model.CorruptRoot(f"{os.path.join(root, model.LATEST)} names {found.name}, "
                                f"which is not a directory in {root}")
    return found


# -- publishing ---------------------------------------------------------


def _fsync_path(path: str, *, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(top: str) -> None:
    """fsync every regular file and every directory under TOP (symlinks are not followed)."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                _fsync_path(path, directory=False)
        _fsync_path(dirpath, directory=True)  # a symlink's entry is made durable here


def _check_staging(staging: str, root: str) -> os.stat_result:
    st = model.check_staging(staging)
    real_staging, real_root = os.path.realpath(staging), os.path.realpath(root)
    if real_root == real_staging or real_root.startswith(real_staging.rstrip("/") + "/"):
        raise model.BadInput(f"root {root} is inside staging {staging}")
    if os.path.dirname(real_staging) == real_root and model.parse_name(root, os.path.basename(real_staging)):
        raise model.BadInput(f"staging {staging} is already a checkpoint of {root}")
    return st


def _make_root(root: str) -> None:
    try:
        if os.path.isdir(root):
            return
        parent = os.path.dirname(os.path.abspath(root))
        os.makedirs(root, exist_ok=True)
        _fsync_path(parent, directory=True)
    except OSError as exc:
        raise model.UnwritableRoot(f"root {root} cannot be created: {exc.strerror}; nothing published") from None


def _lock(root: str) -> int:
    import fcntl

    try:
        fd = os.open(os.path.join(root, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise model.UnwritableRoot(f"root {root} is not writable: {LOCK}: {exc.strerror}; nothing published") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        os.close(fd)
        raise model.UnwritableRoot(
            f"root {root} cannot be locked (flock: {exc.strerror}): the fence needs a filesystem with working "
            "locks (docs/checkpoint.md); nothing published"
        ) from None
    return fd


def _remove_leftovers(root: str) -> None:
    """Under the lock: a crashed publish's temporary LATEST, a crashed prune's trash."""
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(_TMP_PREFIX) and name.endswith(".tmp"):
            os.unlink(path)
        elif name.startswith(_TRASH_PREFIX):
            shutil.rmtree(path, ignore_errors=True)


def _write_latest(root: str, name: str) -> None:
    tmp = os.path.join(root, f"{_TMP_PREFIX}{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{name}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    model.hook("written")
    os.replace(tmp, os.path.join(root, model.LATEST))  # the commit point
    model.hook("replaced")
    _fsync_path(root, directory=True)


def _prune(root: str, keep: int, current: model.Checkpoint) -> list[model.Checkpoint]:
    """Remove all but the newest KEEP (never CURRENT), each renamed to trash first, so a
    checkpoint's name never stands for half a directory. After the commit point, so
    best effort: what cannot be removed now is left for the next publish."""
    removed = []
    try:
        for c in checkpoints(root)[:-keep]:
            if c.name == current.name:
                continue
            trash = os.path.join(root, _TRASH_PREFIX + c.name)
            os.rename(c.path, trash)
            removed.append(c)
            model.hook("pruning")
            shutil.rmtree(trash, ignore_errors=True)
        if removed:
            _fsync_path(root, directory=True)
    except OSError:
        pass
    return removed


def publish(staging: str, root: str, *, epoch: int, attempt: str, keep: int | None) -> model.Checkpoint:
    """roots.publish for a directory ROOT (EPOCH, ATTEMPT and KEEP validated by it): rename
    STAGING into ROOT under the lock, fenced by EPOCH, then replace LATEST. See the module's
    docstring; the errors are roots.publish's."""
    _check_staging(staging, root)
    try:
        _fsync_tree(staging)
    except OSError as exc:
        raise model.BadInput(f"staging {staging} cannot be synced: {exc.strerror}; nothing published") from None
    _make_root(root)
    model.hook("staged")
    lock = _lock(root)
    try:
        model.hook("locked")
        current = _read_latest(root)
        known = checkpoints(root) + ([current] if current else [])
        model.check_fence(epoch, known, root=root)
        model.hook("fenced")
        serial = 1 + max((c.serial for c in known), default=0)
        name = model.name_of(epoch, serial, attempt)
        new = model.Checkpoint(os.path.join(root, name), name, epoch, serial, attempt)
        where = "nothing published"
        try:
            _remove_leftovers(root)
            if os.path.lexists(new.path):  # rename(2) would replace an empty directory there
                raise model.CorruptRoot(f"{new.path} exists already: not placed by this fence")
            try:
                os.rename(staging, new.path)
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise model.BadInput(f"staging {staging} is on another filesystem (or mount) than root {root}: "
                                         "it must be renamed, not copied; nothing published") from None
                raise
            where = f"the checkpoint is in {new.path}, LATEST not advanced"
            _fsync_path(root, directory=True)
            parent = os.path.dirname(os.path.abspath(staging))
            if not os.path.samefile(parent, root):
                _fsync_path(parent, directory=True)  # the staging dir's entry is gone for good too
            model.hook("moved")
            _write_latest(root, new.name)
        except OSError as exc:
            if os.path.exists(os.path.join(root, model.LATEST)) and _read_latest(root) == new:
                where = f"LATEST names {new.name} but may not be durable"
            raise model.UnwritableRoot(f"root {root}: {exc.strerror} ({exc.filename or root}); {where}") from None
        if keep is not None:
            _prune(root, keep, new)
        model.hook("done")
        return new
    finally:
        os.close(lock)
