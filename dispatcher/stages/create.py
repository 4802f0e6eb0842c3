"""The create stage: a claimed run's driver Job, then its Secret, and what the result does.

`create` runs on the pool. It creates the Job (unless it is known: a claim
offered again), then the Secret that holds the run's token, owned by the
Job (the Secret needs the Job's uid, so a run's two creates stay in order;
different runs' creates overlap on the pool). AlreadyExists means already
dispatched: the Job's name is a function of the run id, so a second Job for
one run is impossible. Transient failures are retried for
`CREATE_RETRY_SECONDS` (an apiserver with no answer at all: until it is
back); a refusal of the object itself is final.

`created` runs on the loop with the `Created` result: the ledger learns the
Job exists (its slot stays taken), or the reservation is released; a refused
run is reported failed (`report.Refused`), and a run given up is left for
the backend to offer again (its Job, if it was made, is checked for its
Secret). `create` has its `IO` (the Kubernetes client, the settings, the
stop flag); `created` its `State` (the ledger, the token record, the report
and check tables).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import logging
import threading
import time
from typing import Any

from dispatcher import backend, jobspec, ledger, logs, settings
from dispatcher.stages import check, report
from toolkit import backoff, kube, paths

log = logging.getLogger("dispatcher")

CREATE_RETRY_SECONDS = 60.0


class Outcome(enum.Enum):
    CREATED = "created"  # this create made the Job
    EXISTS = "exists"  # the run's Job was there already (a claim offered again); its Secret now serves it
    REFUSED = "refused"  # the apiserver refused the object: final
    GAVE_UP = "gave-up"  # no success within the retry window (or stopping while the apiserver is away)


@dataclasses.dataclass(frozen=True)
class Created:
    outcome: Outcome
    name: str
    claim: backend.Claim = dataclasses.field(repr=False)
    uid: str = ""
    latency: float = 0.0  # claim -> Job created, seconds
    why: str = ""  # the last error, unless it worked


@dataclasses.dataclass(frozen=True)
class IO:
    """What a create uses, on the pool."""

    kube: kube.Client
    config: settings.Settings  # the namespace, the Job and its Secret (jobspec)
    stopping: threading.Event  # set: an apiserver away is no longer waited for


@dataclasses.dataclass(frozen=True)
class State:
    """What a create's result changes, on the loop."""

    ledger: ledger.Ledger
    tokens: dict[str, str]  # the one record of each run's token
    reports: dict[str, report.Report]  # a run refused for good is reported (`report.Refused`)
    checks: dict[str, check.SecretCheck]  # a Job whose create was given up is checked for its Secret


class Retry(Exception):
    """A create step to try again after a pause (within the create's deadline)."""


def _job(io: IO, claim: backend.Claim, name: str) -> tuple[str, Outcome]:
    """The Job: its uid, and whether this create made it. Raises on any failure."""
    ns = io.config.namespace
    try:
        made = io.kube.create(paths.JOB, jobspec.job(claim, io.config), namespace=ns)
        return made["metadata"]["uid"], Outcome.CREATED
    except kube.ApiError as e:
        if e.status != 409:
            raise
    existing = io.kube.get(paths.JOB, name=name, namespace=ns)
    if jobspec.job_id_of(existing) != claim.job_id:
        raise kube.Conflict(409, "AlreadyExists", f"Job {name} exists for another run") from None
    return existing["metadata"]["uid"], Outcome.EXISTS


def _secret(io: IO, claim: backend.Claim, name: str, uid: str) -> None:
    """The Job's token Secret, owned by the Job. Raises on any failure; Retry while an old one is in the way."""
    ns = io.config.namespace
    try:
        io.kube.create(paths.SECRET, jobspec.secret(claim, io.config, job_uid=uid), namespace=ns)
    except kube.ApiError as e:
        if e.status != 409:
            raise
        try:
            serves = jobspec.serves(io.kube.get(paths.SECRET, name=name, namespace=ns), uid)
        except kube.NotFound:
            raise Retry("the Secret went while it was read: writing it again") from None
        if not serves:
            # An earlier Job of this run left its Secret (or its tombstone) for the garbage
            # collector: taking it would leave this Job without a token once it is collected.
            raise Retry("the Secret of an earlier Job of this run is still there") from None


def create(io: IO, claim: backend.Claim, name: str, uid: str, claimed_at: float) -> Created:
    """The Job (unless `uid` is known: a claim offered again) and its Secret, with retries (on the pool)."""
    pause = backoff.Backoff(base=0.2, cap=5.0)
    deadline = time.monotonic() + CREATE_RETRY_SECONDS
    outcome = Outcome.EXISTS if uid else Outcome.CREATED  # a known Job is not dispatched again
    while True:
        try:
            if not uid:
                uid, outcome = _job(io, claim, name)
            latency = time.monotonic() - claimed_at
            _secret(io, claim, name, uid)
            return Created(outcome, name, claim, uid=uid, latency=latency)
        except Retry as e:
            why = str(e)
        except kube.Unavailable as e:
            # No answer at all: keep the slot and keep trying until the apiserver is back.
            why = str(e)
            deadline = time.monotonic() + CREATE_RETRY_SECONDS
            if io.stopping.is_set():
                return Created(Outcome.GAVE_UP, name, claim, uid=uid, why=why)
        except kube.ApiError as e:
            # 401/403 are retried too: an apiserver that just started answers 403 until its RBAC
            # cache has synced. Only a refusal of the object itself (400, 404, 409 for another
            # run, 422) is final.
            if e.status < 500 and e.status not in (401, 403, 429):
                return Created(Outcome.REFUSED, name, claim, uid=uid, why=str(e))
            why = str(e)
        if time.monotonic() > deadline:
            return Created(Outcome.GAVE_UP, name, claim, uid=uid, why=why)
        time.sleep(pause.next_delay())


def created(state: State, future: concurrent.futures.Future[Any]) -> bool:
    """A create's result, on the loop; True when this create made the Job (one more dispatched)."""
    result: Created = future.result()
    now = time.monotonic()
    name, job_id = result.name, result.claim.job_id
    fields = {"job": name, "job_id": job_id}
    state.ledger.end_create(name)
    if result.outcome in (Outcome.CREATED, Outcome.EXISTS):
        state.ledger.created(name, uid=result.uid, now=now)
        state.ledger.secret_confirmed(name)
        log.info("dispatched" if result.outcome is Outcome.CREATED else "already dispatched",
                 extra=logs.fields(**fields, latency_ms=round(result.latency * 1000, 1),
                                   unfinished=state.ledger.unfinished()))
        return result.outcome is Outcome.CREATED
    state.ledger.abandon(name)
    if result.outcome is Outcome.REFUSED:
        # The run will never get a Job: say so, so it is not lost.
        log.error("driver job refused; reporting the run failed", extra=logs.fields(**fields, error=result.why))
        state.reports[name] = report.Refused.of(name, job_id, result.why)
    else:
        # Transient for a minute: the backend offers the run again after its claim lease.
        log.warning("driver job not created; the backend will offer the run again",
                    extra=logs.fields(**fields, error=result.why))
        state.tokens.pop(name, None)
        check.found(name, ledger=state.ledger, checks=state.checks)  # the Job may exist without its Secret
    return False
