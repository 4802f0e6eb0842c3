"""A step still to do for one driver Job, tried on the pool until it is done.

The loop owns a task: it marks it busy, copies in what the step needs
from the state (`begin`), submits `step` to the pool, takes back what the
step found (`answered`), and settles it with the answer (`settle`): done,
abandoned after `max_attempts`, or due again after a jittered backoff
(never sooner than the backend's Retry-After). `begin`, `answered`, `done`
and `abandoned` run on the loop, where the state may change; `step` reads
and writes only its own task's fields. Each kind of task is a subclass; which table holds it
(`TABLE`) is part of its type, so the loop never tells tables apart by
identity.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from toolkit import backoff

if TYPE_CHECKING:
    from dispatcher.app import Dispatcher

RETRY_BASE, RETRY_CAP = 0.5, 60.0  # seconds: a task's backoff between attempts


def _backoff() -> backoff.Backoff:
    return backoff.Backoff(base=RETRY_BASE, cap=RETRY_CAP)


@dataclasses.dataclass(eq=False)
class Task:
    name: str  # the driver Job's
    job_id: str
    due: float = 0.0
    busy: bool = False
    attempts: int = 0
    retry_after: float | None = None  # the backend's Retry-After on the last attempt
    backoff: backoff.Backoff = dataclasses.field(default_factory=_backoff, repr=False)

    TABLE: ClassVar[str] = ""  # "reports", "checks" or "reaps": the loop's table that holds it
    max_attempts: ClassVar[int | None] = None  # None: tried until done

    def begin(self, d: Dispatcher) -> None:
        """On the loop, just before `step` goes to the pool: copy onto the task what it needs of the state."""

    def step(self, d: Dispatcher) -> bool:
        """The I/O, on the pool: True when nothing is left to do. It reads the settings and the clients
        of `d`, never its state."""
        raise NotImplementedError

    def answered(self, d: Dispatcher) -> None:
        """On the loop, after every `step` (done or not): hand back to the state what the step found."""

    def done(self, d: Dispatcher) -> None:
        """On the loop, once `step` answered True."""

    def abandoned(self, d: Dispatcher) -> None:
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
