"""The claim stage: how many claims may be in flight, and what a claim's answer does.

Up to `max_claims` claims are in flight at once (one after a claim that
failed or found nothing, so a Retry-After or an empty queue is met by one
request, not a volley; one more after each that brought a run), each counted
against the cap before it is sent (`ledger.free() - claiming`), so the cap
holds whatever they answer. A claim is sent only while a worker is free: a
claim waiting in the pool's queue is latency, and a slow apiserver must not
pile claims up.

A claim's answer (on the loop) reserves the slot and submits the create,
also while stopping: the run is ours. The backend's claim is atomic, but a
run may still be offered twice at once (its lease ran out while its first
claim was being answered): an answer for a run whose create is in hand is
dropped, and one for a known Job only confirms its Secret.

`Claims` is given what it uses when it is made: the backend it claims from,
the ledger and the token record it changes, the loop's stop flag and
`submit`, and `create`, the hand-off of a reserved run to the create stage
(wired in `dispatcher.app`). What changes from turn to turn, the work in
hand, the loop passes on each call.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from dispatcher import backend, jobspec, ledger, logs
from dispatcher.stages import task
from toolkit import backoff

log = logging.getLogger("dispatcher")

# Claims in flight at once: a share of the workers, so claims never take every worker from the creates.
CLAIM_SHARE = 2


# The hand-off of a reserved run to the create stage: (claim, Job name, uid of its known Job or "", claimed at).
Create = Callable[[backend.Claim, str, str, float], None]


class Claims:
    def __init__(self, *, workers: int, poll_interval: float, backend: backend.Backend, ledger: ledger.Ledger,
                 tokens: dict[str, str], stopping: threading.Event, submit: task.Submit, create: Create) -> None:
        self.backend = backend
        self.ledger = ledger
        self.tokens = tokens  # the one record of each run's token: a claim's is recorded here
        self.stopping = stopping
        self.submit = submit
        self.create = create
        self.poll_interval = poll_interval  # the pause after a claim that found nothing
        self.workers = workers
        self.max_claims = max(1, workers // CLAIM_SHARE)
        self.in_flight = 0  # claims sent and not yet answered (each holds a slot)
        self.window = 1  # claims that may be in flight now
        self.next = 0.0  # monotonic time before which no claim is sent
        self.backoff = backoff.Backoff(base=0.2, cap=30.0)

    def may_claim(self, *, in_hand: int) -> bool:
        """Whether a claim may be sent now, with `in_hand` pieces of work on the pool (the loop asks only
        once its Jobs are listed)."""
        return (not self.stopping.is_set() and self.ledger.free() - self.in_flight > 0
                and in_hand < self.workers and self.in_flight < self.window)

    def tick(self, *, in_hand: int) -> None:
        while self.may_claim(in_hand=in_hand) and time.monotonic() >= self.next:
            self.in_flight += 1
            in_hand += 1
            self.submit(self.backend.claim, self.answered)

    def _pause(self, now: float, delay: float) -> None:
        self.next = max(self.next, now + delay)

    def answered(self, future: concurrent.futures.Future[Any]) -> None:
        self.in_flight -= 1
        now = time.monotonic()
        self.window = 1
        try:
            claim = future.result()
        except backend.BackendError as e:
            delay = max(self.backoff.next_delay(), e.retry_after or 0.0)
            log.warning("claim failed; retrying", extra=logs.fields(error=str(e), retry_in=round(delay, 2)))
            return self._pause(now, delay)
        except backend.BackendRefused as e:
            delay = max(5.0, self.backoff.next_delay())
            log.error("claim refused by the backend", extra=logs.fields(error=str(e), retry_in=round(delay, 2)))
            return self._pause(now, delay)
        except Exception as e:  # a bug in one claim must not stop the loop
            delay = max(1.0, self.backoff.next_delay())
            log.error("claim crashed", extra=logs.fields(error=repr(e), retry_in=round(delay, 2)))
            return self._pause(now, delay)
        if claim is None:
            return self._pause(now, self.poll_interval)
        self.backoff.reset()
        self.window = min(self.max_claims, self.in_flight + 2)
        name = jobspec.job_name(claim.job_id)
        entry = self.ledger.get(name)
        if entry is not None and entry.expired:
            # Its Job is being deleted (it never started, or never had its Secret): the claim goes
            # unused and the backend offers the run again after its lease, to a Job made afresh.
            log.info("claim offered again for a job being deleted; left for the backend to offer again",
                     extra=logs.fields(job=name, job_id=claim.job_id))
            return None
        if self.ledger.create_in_hand(name):
            # Offered twice at once (its lease ran out while the first claim was answered): the create
            # in hand serves both.
            log.info("claim offered again while its job is being created; left to that create",
                     extra=logs.fields(job=name, job_id=claim.job_id))
            return None
        fresh = self.ledger.reserve(name=name, job_id=claim.job_id, now=now)
        self.ledger.start_create(name)
        self.tokens[name] = claim.token
        self.create(claim, name, "" if fresh or entry is None else entry.uid, now)
        return None
