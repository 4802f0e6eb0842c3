"""The one polling loop the tests wait with: the first truthy value of a predicate, or an
AssertionError naming what was awaited and for how long. The suites' own `wait` helpers are this
with their defaults (how long a step of theirs may take, how often to look)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: str, predicate: Callable[[], T | None], *, timeout: float, interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
