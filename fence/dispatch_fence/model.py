"""The fence's model, the bottom layer: what a checkpoint is called, what the
rule compares, and the errors every kind of root raises (docs/checkpoint.md).

A checkpoint is named `ckpt-<epoch, 19 digits>-<serial>-<attempt>` in its root,
and `LATEST` names the current one on one line; `check_fence` is the one
comparison both kinds of root make (an epoch lower than the highest in the
root is refused, an equal one advances). Input is validated here, at the
boundary, each error one line naming the field.

This module does no I/O on a root and imports nothing of the fence: the POSIX
root (dispatch_fence.posix) and the object-store root
(dispatch_fence.objectstore) are built on it, beside each other. Standard
library only. `hook` is the one deliberate exception to "no I/O": the test
seam both kinds of root stop at, kept here so that neither owns it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

MARKER = "COMPLETE"
"""The file the caller writes last into the staging directory: it is complete only when MARKER exists."""
LATEST = "LATEST"
PREFIX = "ckpt-"
ENV_EPOCH = "DISPATCH_EPOCH"
ENV_ATTEMPT = "DISPATCH_ATTEMPT"
MAX_EPOCH = 2**63 - 1
MAX_ATTEMPT_LEN = 200
"""Bytes. A file name holds at most 255; the rest of a checkpoint's name takes at most 42."""

TEST_HOOK_FD = "DISPATCH_CHECKPOINT_TEST_HOOK_FD"
"""Tests only: a socket fd; at each named step publish writes `<step>\\n` to it and waits for one byte."""

_EPOCH_RE = re.compile(r"[1-9][0-9]*", re.ASCII)
_ATTEMPT_RE = re.compile(r"[!-.0-~]+", re.ASCII)  # visible ASCII without '/'
_NAME_RE = re.compile(r"ckpt-([0-9]{19})-([0-9]{6,})-([!-.0-~]+)", re.ASCII)


class CheckpointError(Exception):
    """A publish or a read that did not happen; the message is one line. `exit_code` is the CLI's status."""

    exit_code = 2


class BadInput(CheckpointError, ValueError):
    """The epoch, the attempt, the keep count or the staging directory is not acceptable: exit 2."""


class UnwritableRoot(CheckpointError, OSError):
    """ROOT cannot be created, written or locked: exit 2. Nothing was published."""


class CorruptRoot(CheckpointError):
    """ROOT/LATEST is not a LATEST this fence wrote, or names a checkpoint that is gone: exit 2."""


class StaleEpoch(CheckpointError):
    """The epoch is lower than one already in ROOT: refused, exit 1. Nothing in ROOT was touched."""

    exit_code = 1

    def __init__(self, epoch: int, fence: int, fence_name: str, root: str) -> None:
        self.epoch, self.fence, self.fence_name, self.root = epoch, fence, fence_name, root
        super().__init__(
            f"epoch {epoch} is lower than epoch {fence} ({fence_name}) in {root}: "
            "a superseded execution's save, refused; nothing published"
        )

    def __reduce__(self) -> tuple[type[StaleEpoch], tuple[int, int, str, str]]:
        # Picklable, so that one process can raise what another was refused (dispatch_fence.dcp).
        return (StaleEpoch, (self.epoch, self.fence, self.fence_name, self.root))


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


# -- names and the rule -----------------------------------------------------


def name_of(epoch: int, serial: int, attempt: str) -> str:
    return f"{PREFIX}{epoch:019d}-{serial:06d}-{attempt}"


def parse_name(root: str, name: str) -> Checkpoint | None:
    """The checkpoint a directory name stands for; None when NAME is not a checkpoint's name."""
    m = _NAME_RE.fullmatch(name)
    if m is None or int(m.group(1)) == 0 or int(m.group(1)) > MAX_EPOCH or len(m.group(3)) > MAX_ATTEMPT_LEN:
        return None
    return Checkpoint(os.path.join(root, name), name, int(m.group(1)), int(m.group(2)), m.group(3))


def check_fence(epoch: int, known: Iterable[Checkpoint], *, root: str) -> None:
    """The fence, the one comparison both kinds of root make: StaleEpoch when EPOCH is lower
    than the highest epoch among KNOWN (every checkpoint in the root, and the one LATEST
    names). Equal epochs pass: the same execution saving again."""
    fence = max(known, key=lambda c: c.key, default=None)
    if fence is not None and epoch < fence.epoch:
        raise StaleEpoch(epoch, fence.epoch, fence.name, root)


def is_url(root: str) -> bool:
    """ROOT names an object-store location (s3://bucket/prefix, gs://bucket/prefix), not a directory."""
    return "://" in root


# -- the test seam ------------------------------------------------------------


_hook_lock = threading.Lock()


def hook(step: str) -> None:
    """Tests only (TEST_HOOK_FD): announce STEP and wait to be let go (or killed); one thread at a
    time (uploads run on several)."""
    fd = os.environ.get(TEST_HOOK_FD)
    if not fd:
        return
    with _hook_lock:
        os.write(int(fd), f"{step}\n".encode())
        os.read(int(fd), 1)


def check_staging(staging: str) -> os.stat_result:
    """STAGING's own stat, once it is a complete staging directory: a real directory (no link)
    holding the marker, written last, as a real file. Every root publishes only such a one."""
    try:
        st = os.lstat(staging)
    except OSError as exc:
        raise BadInput(f"staging {staging}: {exc.strerror}") from None
    if not os.path.isdir(staging) or os.path.islink(staging):
        raise BadInput(f"staging {staging} is not a directory")
    marker = os.path.join(staging, MARKER)
    if not os.path.isfile(marker) or os.path.islink(marker):
        raise BadInput(f"staging {staging} is not complete: the marker {MARKER} (written last) "
                       "is missing; nothing published")
    return st
