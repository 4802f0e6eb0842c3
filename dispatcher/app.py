"""The dispatcher's main loop: the stages wired together, the flow drawn once.

        backend                          Kubernetes
   POST /jobs/next ──claim──▶ ledger.reserve ──▶ jobspec ──▶ create Job, then its Secret
        ▲                        │  (only while ledger.unfinished() < MAX_INFLIGHT)
        │                        ▼
   POST /jobs/{id}/status ◀─ reporter ◀── ledger.observe ◀── informer (list+watch Jobs)
                                 │                 (Failed, or deleted unfinished)
                                 └────────▶ reaper (sandbox pods: job-id AND managed-by)
   finished Jobs reap themselves: ttlSecondsAfterFinished
   a driver pod waiting to start past the start deadline (starts.stuck, checked on a tick over
   the Pending driver pods once a Job is that old): reporter ("stuck", the kubelet's reason),
   then delete its Job
   a Job found without its Secret (its creator died between the two creates; checked once per Job
   not created here): a tombstone Secret (no token key: its container can never start), then
   delete the Job, unreported; the backend offers the still-claimed run again

One thread owns the state (this loop); the informer thread and the worker
pool only put results on `self.inbox`. Every I/O step (claim, create, check,
report, reap) runs on the pool so a slow apiserver or backend never stalls
the bookkeeping. Each stage is a module of `dispatcher.stages`; the state
they change is here: the ledger (the Jobs, and the creates in hand), the
task tables (`reports`, `checks`, `reaps`: typed `stages.task.Task`s), and
`tokens`, the one record of each run's token.

No stage is given the loop. Each gets only what it uses, built once in
`Dispatcher.__init__`: on the pool an `IO` (clients and settings, frozen),
on the loop a `State` (the parts of the state it changes) and the loop's
`submit` or `settle`:

   stage         on the pool (IO)                          on the loop (State)
   claim.Claims  backend.claim                             ledger, tokens; stopping, submit;
                                                           hands a reserved run to `create`
   create        kube, settings (Job, Secret), stopping    ledger, tokens, reports, checks
   check         kube, settings (namespace, tombstone)     ledger, reports (found: ledger, checks)
   report        kube, backend, namespace, log tail        tokens, ledger
                 lines, start deadline
   reap          kube, the namespaces reaped in            settle

Pipelining (`stages.claim`): several claims in flight at once, each counted
against the cap before it is sent; the creates of different runs overlap on
the pool (a run's own Job and Secret stay in order), and a run offered twice
at once cannot get two Jobs (`stages.create`). Reaps that are due go out
together (`stages.reap`: one label-scoped, paged list per batch).
SIGTERM stops claiming; the loop waits for the work in hand, then returns 0.
Each turn of the loop beats the heartbeat (`heartbeat`, when TCAB_DISPATCHER_HEARTBEAT_FILE is
set): the liveness probe (`alive`) reads its age, since there is no socket to ask.
`run(max_ticks=...)` bounds the loop for tests.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dispatcher import backend, heartbeat, jobspec, ledger, logs, settings
from dispatcher.stages import check, claim, create, reap, report, task
from toolkit import clusterconfig, informer, kube, paths

log = logging.getLogger("dispatcher")

# The stages' bounds, named here for the loop's readers and tests.
MAX_REPORT_ATTEMPTS = report.MAX_REPORT_ATTEMPTS
REAP_GATHER_SECONDS = reap.REAP_GATHER_SECONDS


class Dispatcher:
    def __init__(self, config: settings.Settings, *, client: kube.Client, api: backend.Backend,
                 tokens: dict[str, str] | None = None) -> None:
        """`tokens`: the token record to keep (a test passes one that notes who writes it)."""
        self.config = config
        self.kube = client
        self.backend = api
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.stopping = threading.Event()
        self.watch_stop = threading.Event()
        self.ledger = ledger.Ledger(max_inflight=config.max_inflight)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="work")
        self.tokens: dict[str, str] = {} if tokens is None else tokens  # Job name -> its run's token: the one record
        self.reports: dict[str, report.Report] = {}
        self.checks: dict[str, check.SecretCheck] = {}
        self.reaps: dict[str, reap.Reap] = {}
        self.in_hand = 0  # submitted to the pool, answer not yet handled
        self.synced = False
        self.dispatched = 0
        self.heartbeat = heartbeat.Heartbeat(config.heartbeat_file) if config.heartbeat_file else None
        self.informer = informer.Informer(
            client, paths.JOB, namespace=config.namespace, label_selector=jobspec.selector(), stop=self.watch_stop,
            handler=lambda kind, obj: self.inbox.put(("event", kind, obj)),
            on_list=lambda items, started: self.inbox.put(("sync", items, started)))

        # The stages, each given what it uses (the table in the module docstring), in the flow's order.
        self.claims = claim.Claims(workers=config.workers, poll_interval=config.poll_interval, backend=api,
                                   ledger=self.ledger, tokens=self.tokens, stopping=self.stopping,
                                   submit=self.submit, create=self._create)
        self.create_io = create.IO(kube=client, config=config, stopping=self.stopping)
        self.create_state = create.State(ledger=self.ledger, tokens=self.tokens, reports=self.reports,
                                         checks=self.checks)
        self.check_io = check.IO(kube=client, config=config)
        self.check_state = check.State(ledger=self.ledger, reports=self.reports)
        self.starts = check.StartCheck(deadline=config.driver_start_deadline, io=self.check_io,
                                       state=self.check_state, submit=self.submit)
        self.report_io = report.IO(kube=client, backend=api, namespace=config.namespace,
                                   log_tail_lines=config.log_tail_lines, start_deadline=config.driver_start_deadline)
        self.report_state = report.State(tokens=self.tokens, ledger=self.ledger)
        self.reap_io = reap.IO(kube=client, namespaces=tuple(dict.fromkeys((config.namespace,
                                                                            config.sandbox_namespace))))

    # -- the loop -----------------------------------------------------------

    def stop(self) -> None:
        self.stopping.set()
        self.inbox.put(("wake",))

    def run(self, *, max_ticks: int | None = None) -> int:
        self.informer.start()
        log.info("started", extra=logs.fields(namespace=self.config.namespace, max_inflight=self.config.max_inflight,
                                              sandbox_namespace=self.config.sandbox_namespace))
        ticks = 0
        try:
            while max_ticks is None or ticks < max_ticks:
                ticks += 1
                if self.heartbeat is not None:
                    self.heartbeat.beat(time.monotonic())
                self._drain(timeout=self._wait())
                if self.stopping.is_set():
                    if self.in_hand == 0:
                        break
                    continue
                if self.synced:
                    self.claims.tick(in_hand=self.in_hand)
                    self.starts.tick()
                self._start_due(self.reports, io=self.report_io, state=self.report_state)
                reap.start_due(self.reaps, io=self.reap_io, submit=self.submit,
                               settle=lambda t, ok: self.settle(t, ok=ok, state=None))
                self._start_due(self.checks, io=self.check_io, state=self.check_state)
        finally:
            self.watch_stop.set()
            self.pool.shutdown(wait=True)
            log.info("stopped", extra=logs.fields(unfinished=self.ledger.unfinished(), dispatched=self.dispatched,
                                                  api_requests=self.kube.requests,
                                                  backend_requests=self.backend.requests))
        return 0

    def _wait(self) -> float:
        now = time.monotonic()
        dues = [t.due for t in (*self.reports.values(), *self.reaps.values(), *self.checks.values()) if not t.busy]
        # A claim is due only when one may be sent; counting it while every worker is busy would make
        # this wait 0 and the loop spin until a worker comes back.
        if self.synced and self.claims.may_claim(in_hand=self.in_hand):
            dues.append(self.claims.next)
        if self.synced and (start_due := self.starts.due()) is not None:
            dues.append(start_due)
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
                check.found(str((job.get("metadata") or {}).get("name")), ledger=self.ledger, checks=self.checks)
        elif kind == "event":
            _, event_type, obj = item
            changes = self.ledger.observe(event_type, obj, now=now)
            name = str((obj.get("metadata") or {}).get("name"))
            entry = self.ledger.get(name)
            finished = event_type == "DELETED" or (entry is not None and entry.phase is ledger.Phase.COMPLETE)
            if finished and not changes and name not in self.reports:
                self.tokens.pop(name, None)  # a vanished run keeps its token until it is reported
            check.found(name, ledger=self.ledger, checks=self.checks)
        elif kind == "done":
            _, callback, future = item
            self.in_hand -= 1
            callback(future)
            return
        else:
            return
        for change in changes:
            # Debug, not info: the report's own line ("death reported", or the warning or error that
            # stops it) says the same with the cause and the outcome, one info line per death, not two.
            log.debug("driver job ended without finishing" if change.kind == "vanished" else "driver job failed",
                      extra=logs.fields(job=change.name, job_id=change.job_id, unfinished=self.ledger.unfinished()))
            self.reports.setdefault(change.name, report.Death(change.name, change.job_id, cause=change.kind,
                                                              job=change.job))
            self.reaps.setdefault(change.name, reap.Reap(change.name, change.job_id, due=now + REAP_GATHER_SECONDS))

    def submit(self, fn: Callable[..., Any], callback: task.Callback, *args: Any) -> None:
        """Run `fn(*args)` on the pool; `callback(future)` runs on the loop with its answer."""
        self.in_hand += 1
        future = self.pool.submit(fn, *args)
        future.add_done_callback(lambda f: self.inbox.put(("done", callback, f)))

    # -- claim → create -----------------------------------------------------

    def _create(self, claim: backend.Claim, name: str, uid: str, claimed_at: float) -> None:
        """The claim stage hands over a run it reserved: its Job and Secret are made on the pool."""
        self.submit(create.create, self._created, self.create_io, claim, name, uid, claimed_at)

    def _created(self, future: concurrent.futures.Future[Any]) -> None:
        if create.created(self.create_state, future):
            self.dispatched += 1

    # -- the retried tasks --------------------------------------------------

    def _start_due(self, table: dict[str, Any], *, io: Any, state: Any) -> None:
        now = time.monotonic()
        if self.stopping.is_set():
            return
        for t in list(table.values()):
            if t.busy or t.due > now:
                continue
            t.busy = True
            t.begin(state)
            self.submit(t.step, lambda f, t=t: self._stepped(t, f, state=state), io)

    def _stepped(self, t: task.Task[Any, Any], future: concurrent.futures.Future[Any], *, state: Any) -> None:
        try:
            ok = bool(future.result())
        except Exception as e:  # a bug in one step must not stop the loop
            log.error("report/reap step crashed", extra=logs.fields(job=t.name, error=repr(e)))
            ok = False
        t.answered(state)
        self.settle(t, ok=ok, state=state)

    def settle(self, t: task.Task[Any, Any], *, ok: bool, state: Any) -> None:
        """A task's attempt is over: done, abandoned, or due again after its backoff."""
        if not t.settle(ok, now=time.monotonic()):
            return
        if ok:
            t.done(state)
        else:
            t.abandoned(state)
        table: dict[str, Any] = getattr(self, t.TABLE)
        if table.get(t.name) is t:
            del table[t.name]
        if t.name not in self.reports and self.ledger.get(t.name) is None:
            self.tokens.pop(t.name, None)


def main(environ: dict[str, str] | None = None) -> int:
    try:
        config = settings.from_env(os.environ if environ is None else environ)
    except settings.SettingsError as e:
        print(f"dispatcher: {e}", file=sys.stderr)
        return 2
    logs.configure(level=config.log_level, secrets=(config.service_token,))
    try:
        # No retries in the client: the loop owns every backoff (it knows when a retry is safe).
        client = clusterconfig.load(kubeconfig=config.kubeconfig or None, pool_size=config.workers + 4, retries=0)
    except clusterconfig.ConfigError as e:
        print(f"dispatcher: {e}", file=sys.stderr)
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
