"""How files go up to an object store: the settings (when a file goes up in
parts, how large a part is, how many streams at once), the parts of a file, the
pool that runs uploads with a bounded number of streams and bounded memory, the
gate that holds a checkpoint's files back until its name is claimed, and the
judgment of a create the client retried (docs/checkpoint.md, "Large files,
streams and retries").

The invariant it keeps: at most `streams` bodies are in memory at once, each at
most max(part size, threshold) bytes (a part, or a file at or below the
threshold); a coordinator of a multipart upload holds none. A body is read from
its file only once a stream is free, so a file of any size costs at most one
part per stream. The claim's parts go before those of the files that wait for
it, so that it lands early and they complete as their parts end.

The judgment: a create-only write whose first request's response was lost and
which the client sent again may be answered "exists" (412) by its own first
request. Only then, and only for a write the client really retried, is the
object compared with what the write meant to put there (the size, then a hash
computed now); equal, the write landed and counts as done. A create that was
not retried and finds the object is someone else's.

Standard library only; imports only the model. The clients (dispatch_fence.s3,
dispatch_fence.gcs) and the protocol (dispatch_fence.objectstore) use it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dispatch_fence import model

MiB = 1024 * 1024
ENV_THRESHOLD = "DISPATCH_CHECKPOINT_PART_THRESHOLD"
ENV_PART_SIZE = "DISPATCH_CHECKPOINT_PART_SIZE"
ENV_STREAMS = "DISPATCH_CHECKPOINT_STREAMS"
DEFAULT_THRESHOLD = 64 * MiB
DEFAULT_PART_SIZE = 64 * MiB
DEFAULT_STREAMS = 8
MIN_PART_SIZE = 5 * MiB
"""S3's smallest part (but the last)."""
PART_ALIGN = 256 * 1024
"""A GCS resumable upload's chunk is a multiple of 256 KiB."""
MAX_PARTS = 10_000
"""S3's most parts in one upload: a larger file gets larger parts."""
MAX_STREAMS = 64

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Settings:
    """A file above `threshold` bytes goes up in parts of `part_size` (S3 multipart, GCS resumable);
    `streams` uploads run at once, across files and parts."""

    threshold: int = DEFAULT_THRESHOLD
    part_size: int = DEFAULT_PART_SIZE
    streams: int = DEFAULT_STREAMS

    @property
    def memory(self) -> int:
        """The most bytes of bodies in memory at once."""
        return self.streams * max(self.part_size, self.threshold)


def _int(name: str, default: int, *, low: int, high: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or (raw != "0" and raw.startswith("0")):
        raise model.BadInput(f"{name} = {raw!r} is not a canonical decimal")
    value = int(raw)
    if value < low or (high is not None and value > high):
        raise model.BadInput(f"{name} = {value} is outside {low} ..= {high if high is not None else 'any'}")
    return value


def settings() -> Settings:
    """The settings from the environment (named defaults otherwise); BadInput naming the variable."""
    part = _int(ENV_PART_SIZE, DEFAULT_PART_SIZE, low=MIN_PART_SIZE, high=5 * 1024 * MiB)
    if part % PART_ALIGN:
        raise model.BadInput(f"{ENV_PART_SIZE} = {part} is not a multiple of {PART_ALIGN} (256 KiB)")
    return Settings(threshold=_int(ENV_THRESHOLD, DEFAULT_THRESHOLD, low=0),
                    part_size=part, streams=_int(ENV_STREAMS, DEFAULT_STREAMS, low=1, high=MAX_STREAMS))


def parts(size: int, part_size: int) -> list[tuple[int, int, int]]:
    """(number from 1, offset, length) of each part of a file of SIZE bytes: parts of PART_SIZE,
    larger (aligned) when that would make more than MAX_PARTS, the last one shorter."""
    if size > part_size * MAX_PARTS:
        per = -(-size // MAX_PARTS)
        part_size = -(-per // PART_ALIGN) * PART_ALIGN
    count = max(1, -(-size // part_size))
    return [(i + 1, i * part_size, min(part_size, size - i * part_size)) for i in range(count)]


def read_part(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise model.BadInput(f"{path} changed while it was uploaded (read {len(data)} of {length} bytes "
                             f"at {offset}); nothing published")
    return data


def size_of(source: str | bytes) -> int:
    return len(source) if isinstance(source, bytes) else os.stat(source).st_size


class Pool:
    """The streams of one store: `streams` part threads and a budget of bodies in memory, shared by
    every upload of the process (files go up from the protocol's threads, parts from these). Parts
    are served in order of arrival, but an upload marked `first` (the claim, which the others wait
    for) goes before the rest."""

    def __init__(self, config: Settings) -> None:
        self.settings = config
        self._bodies = threading.BoundedSemaphore(config.streams)
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], None]]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def body(self) -> threading.BoundedSemaphore:
        """Held while a body is read and sent (`with pool.body(): ...`)."""
        return self._bodies

    def _serve(self) -> None:
        while True:
            _, _, job = self._queue.get()
            if job is _STOP:
                return
            job()

    def map_parts(self, fn: Callable[[T], R], items: Sequence[T], *, first: bool = False) -> list[R]:
        """FN over ITEMS on the part threads, each call holding a body; the results in order. On the
        first failure the parts not started are cancelled, the running ones waited for, and it is
        raised."""
        with self._lock:
            while len(self._threads) < self.settings.streams:
                self._threads.append(threading.Thread(target=self._serve, name="fence-part", daemon=True))
                self._threads[-1].start()
        futures: list[concurrent.futures.Future[R]] = []
        for item in items:
            future: concurrent.futures.Future[R] = concurrent.futures.Future()

            def job(item: T = item, future: concurrent.futures.Future[R] = future) -> None:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    with self._bodies:
                        result = fn(item)
                except BaseException as exc:  # handed to the caller
                    future.set_exception(exc)
                else:
                    future.set_result(result)

            futures.append(future)
            self._queue.put((0 if first else 1, next(self._order), job))
        return settle(futures)

    def close(self) -> None:
        """End the part threads (a later upload starts them again)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put((2, next(self._order), _STOP))
        for t in threads:
            t.join()


def _stop() -> None:
    """The job that ends a part thread."""


_STOP = _stop


def settle(futures: Sequence[concurrent.futures.Future[R]]) -> list[R]:
    """The results of FUTURES in order; on the first failure the ones not started are cancelled, the
    running ones waited for, and the first failure (in FUTURES' order) raised."""
    concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
    if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures):
        for f in futures:
            f.cancel()
    concurrent.futures.wait(futures)
    for f in futures:
        if not f.cancelled() and f.exception() is not None:
            raise f.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def run_all(pool: concurrent.futures.Executor, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """FN over ITEMS on POOL, as `settle` gives the results."""
    return settle([pool.submit(fn, item) for item in items])


def each_file(streams: int, fn: Callable[[T], None], items: Sequence[T]) -> None:
    """FN over ITEMS (files), STREAMS at once, on threads of this call; as run_all."""
    if len(items) <= 1:
        for item in items:
            fn(item)
        return
    with concurrent.futures.ThreadPoolExecutor(min(streams, len(items)), thread_name_prefix="fence-file") as pool:
        run_all(pool, fn, items)


class Cancelled(Exception):
    """An upload whose gate closed: aborted before its object became visible."""


class Gate:
    """Held by uploads that may send everything but what makes their object visible (the completion
    of a multipart upload, a one-request PUT) until the claim of their checkpoint's name is decided:
    `open(True)` lets them finish, `open(False)` makes them abort (Cancelled)."""

    def __init__(self) -> None:
        self._decided = threading.Event()
        self._go = False

    def open(self, go: bool) -> None:
        self._go = go
        self._decided.set()

    @property
    def closed(self) -> bool:
        """The claim was decided, and lost: an upload stops sending parts."""
        return self._decided.is_set() and not self._go

    def wait(self) -> None:
        """Return once the claim landed; Cancelled when it did not."""
        self._decided.wait()
        if not self._go:
            raise Cancelled("the checkpoint's name was not claimed")


def behind(fn: Callable[[], None]) -> concurrent.futures.Future[None]:
    """FN on a thread of its own, started now (the uploads that go up while the claim does)."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fence-behind")
    try:
        return pool.submit(fn)
    finally:
        pool.shutdown(wait=False)


# -- the judgment of a retried create -------------------------------------------


def chunks(source: str | bytes, size: int = 8 * MiB) -> Iterator[bytes]:
    if isinstance(source, bytes):
        yield source
        return
    with open(source, "rb") as f:
        while block := f.read(size):
            yield block


def digest(blocks: Iterable[bytes], name: str = "sha256") -> bytes:
    h = hashlib.new(name)
    for block in blocks:
        h.update(block)
    return h.digest()


def multipart_etag(source: str | bytes, part_size: int) -> str:
    """S3's ETag of an object uploaded in the parts `parts` makes: the MD5 of the parts' MD5s, '-N'."""
    size = size_of(source)
    md5s = b""
    for _, offset, length in parts(size, part_size):
        data = source[offset:offset + length] if isinstance(source, bytes) else read_part(source, offset, length)
        md5s += hashlib.md5(data, usedforsecurity=False).digest()
    return f"{hashlib.md5(md5s, usedforsecurity=False).hexdigest()}-{len(parts(size, part_size))}"


class Attempts:
    """Counts the attempts of one request as the client reports them: `retried` once it sent the
    request again (google-cloud-storage's on_error, obstore's "after N retries", our own loop)."""

    def __init__(self) -> None:
        self.retries = 0

    def again(self, _exc: object = None) -> None:
        self.retries += 1

    @property
    def retried(self) -> bool:
        return self.retries > 0
