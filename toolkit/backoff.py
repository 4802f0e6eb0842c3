"""Exponential backoff with jitter, and the Retry-After header: one copy for
the controller, the dispatcher, the sidecar and the toolkit's client.

The schedule: the n-th wait in a row has the ceiling min(cap, base x 2^(n-1))
and is drawn from its upper half, [ceiling/2, ceiling], so there is always
some wait and a fleet of clients retrying the same failure (every pod of a
job got the same 429 at the same moment) spreads out instead of coming back
in the same instant. A server's Retry-After is a floor, itself jittered
upwards by up to half, the whole capped by `retry_cap` (default: `cap`).

The jitter is a `fraction` in [0, 1) passed in, so the schedule is a pure
function a test can pin; `Backoff` holds the count and draws the fraction
from its own RNG.

Standard library only, and no I/O: the sidecar imports this.
"""

from __future__ import annotations

import math
import time

MYPY = False
if MYPY:  # for type checkers only: the sidecar never loads random (~0.5 MB), only Backoff needs it
    import random


def delay(attempt: int, *, base: float, cap: float, fraction: float, retry_after: float | None = None,
          retry_cap: float | None = None) -> float:
    """Seconds to wait before retry number `attempt` (1 for the first)."""
    ceiling = min(cap, base * 2 ** min(max(attempt, 1) - 1, 60))
    wait = ceiling / 2 + fraction * ceiling / 2
    if retry_after is not None:
        most = cap if retry_cap is None else retry_cap
        wait = max(wait, min(retry_after + fraction * retry_after / 2, most))
    return wait


class Backoff:
    """The retries in a row so far; `next_delay` counts one more, `reset` after a success.
    (A plain class, not a dataclass: see paths.Resource.)"""

    def __init__(self, base: float = 0.2, cap: float = 30.0, attempt: int = 0, rng: random.Random | None = None,
                 retry_cap: float | None = None) -> None:
        self.base, self.cap, self.attempt, self.retry_cap = base, cap, attempt, retry_cap
        if rng is None:
            import random  # here, deliberately: see the import block

            rng = random.Random()
        self.rng = rng

    def next_delay(self, *, retry_after: float | None = None) -> float:
        """The delay before the next retry; grows with each call up to `cap`."""
        self.attempt += 1
        return delay(self.attempt, base=self.base, cap=self.cap, fraction=self.rng.random(),
                     retry_after=retry_after, retry_cap=self.retry_cap)

    def reset(self) -> None:
        self.attempt = 0


def retry_after(value: str | None, *, limit: float, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP
    date, RFC 9110 10.2.3), at most `limit` (a wrong header must not stall a
    client for a day); None when absent or unreadable. A date in the past is 0."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)
    else:
        # Imported here, deliberately: the email package costs the sidecar ~3.5 MB of
        # RSS in every pod, and an HTTP date in Retry-After is rare (the apiserver sends seconds).
        import email.utils

        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(limit, max(0.0, seconds))
