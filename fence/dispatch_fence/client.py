"""What an object-store client gives the fence: the interface between the
protocol (dispatch_fence.objectstore) and the clients that each speak to one
kind of store (dispatch_fence.s3, dispatch_fence.gcs).

It sits below both, so a client never imports the protocol and the protocol
imports a client only for a root of its scheme: the clients' errors that the
protocol acts on (Exists, Conflict), what one LIST returns (Listing), the
methods a store has (Store), and the one-line error every other failure
becomes (`failure`). Standard library only; imports the model and
dispatch_fence.transfer (the settings a store uploads with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dispatch_fence import model, transfer


class Exists(Exception):
    """A create-only write found the object there (S3 412 on If-None-Match: *, GCS 412 on generation 0),
    and it was not this write's own first request, retried (transfer.Attempts)."""


class Conflict(Exception):
    """A compare-and-set found another version (S3 412 on If-Match, GCS 412 on ifGenerationMatch)."""


@dataclass(frozen=True)
class Listing:
    """One LIST of a root: the names directly under it (sub-prefixes) and LATEST's version (None: no LATEST)."""

    names: list[str]
    latest: str | None


class Store(Protocol):
    """What the protocol needs of a store; keys are relative to the root. Failures other than
    Exists and Conflict raise model.UnwritableRoot (one line, naming the URL: `failure`)."""

    url: str
    stale_version: str
    """A version no object has (the probe's compare-and-set must be refused on it)."""
    settings: transfer.Settings
    """When a file goes up in parts, how large they are, and how many streams at once."""

    def list_root(self) -> Listing: ...
    def list_keys(self, prefix: str) -> list[str]:
        """Every key under PREFIX/ (every key under the root when PREFIX is empty)."""
    def read(self, key: str) -> bytes | None: ...
    def read_range(self, key: str, start: int, length: int) -> bytes | None:
        """LENGTH bytes of KEY from START, one ranged GET (None: no such object)."""
    def exists(self, key: str) -> bool: ...
    def create(self, key: str, source: str | bytes, *, gate: transfer.Gate | None = None) -> None:
        """Create-only, SOURCE a local path or the bytes; in parts above the threshold; from any thread.
        With GATE: nothing becomes visible before it opens (transfer.Cancelled when it closes)."""
    def replace(self, key: str, data: bytes, *, version: str | None) -> None: ...
    def delete(self, key: str) -> None: ...
    def close(self) -> None:
        """End the store's threads (a later call starts them again)."""


def failure(url: str, *, what: str, key: str, exc: Exception) -> model.UnwritableRoot:
    """A client's error as the fence reports it: one line naming the root's URL, the request and the key."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return model.UnwritableRoot(f"{url}: {what} {key}: {type(exc).__name__}: {first[:300]}")
