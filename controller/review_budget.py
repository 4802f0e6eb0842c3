"""What /metrics may spend on TokenReviews (`controller.metrics_server`): a cache of decisions that
random tokens cannot flush, and a budget of reviews for tokens it has no decision for.

`Decisions` keeps a decision (an HTTP status) per digest of a token, for `seconds`, in two
segments of at most `size` each, the least recently used dropped first:

- *authenticated*: the decisions for tokens the apiserver authenticated (200 or 403). Only a real
  credential lands here, so a flood of made-up tokens cannot push the scraper's decision out. An
  entry outlives its decision: a token whose decision expired is still *known*, and is reviewed
  again outside the budget.
- *unauthenticated*: 401s. Made-up tokens churn this segment only.

`Bucket` is the budget: `per_minute` reviews a minute, at most a sixth of it (ten seconds' worth)
at once. A review of a token that is not known takes one; with none left, the request is answered
429 without a review. So whatever a caller sends, the apiserver sees at most a sixth of the rate
plus the rate over the time, from made-up tokens.

Pure logic: the standard library only, a clock given in, no I/O. Thread-safe.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

AUTHENTICATED = frozenset({200, 403})
BURST_SECONDS = 10.0  # the bucket holds this many seconds' worth of its rate


class Decisions:
    def __init__(self, *, size: int, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1 or seconds <= 0:
            raise ValueError(f"size={size}, seconds={seconds}: expected size >= 1 and seconds > 0")
        self.size = size
        self.seconds = seconds
        self.clock = clock
        self._lock = threading.Lock()
        # digest -> (expiry, decision), least recently used first
        self._authenticated: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()
        self._unauthenticated: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    def get(self, key: str) -> tuple[int | None, bool]:
        """(the decision for KEY while it holds, else None; whether KEY is a known token)."""
        now = self.clock()
        with self._lock:
            for segment, known in ((self._authenticated, True), (self._unauthenticated, False)):
                entry = segment.get(key)
                if entry is not None:
                    segment.move_to_end(key)
                    return (entry[1] if entry[0] > now else None), known
        return None, False

    def put(self, key: str, decision: int) -> None:
        now = self.clock()
        with self._lock:
            self._authenticated.pop(key, None)
            self._unauthenticated.pop(key, None)
            segment = self._authenticated if decision in AUTHENTICATED else self._unauthenticated
            segment[key] = (now + self.seconds, decision)
            while len(segment) > self.size:
                segment.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._authenticated) + len(self._unauthenticated)


class Bucket:
    """A token bucket: `per_minute` a minute, at most `per_minute * BURST_SECONDS / 60` (one at
    least) at once; it starts full."""

    def __init__(self, *, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute={per_minute}: expected at least 1")
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * BURST_SECONDS)
        self.clock = clock
        self._lock = threading.Lock()
        self._level = self.capacity
        self._at = clock()

    def take(self) -> bool:
        """One from the bucket if there is one."""
        with self._lock:
            now = self.clock()
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
            if self._level < 1.0:
                return False
            self._level -= 1.0
            return True
