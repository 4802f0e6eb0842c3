"""A step still to do for one driver Job, tried on the pool until it is done.

The loop owns a task: it marks it busy, copies in what the step needs
from the state (`begin`), submits `step` to the pool, takes back what the
step found (`answered`), and settles it with the answer (`settle`): done,
abandoned after `max_attempts`, or due again after a jittered backoff
(never sooner than the backend's Retry-After). Each kind of task is a
subclass; which table holds it (`TABLE`) is part of its type, so the loop
never tells tables apart by identity.

A task is given only what its stage uses, in two parts, each a small frozen
dataclass of its stage (`report.IO` and `report.State`, `check.IO` and
`check.State`): `step` runs on the pool and gets the `IO`, the clients and
settings it reads and writes through, never the state; `begin`,
`answered`, `done` and `abandoned` run on the loop and get the `State`, the
parts of the loop's state the task may change.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from toolkit import backoff

IOT = TypeVar("IOT")
StateT = TypeVar("StateT")
# The loop's `submit(fn, callback, *args)`: `fn(*args)` runs on the pool, `callback(future)` on the loop with its
# answer. A stage that sends work to the pool is given this, not the loop.
Submit = Callable[..., None]
Callback = Callable[[concurrent.futures.Future[Any]], None]

RETRY_BASE, RETRY_CAP = 0.5, 60.0  # seconds: a task's backoff between attempts


def _backoff() -> backoff.Backoff:
    return backoff.Backoff(base=RETRY_BASE, cap=RETRY_CAP)


@dataclasses.dataclass(eq=False)
class Task(Generic[IOT, StateT]):
    name: str  # the driver Job's
    job_id: str
    due: float = 0.0
    busy: bool = False
    attempts: int = 0
    retry_after: float | None = None  # the backend's Retry-After on the last attempt
    backoff: backoff.Backoff = dataclasses.field(default_factory=_backoff, repr=False)

    TABLE: ClassVar[str] = ""  # "reports", "checks" or "reaps": the loop's table that holds it
    max_attempts: ClassVar[int | None] = None  # None: tried until done

    def begin(self, state: StateT) -> None:
        """On the loop, just before `step` goes to the pool: copy onto the task what it needs of the state."""

    def step(self, io: IOT) -> bool:
        """The I/O, on the pool: True when nothing is left to do. It has the clients and the settings,
        never the state."""
        raise NotImplementedError

    def answered(self, state: StateT) -> None:
        """On the loop, after every `step` (done or not): hand back to the state what the step found."""

    def done(self, state: StateT) -> None:
        """On the loop, once `step` answered True."""

    def abandoned(self, state: StateT) -> None:
        """On the loop, once the last of `max_attempts` failed."""

    def settle(self, ok: bool, *, now: float) -> bool:
        """Count the attempt; True when the task leaves its table (done or abandoned)."""
        self.busy = False
        self.attempts += 1
        if ok or (self.max_attempts is not None and self.attempts >= self.max_attempts):
            return True
        self.due = now + max(self.backoff.next_delay(), self.retry_after or 0.0)
        self.retry_after = None
        return False
