"""The foreign flag's cause list (docs/adapter.md), as pure rules.

The flag is the TrainJob annotation `dispatch.phpboyscout.uk/foreign`: one
cause per line, the first causes first, because those are the ones a person
must read. Annotations are bounded (256 KiB for all of an object's together,
and the history shares them), so the list is bounded too, and the bound must
not break it:

- Whole lines only. A cause that does not fit is dropped, never cut; the
  value is never longer than `LIMIT` bytes (UTF-8, as the apiserver counts
  them), nor than the room our other annotations leave it
  (`toolkit.history.BUDGET`: all of ours together).
- Dropped causes are counted, each once. The annotation
  `dispatch.phpboyscout.uk/foreign-dropped` holds `<count> <digest>...`: the
  count, then a short digest of each dropped cause, so a cause seen again
  (every rank's pod, every periodic report) is recognised and neither
  counted again nor announced again. At most `DIGESTS` digests are kept;
  past them nothing more is written or announced (the count then reads "at
  least"), so the Events stay bounded whatever the job's size.
- Each cause is announced (a Warning Event) exactly when `add` returns a new
  list: once.
- A cause is one line: newlines and runs of whitespace fold to one space.
- The list has a `fingerprint`: what a person reviewed, as `toolkit status`
  prints it. `toolkit adopt` takes it back and is refused when the list has
  changed since (a cause kept or dropped), so an adoption clears only causes
  a person has seen.

No I/O: `toolkit.adapter.flag_foreign` reads, calls `add`, and writes the
result in one preconditioned update.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from toolkit import names

DROPPED_ANNOTATION = f"{names.DOMAIN}/foreign-dropped"
# Bytes (UTF-8) of kept causes (the foreign annotation's value), newlines included.
LIMIT = 8192
# Dropped causes remembered by digest (13 characters each in the annotation).
DIGESTS = 256
# The most the dropped annotation's value holds: a count (it grows only with a digest) and the digests.
DROPPED_MOST = len(str(DIGESTS)) + 13 * DIGESTS
# The most the flag's two annotations take together, keys included: what the history leaves them.
MOST = len(names.FOREIGN_ANNOTATION) + LIMIT + len(DROPPED_ANNOTATION) + DROPPED_MOST

_COUNT = re.compile(r"0|[1-9][0-9]{0,8}")
_DIGEST = re.compile(r"[0-9a-f]{12}")


@dataclasses.dataclass(frozen=True)
class Causes:
    kept: list[str]
    dropped: int = 0
    digests: tuple[str, ...] = ()


def fold(cause: str) -> str:
    """One line: whitespace runs (newlines included) become one space."""
    return " ".join(cause.split())


def digest(cause: str) -> str:
    return hashlib.sha256(cause.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def encoded(text: str) -> int:
    """Bytes of `text` as the apiserver counts an annotation (UTF-8; a lone surrogate, which it
    reads as U+FFFD, as three)."""
    return len(text.encode("utf-8", "surrogatepass"))


def fingerprint(causes: Causes) -> str:
    """What a person reviewed, in 12 hex digits: sha256 over the kept cause lines and the
    dropped annotation as written (its count and digests), so a cause added either way changes it."""
    foreign, dropped = render(causes)
    text = foreign + "\n\n" + (dropped or "")
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def size(causes: Causes) -> int:
    """Bytes of the flag's annotations as `render` writes them, keys included."""
    foreign, dropped = render(causes)
    total = len(names.FOREIGN_ANNOTATION) + encoded(foreign) if foreign else 0
    return total + (len(DROPPED_ANNOTATION) + encoded(dropped) if dropped is not None else 0)


def parse(foreign: str | None, dropped: str | None) -> Causes:
    """The list as the two annotations hold it; a malformed count reads as
    none dropped (a later drop rewrites it)."""
    kept = [line for line in (foreign or "").split("\n") if line]
    count, digests = 0, ()
    parts = (dropped or "").split()
    if parts and _COUNT.fullmatch(parts[0]):
        count = int(parts[0])
        digests = tuple(d for d in parts[1:] if _DIGEST.fullmatch(d))
    return Causes(kept, count, digests)


def render(causes: Causes) -> tuple[str, str | None]:
    """The two annotation values (the second None when nothing was dropped)."""
    dropped = None
    if causes.dropped or causes.digests:
        dropped = " ".join([str(causes.dropped), *causes.digests])
    return "\n".join(causes.kept), dropped


def add(causes: Causes, cause: str, *, limit: int = LIMIT) -> Causes | None:
    """The list with `cause` added, or None when it is already known (kept
    or counted as dropped), or cannot be remembered: write nothing, announce
    nothing."""
    line = fold(cause)
    if not line or line in causes.kept:
        return None
    value, _ = render(causes)
    grown = encoded(value) + (1 if value else 0) + encoded(line)
    if grown <= limit:
        return dataclasses.replace(causes, kept=[*causes.kept, line])
    mark = digest(line)
    if mark in causes.digests or len(causes.digests) >= DIGESTS:
        return None
    return dataclasses.replace(causes, dropped=causes.dropped + 1, digests=(*causes.digests, mark))
