"""The tests' polling loop: devcluster's (devcluster/polling.py), failing with an AssertionError
naming what was awaited and for how long. The suites' own `wait` helpers are this with their
defaults (how long a step of theirs may take, how often to look)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from devcluster import polling

T = TypeVar("T")


def until(what: str, predicate: Callable[[], T | None], *, timeout: float, interval: float = 0.1) -> T:
    return polling.until(what, predicate, timeout=timeout, interval=interval, error=AssertionError)
