"""Exponential backoff with jitter (pure; the RNG is passed in for tests).

Used for the backend (claim errors, report retries) and the Kubernetes API
(watch reconnects, reap retries). Each delay is uniform between half the
ceiling and the ceiling, so there is always some wait, and the jitter spreads a fleet of retries so a
recovering server is not hit by all of them in the same instant.
"""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass
class Backoff:
    base: float = 0.2
    cap: float = 30.0
    attempt: int = 0
    rng: random.Random = dataclasses.field(default_factory=random.Random)

    def next_delay(self) -> float:
        """The delay before the next retry; grows with each call up to `cap`."""
        ceiling = min(self.cap, self.base * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0
