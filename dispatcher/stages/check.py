"""Checks of Jobs this process did not create: their Secret, and their driver's start.

A Job seen unfinished whose Secret no create here has seen to (its creator
is gone) is checked once (`SecretCheck`). If it has no Secret, a tombstone
Secret (no token key) is written: its container can never start, so
deleting the Job (`report.Orphan`) cannot kill a driver that ran; the
backend offers the still-claimed run again.

The start deadline (`StartCheck`): on a tick, a filtered, paged list of the
Pending driver pods; a driver waiting to start past the deadline gets its
Job expired in the ledger and a `report.Stuck`. The list is skipped while
every unfinished Job is younger than the deadline less a clock-skew margin.

Both read and write through `IO` (the Kubernetes client and the settings,
on the pool) and change only `State` (the ledger and the report table, on
the loop); `found` is given the ledger and the check table.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any, ClassVar

from dispatcher import jobspec, ledger, logs, names, settings, starts
from dispatcher.stages import report, task
from toolkit import kube, paths

log = logging.getLogger("dispatcher")

# How often the Pending driver pods are checked against the start deadline: a quarter of it,
# within these bounds (one filtered pod list per check).
START_CHECK_MIN, START_CHECK_MAX = 0.5, 30.0
# The pod list is skipped while every unfinished Job is younger than the deadline less this margin
# (the Job's creationTimestamp is the apiserver's clock, compared with this host's).
CLOCK_SKEW_MARGIN = 60.0


@dataclasses.dataclass(frozen=True)
class IO:
    """What a check uses, on the pool."""

    kube: kube.Client
    config: settings.Settings  # the namespace, and the tombstone (jobspec)


@dataclasses.dataclass(frozen=True)
class State:
    """What a check's answer changes, on the loop."""

    ledger: ledger.Ledger
    reports: dict[str, report.Report]  # a Job to delete: unreported (`report.Orphan`) or stuck (`report.Stuck`)


def found(name: str, *, ledger: ledger.Ledger, checks: dict[str, SecretCheck]) -> None:
    """Check once the Secret of an unfinished Job no create here has seen to."""
    if name in checks or not ledger.unchecked(name):
        return
    entry = ledger.get(name)
    assert entry is not None
    checks[name] = SecretCheck(name, entry.job_id, uid=entry.uid)


@dataclasses.dataclass(eq=False)
class SecretCheck(task.Task[IO, State]):
    """Does the Job's Secret serve it? If there is none, a tombstone."""

    uid: str = ""  # of the Job checked
    outcome: str = ""  # "ok" or "tombstoned", once done

    TABLE: ClassVar[str] = "checks"

    def step(self, io: IO) -> bool:
        ns, fields = io.config.namespace, {"job": self.name, "job_id": self.job_id}
        try:
            try:
                secret: dict[str, Any] | None = io.kube.get(paths.SECRET, name=self.name, namespace=ns)
            except kube.NotFound:
                secret = None
            if secret is None:
                try:
                    io.kube.create(paths.SECRET, jobspec.tombstone(self.job_id, io.config, job_uid=self.uid),
                                   namespace=ns)
                except kube.ApiError as e:
                    if e.status != 409:
                        raise
                    return False  # written meanwhile (by the create of a claim offered again): look again
                self.outcome = "tombstoned"
                return True
            if jobspec.serves(secret, self.uid):
                self.outcome = "ok"
                return True
            if not jobspec.has_token(secret):
                self.outcome = "tombstoned"  # written by an earlier check that did not get to the delete
                return True
            return False  # an earlier Job's Secret, about to be collected: look again after it
        except kube.ApiError as e:
            log.warning("cannot check the job's token Secret; retrying", extra=logs.fields(**fields, error=str(e)))
            return False

    def done(self, state: State) -> None:
        entry = state.ledger.get(self.name)
        if entry is None or entry.uid != self.uid:
            return  # that Job is gone; another of the same name is judged on its own
        if self.outcome == "ok":
            state.ledger.secret_confirmed(self.name)
        elif self.outcome == "tombstoned" and state.ledger.expire(self.name):
            log.warning("driver job found without its token Secret (its creator stopped between the two "
                        "creates); deleting it, unreported: the backend will offer the run again",
                        extra=logs.fields(job=self.name, job_id=self.job_id))
            state.reports[self.name] = report.Orphan(self.name, self.job_id, uid=self.uid)


class StartCheck:
    """The start deadline over the Pending driver pods, on a tick: the list on the pool (`io`), its
    answer on the loop (`state`)."""

    def __init__(self, *, deadline: float, io: IO, state: State, submit: task.Submit) -> None:
        self.deadline = deadline
        self.io = io
        self.state = state
        self.submit = submit
        self.every = min(START_CHECK_MAX, max(START_CHECK_MIN, deadline / 4))
        self.next = 0.0
        self.busy = False

    def due(self) -> float | None:
        """When the loop must wake for it (None: nothing to wait for)."""
        return None if self.busy or self.state.ledger.unfinished() == 0 else self.next

    def tick(self) -> None:
        now = time.monotonic()
        book = self.state.ledger
        if self.busy or now < self.next or book.unfinished() == 0:
            return
        if book.oldest_age(now=now, wall=time.time()) < self.deadline - CLOCK_SKEW_MARGIN:
            self.next = now + self.every  # no pod can be late yet: no list
            return
        self.busy = True
        self.submit(self.late_pods, self.answered)

    def late_pods(self) -> list[tuple[str, starts.Stuck]]:
        """(Job name, why) of each driver pod waiting to start past the deadline (a paged list), on the pool."""
        pods = self.io.kube.each(paths.POD, namespace=self.io.config.namespace, label_selector=jobspec.selector(),
                                 field_selector="status.phase=Pending", limit=100)
        now = time.time()
        late = []
        for pod in pods:
            stuck = starts.stuck(pod, now=now, deadline=self.deadline)
            job_name = ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOB_NAME_LABEL)
            if stuck is not None and job_name:
                late.append((str(job_name), stuck))
        return late

    def answered(self, future: concurrent.futures.Future[Any]) -> None:
        self.busy = False
        self.next = time.monotonic() + self.every
        try:
            late = future.result()
        except Exception as e:  # an API error, or a bug: neither may stop the loop
            log.warning("start deadline check failed; retrying next tick", extra=logs.fields(error=str(e)))
            return
        for name, stuck in late:
            entry = self.state.ledger.get(name)
            if entry is None or not self.state.ledger.expire(name):
                continue
            log.warning("driver did not start within the start deadline; reporting and deleting its job",
                        extra=logs.fields(job=name, job_id=entry.job_id, pod=stuck.pod, reason=stuck.reason,
                                          waited_s=round(stuck.waited, 1), deadline_s=self.deadline))
            self.state.reports[name] = report.Stuck(name, entry.job_id)
