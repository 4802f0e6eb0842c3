"""The checkpoint fence: publish a checkpoint directory so that a late save
from a superseded execution can never overwrite a newer one (docs/checkpoint.md,
docs/checkpoint.md).

    from toolkit import checkpoint
    # ... the framework writes its files into staging/, then the marker last:
    open(os.path.join(staging, checkpoint.MARKER), "w").close()
    checkpoint.publish(staging, "/ckpt")          # epoch and attempt from the environment
    ...
    found = checkpoint.latest("/ckpt")            # None before the first publish
    if found: restore(found.path)

A checkpoint is a directory `ROOT/ckpt-<epoch, 19 digits>-<serial>-<attempt>`;
`ROOT/LATEST` holds the name of the current one on one line. `publish` takes
an exclusive flock on `ROOT/.lock`, refuses an epoch lower than the highest
one in ROOT (LATEST's, or any checkpoint directory's), renames the staging
directory in, and replaces LATEST atomically (temporary file, fsync, rename,
fsync of the directory). An equal epoch advances: it is the same execution
saving again (every rank of one execution has the same epoch), and the
later save is the newer one; the serial keeps the names apart and orders
them.

Exit status of `python -m toolkit.checkpoint` and `toolkit checkpoint`:
0 published (the path on stdout), 1 refused (a lower epoch), 2 bad input
(the epoch, the attempt, the staging directory, a root that cannot be
written or locked, a LATEST that is not ours). Every error is one line.

Standard library only, imported by nothing else in the toolkit: any training
image with a Python can copy this one file (tests/checkpoint/test_imports.py
holds it to that).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass

MARKER = "COMPLETE"
"""The file the caller writes last into the staging directory: it is complete only when MARKER exists."""
LATEST = "LATEST"
LOCK = ".lock"
PREFIX = "ckpt-"
ENV_EPOCH = "DISPATCH_EPOCH"
ENV_ATTEMPT = "DISPATCH_ATTEMPT"
MAX_EPOCH = 2**63 - 1
MAX_ATTEMPT_LEN = 200
"""Bytes. A file name holds at most 255; the rest of a checkpoint's name takes at most 42."""

TEST_HOOK_FD = "DISPATCH_CHECKPOINT_TEST_HOOK_FD"
"""Tests only: a socket fd; at each named step publish writes `<step>\\n` to it and waits for one byte."""
STEPS = ("staged", "locked", "fenced", "moved", "written", "replaced", "pruning", "done")
"""The points at which the test hook stops a publish. The commit point is between written and replaced."""

_EPOCH_RE = re.compile(r"[1-9][0-9]*", re.ASCII)
_ATTEMPT_RE = re.compile(r"[!-.0-~]+", re.ASCII)  # visible ASCII without '/'
_NAME_RE = re.compile(r"ckpt-([0-9]{19})-([0-9]{6,})-([!-.0-~]+)", re.ASCII)
_TMP_PREFIX = ".LATEST."
_TRASH_PREFIX = ".trash-"


class CheckpointError(Exception):
    """A publish or a read that did not happen; the message is one line. `exit_code` is the CLI's status."""

    exit_code = 2


class BadInput(CheckpointError, ValueError):
    """The epoch, the attempt, the keep count or the staging directory is not acceptable: exit 2."""


class UnwritableRoot(CheckpointError, OSError):
    """ROOT cannot be created, written or locked: exit 2. Nothing was published."""


class CorruptRoot(CheckpointError):
    """ROOT/LATEST is not a LATEST this module wrote, or names a checkpoint that is gone: exit 2."""


class StaleEpoch(CheckpointError):
    """The epoch is lower than one already in ROOT: refused, exit 1. Nothing in ROOT was touched."""

    exit_code = 1

    def __init__(self, epoch: int, fence: int, fence_name: str, root: str) -> None:
        self.epoch, self.fence, self.fence_name, self.root = epoch, fence, fence_name, root
        super().__init__(
            f"epoch {epoch} is lower than epoch {fence} ({fence_name}) in {root}: "
            "a superseded execution's save, refused; nothing published"
        )


@dataclass(frozen=True, order=False)
class Checkpoint:
    """A published checkpoint directory, `path` = ROOT/name."""

    path: str
    name: str
    epoch: int
    serial: int
    attempt: str

    @property
    def key(self) -> tuple[int, int]:
        """The order of checkpoints in a root: by epoch, then by publication."""
        return (self.epoch, self.serial)


# -- validation at the boundary -------------------------------------------


def parse_epoch(value: object, field: str = "epoch") -> int:
    """An epoch: canonical decimal (or int), 1 ..= 2^63-1; BadInput naming FIELD otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BadInput(f"{field} must be a decimal string or an int, found {type(value).__name__}")
    if isinstance(value, str):
        if not _EPOCH_RE.fullmatch(value):
            raise BadInput(f"{field} = {value!r} is not a canonical decimal (digits, no sign, no leading zero)")
        if len(value) > 19 or int(value) > MAX_EPOCH:
            raise BadInput(f"{field} = {value} does not fit a signed 64-bit integer (max {MAX_EPOCH})")
        return int(value)
    if value < 1:
        raise BadInput(f"{field} = {value} is below 1 (every admitted execution has epoch >= 1)")
    if value > MAX_EPOCH:
        raise BadInput(f"{field} = {value} does not fit a signed 64-bit integer (max {MAX_EPOCH})")
    return value


def parse_attempt(value: object, field: str = "attempt") -> str:
    """An attempt token, safe as part of a file name: 1 to 200 visible ASCII characters, no '/'."""
    if not isinstance(value, str):
        raise BadInput(f"{field} must be a string, found {type(value).__name__}")
    if not value:
        raise BadInput(f"{field} is empty")
    if len(value) > MAX_ATTEMPT_LEN:
        raise BadInput(f"{field} is {len(value)} characters long, above the bound {MAX_ATTEMPT_LEN} (it names a directory)")
    if not _ATTEMPT_RE.fullmatch(value):
        bad = next(c for c in value if not _ATTEMPT_RE.fullmatch(c))
        raise BadInput(
            f"{field} = {value!r} holds {bad!r}: only visible ASCII without '/' (no space, NUL or control character)"
        )
    return value


def parse_keep(value: object, field: str = "keep") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(f"{field} = {value!r} must be an int >= 1 (or None: keep every checkpoint)")
    return value


def execution(epoch: int | str | None = None, attempt: str | None = None, *,
              cli: bool = False) -> tuple[int, str]:
    """The (epoch, attempt) to publish under: the values given, else $DISPATCH_EPOCH and
    $DISPATCH_ATTEMPT; BadInput naming the field (the option's name when CLI) otherwise."""
    out: list[object] = []
    for value, env, param, check in ((epoch, ENV_EPOCH, "epoch", parse_epoch),
                                     (attempt, ENV_ATTEMPT, "attempt", parse_attempt)):
        given = f"--{param}" if cli else param
        if value is None:
            value = os.environ.get(env)
            if value is None:
                how = f"give {given}" if cli else f"pass {param}="
                raise BadInput(f"{env} is not set: run under the dispatch prologue, or {how}")
            out.append(check(value, env))
        else:
            out.append(check(value, given))
    return out[0], out[1]  # type: ignore[return-value]


def name_of(epoch: int, serial: int, attempt: str) -> str:
    return f"{PREFIX}{epoch:019d}-{serial:06d}-{attempt}"


def parse_name(root: str, name: str) -> Checkpoint | None:
    """The checkpoint a directory name stands for; None when NAME is not a checkpoint's name."""
    m = _NAME_RE.fullmatch(name)
    if m is None or int(m.group(1)) == 0 or int(m.group(1)) > MAX_EPOCH or len(m.group(3)) > MAX_ATTEMPT_LEN:
        return None
    return Checkpoint(os.path.join(root, name), name, int(m.group(1)), int(m.group(2)), m.group(3))


# -- reading a root -----------------------------------------------------


def _read_latest(root: str) -> Checkpoint | None:
    """LATEST's checkpoint (not checked to exist); None when there is no LATEST."""
    path = os.path.join(root, LATEST)
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise BadInput(f"root {root} is not a directory") from None
    except OSError as exc:
        raise CorruptRoot(f"{path}: cannot read: {exc.strerror}") from None
    text = data.decode("ascii", "replace")
    found = parse_name(root, text[:-1]) if text.endswith("\n") and text.count("\n") == 1 else None
    if found is None:
        raise CorruptRoot(f"{path} holds {text[:80]!r}, not one checkpoint name on one line: not written by this fence")
    return found


def checkpoints(root: str) -> list[Checkpoint]:
    """Every checkpoint directory in ROOT, oldest first (by epoch, then serial). [] when ROOT does not exist."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise BadInput(f"root {root} is not a directory") from None
    found = [c for c in map(lambda n: parse_name(root, n), names) if c is not None]
    return sorted((c for c in found if os.path.isdir(c.path) and not os.path.islink(c.path)), key=lambda c: c.key)


def latest(root: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint ROOT/LATEST names; None before the first publish (or when ROOT does not exist).

    Takes no lock: LATEST is only ever replaced by an atomic rename, so a
    reader sees the old name or the new one. CorruptRoot when LATEST is not
    one of ours or names a directory that is gone.
    """
    root = os.fspath(root)
    found = _read_latest(root)
    if found is not None and not os.path.isdir(found.path):
        raise CorruptRoot(f"{os.path.join(root, LATEST)} names {found.name}, which is not a directory in {root}")
    return found


# -- publishing ---------------------------------------------------------


def _hook(step: str) -> None:
    """Tests only (TEST_HOOK_FD): announce STEP and wait to be let go (or killed)."""
    fd = os.environ.get(TEST_HOOK_FD)
    if not fd:
        return
    os.write(int(fd), f"{step}\n".encode())
    os.read(int(fd), 1)


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
    try:
        st = os.lstat(staging)
    except OSError as exc:
        raise BadInput(f"staging {staging}: {exc.strerror}") from None
    if not os.path.isdir(staging) or os.path.islink(staging):
        raise BadInput(f"staging {staging} is not a directory")
    marker = os.path.join(staging, MARKER)
    if not os.path.isfile(marker) or os.path.islink(marker):
        raise BadInput(f"staging {staging} is not complete: the marker {MARKER} (written last) is missing; nothing published")
    real_staging, real_root = os.path.realpath(staging), os.path.realpath(root)
    if real_root == real_staging or real_root.startswith(real_staging.rstrip("/") + "/"):
        raise BadInput(f"root {root} is inside staging {staging}")
    if os.path.dirname(real_staging) == real_root and parse_name(root, os.path.basename(real_staging)):
        raise BadInput(f"staging {staging} is already a checkpoint of {root}")
    return st


def _make_root(root: str) -> None:
    try:
        if os.path.isdir(root):
            return
        parent = os.path.dirname(os.path.abspath(root))
        os.makedirs(root, exist_ok=True)
        _fsync_path(parent, directory=True)
    except OSError as exc:
        raise UnwritableRoot(f"root {root} cannot be created: {exc.strerror}; nothing published") from None


def _lock(root: str) -> int:
    import fcntl

    try:
        fd = os.open(os.path.join(root, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UnwritableRoot(f"root {root} is not writable: {LOCK}: {exc.strerror}; nothing published") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        os.close(fd)
        raise UnwritableRoot(
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
    _hook("written")
    os.replace(tmp, os.path.join(root, LATEST))  # the commit point
    _hook("replaced")
    _fsync_path(root, directory=True)


def _prune(root: str, keep: int, current: Checkpoint) -> list[Checkpoint]:
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
            _hook("pruning")
            shutil.rmtree(trash, ignore_errors=True)
        if removed:
            _fsync_path(root, directory=True)
    except OSError:
        pass
    return removed


def publish(
    staging_dir: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    epoch: int | str | None = None,
    attempt: str | None = None,
    keep: int | None = None,
) -> Checkpoint:
    """Publish the complete checkpoint in STAGING_DIR into ROOT, fenced by EPOCH.

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
    epoch_value, attempt_value = execution(epoch, attempt)
    keep = parse_keep(keep)
    if not root:
        raise BadInput("root is empty")
    _check_staging(staging, root)
    try:
        _fsync_tree(staging)
    except OSError as exc:
        raise BadInput(f"staging {staging} cannot be synced: {exc.strerror}; nothing published") from None
    _make_root(root)
    _hook("staged")
    lock = _lock(root)
    try:
        _hook("locked")
        current = _read_latest(root)
        known = checkpoints(root) + ([current] if current else [])
        fence = max(known, key=lambda c: c.key, default=None)
        if fence is not None and epoch_value < fence.epoch:
            raise StaleEpoch(epoch_value, fence.epoch, fence.name, root)
        _hook("fenced")
        serial = 1 + max((c.serial for c in known), default=0)
        name = name_of(epoch_value, serial, attempt_value)
        new = Checkpoint(os.path.join(root, name), name, epoch_value, serial, attempt_value)
        where = "nothing published"
        try:
            _remove_leftovers(root)
            if os.path.lexists(new.path):  # rename(2) would replace an empty directory there
                raise CorruptRoot(f"{new.path} exists already: not placed by this fence")
            try:
                os.rename(staging, new.path)
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise BadInput(f"staging {staging} is on another filesystem (or mount) than root {root}: "
                                   "it must be renamed, not copied; nothing published") from None
                raise
            where = f"the checkpoint is in {new.path}, LATEST not advanced"
            _fsync_path(root, directory=True)
            parent = os.path.dirname(os.path.abspath(staging))
            if not os.path.samefile(parent, root):
                _fsync_path(parent, directory=True)  # the staging dir's entry is gone for good too
            _hook("moved")
            _write_latest(root, new.name)
        except OSError as exc:
            if os.path.exists(os.path.join(root, LATEST)) and _read_latest(root) == new:
                where = f"LATEST names {new.name} but may not be durable"
            raise UnwritableRoot(f"root {root}: {exc.strerror} ({exc.filename or root}); {where}") from None
        if keep is not None:
            _prune(root, keep, new)
        _hook("done")
        return new
    finally:
        os.close(lock)


# -- python -m toolkit.checkpoint ------------------------------------------


def main(argv: Sequence[str] | None = None, prog: str = "python -m toolkit.checkpoint") -> int:
    """The standard-library CLI (images without click): same commands, exit codes and lines as `toolkit checkpoint`."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            print(f"{self.prog}: {message} (see '{self.prog} --help')", file=sys.stderr)
            sys.exit(2)

    parser = Parser(prog=prog, description="Publish checkpoints fenced by DISPATCH_EPOCH; read the latest.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("publish", help="publish STAGING into ROOT")
    p.add_argument("staging")
    p.add_argument("root")
    p.add_argument("--keep", type=int, default=None, metavar="K", help="keep the newest K checkpoints")
    p.add_argument("--epoch", default=None, help=f"default ${ENV_EPOCH}")
    p.add_argument("--attempt", default=None, help=f"default ${ENV_ATTEMPT}")
    q = sub.add_parser("latest", help="print the path of ROOT's latest checkpoint (nothing if none)")
    q.add_argument("root")
    args = parser.parse_args(argv)
    where = f"{prog} {args.command}"
    try:
        if args.command == "publish":
            epoch, attempt = execution(args.epoch, args.attempt, cli=True)
            parse_keep(args.keep, "--keep")
            found = publish(args.staging, args.root, epoch=epoch, attempt=attempt, keep=args.keep)
        else:
            found = latest(args.root)
    except CheckpointError as exc:
        print(f"{where}: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    if found is not None:
        print(found.path)
    return 0


def one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
