"""The dispatcher's main loop: the stages wired together, the flow drawn once.

        backend                          Kubernetes
   POST /jobs/next ──claim──▶ ledger.reserve ──▶ jobspec ──▶ create Job, then its Secret
        ▲                        │  (only while ledger.unfinished() < MAX_INFLIGHT)
        │                        ▼
   POST /jobs/{id}/status ◀─ reporter ◀── ledger.observe ◀── watcher (list+watch Jobs)
                                 │                 (Failed, or deleted unfinished)
                                 └────────▶ reaper (sandbox pods: job-id AND managed-by)
   finished Jobs reap themselves: ttlSecondsAfterFinished
   a driver pod waiting to start past the start deadline (starts.stuck, checked on a tick over
   the Pending driver pods once a Job is that old): reporter ("stuck", the kubelet's reason),
   then delete its Job
   a Job found without its Secret (its creator died between the two creates; checked once per Job
   not created here): a tombstone Secret (no token key: its container can never start), then
   delete the Job, unreported; the backend offers the still-claimed run again

One thread owns the state (this loop); the watcher thread and the worker
pool only put results on `self.inbox`. Every I/O step (claim, create, report,
reap) runs on the pool so a slow apiserver or backend never stalls the
bookkeeping.

Pipelining: up to `max_claims` claims are in flight at once (one after a
claim that failed or found nothing, one more after each that brought a run),
each counted
against the cap before it is sent (`ledger.free() - claiming`), so the cap
holds whatever they answer. A claim's answer comes back here, where the slot
is reserved and the create submitted; the creates of different runs overlap
on the pool (a run's own Job and Secret stay in order: the Secret needs the
Job's uid). The backend's claim is atomic, but a run may still be offered
twice at once (its lease ran out while its first claim was being answered):
an answer for a run whose create is in hand is dropped, and one for a known
Job only confirms its Secret; the Job's name, a function of the run id, makes
a second Job impossible anyway (AlreadyExists). Reaps that are due go out
together (`reaper.reap_many`: one label-scoped, paged list per batch).
SIGTERM stops claiming; the loop waits for the work in hand, then returns 0.
`run(max_ticks=...)` bounds the loop for tests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
import time
from typing import Any

from dispatcher import backend, jobspec, kube, ledger, logs, names, reaper, reporter, settings, starts, watcher
from toolkit import backoff

log = logging.getLogger("dispatcher")

CREATE_RETRY_SECONDS = 60.0
# Claims in flight at once: a share of the workers, so claims never take every worker from the creates.
CLAIM_SHARE = 2
# A reap waits this long for others to go out with it (one list for the batch); its pods are already
# dead (their driver failed or its Job is gone), and they hold nothing a run is waiting for.
REAP_GATHER_SECONDS = 0.5
MAX_REPORT_ATTEMPTS = 30
# How often the Pending driver pods are checked against the start deadline: a quarter of it,
# within these bounds (one filtered pod list per check).
START_CHECK_MIN, START_CHECK_MAX = 0.5, 30.0
# The pod list is skipped while every unfinished Job is younger than the deadline less this margin
# (the Job's creationTimestamp is the apiserver's clock, compared with this host's).
CLOCK_SKEW_MARGIN = 60.0


@dataclasses.dataclass
class Pending:
    """A report or a reap still to do for one Job."""

    kind: str  # "failed", "vanished", "stuck" (never started; its Job is deleted), "refused",
    # "unchecked" (a Job's Secret to check) or "orphan" (a Job that can never have its token: deleted)
    name: str
    job_id: str
    job: dict[str, Any] | None
    due: float = 0.0
    busy: bool = False
    attempts: int = 0
    body: dict[str, Any] | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    job_deleted: bool = False
    retry_after: float | None = None  # the backend's Retry-After on the last attempt
    outcome: str = ""  # of a Secret check: "ok" or "tombstoned"
    uid: str = ""  # of the Job a Secret check or an orphan's delete is about
    backoff: backoff.Backoff = dataclasses.field(default_factory=lambda: backoff.Backoff(base=0.5, cap=60.0))


class Retry(Exception):
    """A create step to try again after a pause (within the create's deadline)."""


class Dispatcher:
    def __init__(self, config: settings.Settings, *, client: kube.Kube, api: backend.Backend) -> None:
        self.config = config
        self.kube = client
        self.backend = api
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.stopping = threading.Event()
        self.watch_stop = threading.Event()
        self.ledger = ledger.Ledger(max_inflight=config.max_inflight)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="work")
        self.tokens: dict[str, str] = {}
        self.reports: dict[str, Pending] = {}
        self.reaps: dict[str, Pending] = {}
        self.checks: dict[str, Pending] = {}
        self.creating: set[str] = set()  # Job names whose create is in hand here
        self.in_hand = 0
        self.claiming = 0  # claims sent and not yet answered (each holds a slot)
        self.max_claims = max(1, config.workers // CLAIM_SHARE)
        # Claims that may be in flight now: one after a claim that failed or found nothing (so a
        # Retry-After or an empty queue is met by one request, not a volley), one more after each
        # that brought a run, up to max_claims.
        self.claim_window = 1
        self.synced = False
        self.next_claim = 0.0
        self.claim_backoff = backoff.Backoff(base=0.2, cap=30.0)
        self.dispatched = 0
        self.next_start_check = 0.0
        self.start_check_busy = False
        self.start_check_every = min(START_CHECK_MAX, max(START_CHECK_MIN, config.driver_start_deadline / 4))
        self.watcher = watcher.Watcher(client, namespace=config.namespace, selector=jobspec.selector(),
                                       out=self.inbox, stop=self.watch_stop)

    # -- the loop -----------------------------------------------------------

    def stop(self) -> None:
        self.stopping.set()
        self.inbox.put(("wake",))

    def run(self, *, max_ticks: int | None = None) -> int:
        self.watcher.start()
        log.info("started", extra=logs.fields(namespace=self.config.namespace, max_inflight=self.config.max_inflight,
                                              sandbox_namespace=self.config.sandbox_namespace))
        ticks = 0
        try:
            while max_ticks is None or ticks < max_ticks:
                ticks += 1
                self._drain(timeout=self._wait())
                if self.stopping.is_set():
                    if self.in_hand == 0:
                        break
                    continue
                if self.synced:
                    self._claim()
                    self._check_starts()
                self._start_due(self.reports, self._report)
                self._start_reaps()
                self._start_due(self.checks, self._check_secret)
        finally:
            self.watch_stop.set()
            self.pool.shutdown(wait=True)
            log.info("stopped", extra=logs.fields(unfinished=self.ledger.unfinished(), dispatched=self.dispatched,
                                                  api_requests=self.kube.requests,
                                                  backend_requests=self.backend.requests))
        return 0

    def _wait(self) -> float:
        now = time.monotonic()
        dues = [p.due for p in (*self.reports.values(), *self.reaps.values(), *self.checks.values()) if not p.busy]
        # A claim is due only when one may be sent (see _may_claim); counting it while every worker is
        # busy would make this wait 0 and the loop spin until a worker comes back.
        if self._may_claim():
            dues.append(self.next_claim)
        if self.synced and not self.start_check_busy and self.ledger.unfinished() > 0:
            dues.append(self.next_start_check)
        return min([1.0, *(max(0.0, d - now) for d in dues)])

    def _drain(self, *, timeout: float) -> None:
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: tuple[Any, ...]) -> None:
        now = time.monotonic()
        kind = item[0]
        if kind == "sync":
            _, items, started = item
            changes = self.ledger.sync(items, list_started=started, now=now)
            if not self.synced:
                log.info("in-flight set rebuilt", extra=logs.fields(jobs=len(items), unfinished=self.ledger.unfinished()))
            self.synced = True
            for job in items:
                self._check_found(str((job.get("metadata") or {}).get("name")))
        elif kind == "event":
            _, event_type, obj = item
            changes = self.ledger.observe(event_type, obj, now=now)
            name = str((obj.get("metadata") or {}).get("name"))
            entry = self.ledger.get(name)
            finished = event_type == "DELETED" or (entry is not None and entry.phase is ledger.Phase.COMPLETE)
            if finished and not changes and name not in self.reports:
                self.tokens.pop(name, None)  # a vanished run keeps its token until it is reported
            self._check_found(name)
        elif kind == "done":
            _, callback, future = item
            self.in_hand -= 1
            callback(future)
            return
        else:
            return
        for change in changes:
            log.info("driver job ended without finishing" if change.kind == "vanished" else "driver job failed",
                     extra=logs.fields(job=change.name, job_id=change.job_id, unfinished=self.ledger.unfinished()))
            self.reports.setdefault(change.name, Pending(change.kind, change.name, change.job_id, change.job))
            self.reaps.setdefault(change.name, Pending(change.kind, change.name, change.job_id, change.job,
                                                       due=now + REAP_GATHER_SECONDS))

    def _submit(self, fn: Any, callback: Any, *args: Any) -> None:
        self.in_hand += 1
        future = self.pool.submit(fn, *args)
        future.add_done_callback(lambda f: self.inbox.put(("done", callback, f)))

    # -- claim and create ---------------------------------------------------

    def _may_claim(self) -> bool:
        # A free slot not already held by a claim in flight, a free worker (a claim waiting in a queue
        # is latency, and a slow apiserver must not pile up claims), and room in the claim pipeline.
        return (self.synced and not self.stopping.is_set() and self.ledger.free() - self.claiming > 0
                and self.in_hand < self.config.workers and self.claiming < self.claim_window)

    def _claim(self) -> None:
        while self._may_claim() and time.monotonic() >= self.next_claim:
            self.claiming += 1
            self._submit(self.backend.claim, self._claimed)

    def _claimed(self, future: concurrent.futures.Future[Any]) -> None:
        """A claim's answer: reserve the slot and submit the create (also while stopping: the run is ours)."""
        self.claiming -= 1
        now = time.monotonic()
        self.claim_window = 1
        try:
            claim = future.result()
        except backend.BackendError as e:
            delay = max(self.claim_backoff.next_delay(), e.retry_after or 0.0)
            log.warning("claim failed; retrying", extra=logs.fields(error=str(e), retry_in=round(delay, 2)))
            self.next_claim = max(self.next_claim, now + delay)
            return
        except backend.BackendRefused as e:
            delay = max(5.0, self.claim_backoff.next_delay())
            log.error("claim refused by the backend", extra=logs.fields(error=str(e), retry_in=round(delay, 2)))
            self.next_claim = max(self.next_claim, now + delay)
            return
        except Exception as e:  # a bug in one claim must not stop the loop
            delay = max(1.0, self.claim_backoff.next_delay())
            log.error("claim crashed", extra=logs.fields(error=repr(e), retry_in=round(delay, 2)))
            self.next_claim = max(self.next_claim, now + delay)
            return
        if claim is None:
            self.next_claim = max(self.next_claim, now + self.config.poll_interval)
            return
        self.claim_backoff.reset()
        self.claim_window = min(self.max_claims, self.claiming + 2)
        name = jobspec.job_name(claim.job_id)
        entry = self.ledger.get(name)
        if entry is not None and entry.expired:
            # Its Job is being deleted (it never started, or never had its Secret): the claim goes
            # unused and the backend offers the run again after its lease, to a Job made afresh.
            log.info("claim offered again for a job being deleted; left for the backend to offer again",
                     extra=logs.fields(job=name, job_id=claim.job_id))
            return
        if name in self.creating:
            # Offered twice at once (its lease ran out while the first claim was answered): the create
            # in hand serves both.
            log.info("claim offered again while its job is being created; left to that create",
                     extra=logs.fields(job=name, job_id=claim.job_id))
            return
        fresh = self.ledger.reserve(name=name, job_id=claim.job_id, now=now)
        self.tokens[name] = claim.token
        uid = "" if fresh or entry is None else entry.uid
        self.creating.add(name)
        self._submit(self._create, self._created, claim, name, uid, now)

    def _create(self, claim: backend.Claim, name: str, uid: str, claimed_at: float) -> tuple[Any, ...]:
        """Create the Job (unless known) and its Secret; AlreadyExists means already dispatched."""
        ns = self.config.namespace
        pause = backoff.Backoff(base=0.2, cap=5.0)
        deadline = time.monotonic() + CREATE_RETRY_SECONDS
        state = "created" if not uid else "exists"  # a known Job (a claim offered again) is not dispatched again
        while True:
            try:
                if not uid:
                    try:
                        uid = self.kube.create_job(ns, jobspec.job(claim, self.config))["metadata"]["uid"]
                    except kube.ApiError as e:
                        if e.status != 409:
                            raise
                        existing = self.kube.get_job(ns, name)
                        if jobspec.job_id_of(existing) != claim.job_id:
                            raise kube.ApiError(409, f"Job {name} exists for another run") from None
                        uid, state = existing["metadata"]["uid"], "exists"
                latency = time.monotonic() - claimed_at
                try:
                    self.kube.create_secret(ns, jobspec.secret(claim, self.config, job_uid=uid))
                except kube.ApiError as e:
                    if e.status != 409:
                        raise
                    try:
                        serves = jobspec.serves(self.kube.get_secret(ns, name), uid)
                    except kube.ApiError as gone:
                        if gone.status != 404:
                            raise
                        raise Retry("the Secret went while it was read: writing it again") from None
                    if not serves:
                        # An earlier Job of this run left its Secret (or its tombstone) for the garbage
                        # collector: taking it would leave this Job without a token once it is collected.
                        raise Retry("the Secret of an earlier Job of this run is still there") from None
                return state, uid, latency, "", name, claim
            except Retry as e:
                why = str(e)
            except kube.ApiError as e:
                # 401/403 are retried too: an apiserver that just started answers 403 until its RBAC
                # cache has synced. Only a refusal of the object itself (400, 404, 409 for another
                # run, 422) is final.
                if e.status < 500 and e.status not in (401, 403, 429):
                    return "refused", uid, 0.0, str(e), name, claim
                why = str(e)
            except kube.Unavailable as e:
                # No answer at all: keep the slot and keep trying until the apiserver is back.
                why = str(e)
                deadline = time.monotonic() + CREATE_RETRY_SECONDS
                if self.stopping.is_set():
                    return "gave-up", uid, 0.0, why, name, claim
            if time.monotonic() > deadline:
                return "gave-up", uid, 0.0, why, name, claim
            time.sleep(pause.next_delay())

    def _created(self, future: concurrent.futures.Future[Any]) -> None:
        state, uid, latency, why, name, claim = future.result()
        now = time.monotonic()
        self.creating.discard(name)
        fields = {"job": name, "job_id": claim.job_id}
        if state in ("created", "exists"):
            self.ledger.created(name, uid=uid, now=now)
            self.ledger.secret_confirmed(name)
            if state == "created":
                self.dispatched += 1
            log.info("dispatched" if state == "created" else "already dispatched",
                     extra=logs.fields(**fields, latency_ms=round(latency * 1000, 1),
                                       unfinished=self.ledger.unfinished()))
            return
        self.ledger.abandon(name)
        if state == "refused":
            # The run will never get a Job: say so, so it is not lost.
            log.error("driver job refused; reporting the run failed", extra=logs.fields(**fields, error=why))
            body = {"status": "failed", "error": {"source": "dispatcher", "reason": "DispatchFailed",
                                                  "message": f"the driver Job could not be created: {why}"}}
            pending = Pending("refused", name, claim.job_id, None, body=body)
            self.reports[name] = pending
        else:
            # Transient for a minute: the backend offers the run again after its claim lease.
            log.warning("driver job not created; the backend will offer the run again",
                        extra=logs.fields(**fields, error=why))
            self.tokens.pop(name, None)
            self._check_found(name)  # the Job may exist without its Secret

    # -- Jobs without their Secret --------------------------------------------

    def _check_found(self, name: str) -> None:
        """Check once the Secret of an unfinished Job no create here has seen to."""
        if name in self.creating or name in self.checks or not self.ledger.unchecked(name):
            return
        entry = self.ledger.get(name)
        assert entry is not None
        self.checks[name] = Pending("unchecked", name, entry.job_id, None, uid=entry.uid)

    def _check_secret(self, pending: Pending) -> bool:
        """Does the Job's Secret serve it? If there is none, write a tombstone: the Job can never have
        its token (only the claim had it), and with the tombstone in place its container can never
        start, so deleting the Job cannot kill a driver that ran."""
        ns, fields, uid = self.config.namespace, {"job": pending.name, "job_id": pending.job_id}, pending.uid
        try:
            try:
                found: dict[str, Any] | None = self.kube.get_secret(ns, pending.name)
            except kube.ApiError as e:
                if e.status != 404:
                    raise
                found = None
            if found is None:
                try:
                    self.kube.create_secret(ns, jobspec.tombstone(pending.job_id, self.config, job_uid=uid))
                except kube.ApiError as e:
                    if e.status != 409:
                        raise
                    return False  # written meanwhile (by the create of a claim offered again): look again
                pending.outcome = "tombstoned"
                return True
            if jobspec.serves(found, uid):
                pending.outcome = "ok"
                return True
            if not jobspec.has_token(found):
                pending.outcome = "tombstoned"  # written by an earlier check that did not get to the delete
                return True
            return False  # an earlier Job's Secret, about to be collected: look again after it
        except (kube.ApiError, kube.Unavailable) as e:
            log.warning("cannot check the job's token Secret; retrying", extra=logs.fields(**fields, error=str(e)))
            return False

    def _checked(self, pending: Pending) -> None:
        entry = self.ledger.get(pending.name)
        if entry is None or entry.uid != pending.uid:
            return  # that Job is gone; another of the same name is judged on its own
        if pending.outcome == "ok":
            self.ledger.secret_confirmed(pending.name)
        elif pending.outcome == "tombstoned" and self.ledger.expire(pending.name):
            log.warning("driver job found without its token Secret (its creator stopped between the two "
                        "creates); deleting it, unreported: the backend will offer the run again",
                        extra=logs.fields(job=pending.name, job_id=pending.job_id))
            self.reports[pending.name] = Pending("orphan", pending.name, pending.job_id, None, uid=pending.uid)

    # -- the start deadline -------------------------------------------------

    def _check_starts(self) -> None:
        now = time.monotonic()
        if self.start_check_busy or now < self.next_start_check or self.ledger.unfinished() == 0:
            return
        if self.ledger.oldest_age(now=now, wall=time.time()) < self.config.driver_start_deadline - CLOCK_SKEW_MARGIN:
            self.next_start_check = now + self.start_check_every  # no pod can be late yet: no list
            return
        self.start_check_busy = True
        self._submit(self._stuck_pods, self._stuck_found)

    def _stuck_pods(self) -> list[tuple[str, starts.Stuck]]:
        """(Job name, why) of each driver pod waiting to start past the deadline (a paginated list)."""
        pods = self.kube.iter_pods(self.config.namespace, selector=jobspec.selector(),
                                   field_selector="status.phase=Pending")
        now = time.time()
        found = []
        for pod in pods:
            late = starts.stuck(pod, now=now, deadline=self.config.driver_start_deadline)
            job_name = ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOB_NAME_LABEL)
            if late is not None and job_name:
                found.append((str(job_name), late))
        return found

    def _stuck_found(self, future: concurrent.futures.Future[Any]) -> None:
        self.start_check_busy = False
        self.next_start_check = time.monotonic() + self.start_check_every
        try:
            found = future.result()
        except Exception as e:  # an API error, or a bug: neither may stop the loop
            log.warning("start deadline check failed; retrying next tick", extra=logs.fields(error=str(e)))
            return
        for name, late in found:
            entry = self.ledger.get(name)
            if entry is None or not self.ledger.expire(name):
                continue
            log.warning("driver did not start within the start deadline; reporting and deleting its job",
                        extra=logs.fields(job=name, job_id=entry.job_id, pod=late.pod, reason=late.reason,
                                          waited_s=round(late.waited, 1),
                                          deadline_s=self.config.driver_start_deadline))
            pending = Pending("stuck", name, entry.job_id, None, token=self.tokens.get(name))
            self.reports[name] = pending

    # -- reports and reaps --------------------------------------------------

    def _start_due(self, table: dict[str, Pending], fn: Any) -> None:
        now = time.monotonic()
        for pending in list(table.values()):
            if pending.busy or pending.due > now or self.stopping.is_set():
                continue
            pending.busy = True
            self._submit(fn, lambda f, p=pending, t=table: self._after(f, p, t), pending)

    def _start_reaps(self) -> None:
        """The reaps that are due, `reaper.BATCH` to a task (one list per namespace for all of them)."""
        now = time.monotonic()
        if self.stopping.is_set():
            return
        idle = [p for p in self.reaps.values() if not p.busy]
        if not any(p.due <= now for p in idle):
            return
        # The first one due takes along every other queued within the gather window (not a retry waiting
        # out its backoff): one list for all of them.
        due = [p for p in idle if p.due <= now + REAP_GATHER_SECONDS]
        for i in range(0, len(due), reaper.BATCH):
            batch = due[i:i + reaper.BATCH]
            for pending in batch:
                pending.busy = True
            self._submit(self._reap, lambda f, b=batch: self._reaped(f, b), batch)

    def _reaped(self, future: concurrent.futures.Future[Any], batch: list[Pending]) -> None:
        try:
            done = bool(future.result())
        except Exception as e:  # a bug in one reap must not stop the loop
            log.error("reap step crashed", extra=logs.fields(jobs=[p.name for p in batch], error=repr(e)))
            done = False
        for pending in batch:
            self._settle(pending, self.reaps, done=done)

    def _after(self, future: concurrent.futures.Future[Any], pending: Pending, table: dict[str, Pending]) -> None:
        try:
            done = future.result()
        except Exception as e:  # a bug in one report must not stop the loop
            log.error("report/reap step crashed", extra=logs.fields(job=pending.name, error=repr(e)))
            done = False
        self._settle(pending, table, done=bool(done))

    def _settle(self, pending: Pending, table: dict[str, Pending], *, done: bool) -> None:
        pending.busy = False
        pending.attempts += 1
        if done and table is self.checks:
            self._checked(pending)
        abandoned = not done and table is self.reports and pending.attempts >= MAX_REPORT_ATTEMPTS
        if abandoned:
            log.error("death report abandoned: the backend never took it",
                      extra=logs.fields(job=pending.name, job_id=pending.job_id, attempts=pending.attempts,
                                        kind=pending.kind))
            if pending.kind in ("stuck", "orphan") and not pending.job_deleted:
                self.ledger.unexpire(pending.name)  # the next start check tries the delete again
        if done or abandoned:
            table.pop(pending.name, None)
            if pending.name not in self.reports and self.ledger.get(pending.name) is None:
                self.tokens.pop(pending.name, None)
            return
        pending.due = time.monotonic() + max(pending.backoff.next_delay(), pending.retry_after or 0.0)
        pending.retry_after = None

    def _token(self, pending: Pending) -> str | None:
        token = pending.token or self.tokens.get(pending.name)
        if token:
            return token
        try:
            return reporter.token_from_secret(self.kube.get_secret(self.config.namespace, pending.name))
        except kube.ApiError as e:
            if e.status == 404:
                return None
            raise

    def _report(self, pending: Pending) -> bool:
        fields = {"job": pending.name, "job_id": pending.job_id}
        if pending.kind == "orphan":  # nothing to report: its driver never ran
            try:
                self.kube.delete_job(self.config.namespace, pending.name, uid=pending.uid)
            except (kube.ApiError, kube.Unavailable) as e:
                if not (isinstance(e, kube.ApiError) and e.status == 409):  # 409: that Job is gone already
                    log.warning("cannot delete a driver job without its token; retrying",
                                extra=logs.fields(**fields, error=str(e)))
                    return False
            pending.job_deleted = True
            return True
        try:
            token = self._token(pending)
        except (kube.ApiError, kube.Unavailable) as e:
            log.warning("cannot read the job token yet", extra=logs.fields(**fields, error=str(e)))
            return False
        pending.token = token
        if pending.body is None and (token is not None or pending.kind == "stuck"):
            pending.body = reporter.gather(self.kube, namespace=self.config.namespace, kind=pending.kind,
                                           job_name=pending.name, job=pending.job,
                                           tail_lines=self.config.log_tail_lines,
                                           start_deadline=self.config.driver_start_deadline)
        if pending.kind == "stuck" and not pending.job_deleted:
            # The token and the report's detail are read first: the Secret and the pod go with the Job.
            try:
                self.kube.delete_job(self.config.namespace, pending.name)
            except (kube.ApiError, kube.Unavailable) as e:
                log.warning("cannot delete the job of a driver that never started; retrying",
                            extra=logs.fields(**fields, error=str(e)))
                return False
            pending.job_deleted = True
        if token is None:
            log.error("no token for the run (its Secret is gone): death not reported", extra=logs.fields(**fields))
            return True
        assert pending.body is not None
        answer = self.backend.report(job_id=pending.job_id, token=token, body=pending.body)
        outcome = answer.outcome
        error = pending.body.get("error") or {}
        extra = logs.fields(**fields, outcome=outcome.value, http_status=answer.status, reason=error.get("reason"),
                            exit_code=error.get("exit_code"), attempt=pending.attempts + 1)
        if outcome is backend.Outcome.RETRY:
            pending.retry_after = answer.retry_after
            log.warning("death report not delivered; retrying", extra=extra)
            return False
        if outcome is backend.Outcome.REFUSED:
            log.error("death report refused by the backend", extra=extra)
        elif outcome is backend.Outcome.UNKNOWN:
            log.warning("death report given up: the backend does not know the run", extra=extra)
        else:
            log.info("death reported" if outcome is backend.Outcome.ACCEPTED else "death report not needed",
                     extra=extra)
        return True

    def _reap(self, batch: list[Pending]) -> bool:
        runs = {p.job_id: p.name for p in batch if p.kind != "refused"}  # a refused run never had a Job
        if not runs:
            return True
        namespaces = tuple(dict.fromkeys((self.config.namespace, self.config.sandbox_namespace)))
        try:
            deleted = reaper.reap_many(self.kube, namespaces=namespaces, runs=runs)
        except (kube.ApiError, kube.Unavailable) as e:
            log.warning("sandbox reap failed; retrying next tick",
                        extra=logs.fields(jobs=sorted(runs.values()), error=str(e)))
            return False
        for job_id, pods in deleted.items():
            if pods:
                log.info("sandbox pods reaped", extra=logs.fields(job=runs[job_id], job_id=job_id, pods=pods))
        return True


def main(environ: dict[str, str] | None = None) -> int:
    try:
        config = settings.from_env(os.environ if environ is None else environ)
    except settings.SettingsError as e:
        print(f"dispatcher: {e}", file=sys.stderr)
        return 2
    logs.configure(level=config.log_level, secrets=(config.service_token,))
    try:
        client = kube.Kube(kubeconfig=config.kubeconfig, pool_size=config.workers + 4)
    except Exception as e:  # kubernetes.config raises several unrelated types
        print(f"dispatcher: cannot load the Kubernetes config (KUBECONFIG={config.kubeconfig or 'in-cluster'}): {e}",
              file=sys.stderr)
        return 2
    api = backend.Backend(url=config.backend_url, service_token=config.service_token,
                          timeout=config.backend_timeout, pool_size=config.workers + 2)
    dispatcher = Dispatcher(config, client=client, api=api)
    # The handler only sets the flag: it runs on the main thread between two bytecodes, maybe while
    # that thread holds the inbox's lock, and putting on the inbox from there would wait for that lock
    # for ever (a SIGTERM that hung the process, seen once claims went through the inbox). The loop
    # never waits longer than a second, so it sees the flag within one.
    signal.signal(signal.SIGTERM, lambda signum, frame: dispatcher.stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: dispatcher.stopping.set())
    try:
        return dispatcher.run()
    finally:
        api.close()
        client.close()
