"""The one polling loop of the local cluster, its demo and its tests: the first truthy value of a
predicate, or ERROR naming what was awaited and for how long. Callers differ only in what they
raise (a harness error, a test's assertion, a demo step's failure) and how often they look."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: str, predicate: Callable[[], T | None], *, timeout: float, interval: float = 0.2,
          error: Callable[[str], BaseException] = TimeoutError) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
