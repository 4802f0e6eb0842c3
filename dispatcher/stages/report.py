"""Deaths the driver could not report, told to the backend; one task per kind.

- `Death`: the driver Job failed, or was deleted before it finished
  ("failed", "vanished"): the report's detail (pod status, log tail,
  Events) is read, then sent with the run's token.
- `Stuck`: its driver never started within the start deadline: the detail
  and the token are read first, then its Job is deleted (its Secret and pod
  go with it), then the report is sent.
- `Refused`: the apiserver refused the Job for good: the run is reported
  failed, so it is not lost.
- `Orphan`: a Job found without its token Secret: nothing to report (its
  driver never ran); the Job is deleted by uid, and the backend offers the
  still-claimed run again after its lease.

A report's step has its `IO` (the Kubernetes client, the backend, and the
three settings it reads); its hooks on the loop have its `State` (the token
record, and the ledger). The token is the run's one record (`State.tokens`:
from the claim, or read back from the Job's Secret once, by a process that
did not claim the run). The loop copies it onto the task before a step
(`begin`); a token the step read from the Secret rides back on the task and
the loop records it (`answered`): a worker never writes the record. A report is abandoned after `MAX_REPORT_ATTEMPTS`, with an error
line; a Stuck or Orphan whose delete never went through is then judged
again by the next start check.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

from dispatcher import backend, jobspec, ledger, logs, reporter
from dispatcher.stages import task
from toolkit import kube, paths

log = logging.getLogger("dispatcher")

MAX_REPORT_ATTEMPTS = 30
Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class IO:
    """What a report's step uses, on the pool."""

    kube: kube.Client
    backend: backend.Backend
    namespace: str  # of the driver Jobs and their Secrets
    log_tail_lines: int  # of the dead driver's log, in the report
    start_deadline: float  # said in a stuck driver's report


@dataclasses.dataclass(frozen=True)
class State:
    """What a report changes, on the loop."""

    tokens: dict[str, str]  # the one record of each run's token
    ledger: ledger.Ledger  # a Job whose delete never went through is judged again (`DeletesJob`)


@dataclasses.dataclass(eq=False)
class Report(task.Task[IO, State]):
    """A report to send with the run's token."""

    body: Obj | None = None
    job: Obj | None = dataclasses.field(default=None, repr=False)  # the Job as last seen, for the body
    token: str | None = dataclasses.field(default=None, repr=False)  # the run's, once known

    TABLE: ClassVar[str] = "reports"
    max_attempts: ClassVar[int | None] = MAX_REPORT_ATTEMPTS
    kind: ClassVar[str] = ""  # the report's kind, as `reporter.describe` takes it

    def _fields(self) -> dict[str, str]:
        return {"job": self.name, "job_id": self.job_id}

    def begin(self, state: State) -> None:
        self.token = self.token or state.tokens.get(self.name)

    def answered(self, state: State) -> None:
        # Kept on the run's record: a Stuck report's Secret goes with its Job before the send.
        if self.token:
            state.tokens[self.name] = self.token

    def _token(self, io: IO) -> str | None:
        if self.token:
            return self.token
        try:
            secret = io.kube.get(paths.SECRET, name=self.name, namespace=io.namespace)
        except kube.NotFound:
            return None
        self.token = reporter.token_from_secret(secret) or None
        return self.token

    def _gather(self, io: IO) -> Obj:
        return reporter.gather(io.kube, namespace=io.namespace, kind=self.kind, job_name=self.name, job=self.job,
                               tail_lines=io.log_tail_lines, start_deadline=io.start_deadline)

    def prepare(self, io: IO, token: str | None) -> bool:
        """Read what the body needs (once); False to try again later."""
        if self.body is None and token is not None:
            self.body = self._gather(io)
        return True

    def step(self, io: IO) -> bool:
        try:
            token = self._token(io)
        except kube.ApiError as e:
            log.warning("cannot read the job token yet", extra=logs.fields(**self._fields(), error=str(e)))
            return False
        if not self.prepare(io, token):
            return False
        if token is None:
            log.error("no token for the run (its Secret is gone): death not reported", extra=logs.fields(**self._fields()))
            return True
        assert self.body is not None
        answer = io.backend.report(job_id=self.job_id, token=token, body=self.body)
        outcome = answer.outcome
        error = self.body.get("error") or {}
        extra = logs.fields(**self._fields(), cause=self.kind, outcome=outcome.value, http_status=answer.status,
                            reason=error.get("reason"), exit_code=error.get("exit_code"), attempt=self.attempts + 1)
        if outcome is backend.Outcome.RETRY:
            self.retry_after = answer.retry_after
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

    def abandoned(self, state: State) -> None:
        log.error("death report abandoned: the backend never took it",
                  extra=logs.fields(**self._fields(), attempts=self.attempts, kind=self.kind))


@dataclasses.dataclass(eq=False)
class Death(Report):
    """A driver Job that failed ("failed") or was deleted before it finished ("vanished")."""

    cause: str = "failed"

    @property  # type: ignore[override]
    def kind(self) -> str:
        return self.cause


@dataclasses.dataclass(eq=False)
class DeletesJob(Report):
    """A report that deletes its Job; if the delete never goes through, the Job is judged again."""

    job_deleted: bool = False

    def delete_job(self, io: IO, *, uid: str, why: str) -> bool:
        """Delete the Job (only the one with `uid`, if given); False (logged) to try again later.
        A 409 means that Job is gone already (another of its name stands): done too."""
        if not self.job_deleted:
            try:
                io.kube.delete(paths.JOB, name=self.name, namespace=io.namespace,
                              body=jobspec.deletion(uid=uid), missing_ok=True)
            except kube.ApiError as e:
                if not (uid and e.status == 409):
                    log.warning(f"cannot delete {why}; retrying", extra=logs.fields(**self._fields(), error=str(e)))
                    return False
            self.job_deleted = True
        return True

    def abandoned(self, state: State) -> None:
        super().abandoned(state)
        if not self.job_deleted:
            state.ledger.unexpire(self.name)  # the next start check tries the delete again


@dataclasses.dataclass(eq=False)
class Stuck(DeletesJob):
    """A driver that never started within the start deadline: reported, and its Job deleted."""

    kind: ClassVar[str] = "stuck"

    def prepare(self, io: IO, token: str | None) -> bool:
        if self.body is None:  # read even without a token: the log line says why it never started
            self.body = self._gather(io)
        # The token and the report's detail are read first: the Secret and the pod go with the Job.
        return self.delete_job(io, uid="", why="the job of a driver that never started")


@dataclasses.dataclass(eq=False)
class Refused(Report):
    """A run whose Job the apiserver refused for good: reported failed with the refusal."""

    kind: ClassVar[str] = "refused"

    @classmethod
    def of(cls, name: str, job_id: str, why: str) -> Refused:
        body = {"status": "failed", "error": {"source": "dispatcher", "reason": "DispatchFailed",
                                              "message": f"the driver Job could not be created: {why}"}}
        return cls(name, job_id, body=body)


@dataclasses.dataclass(eq=False)
class Orphan(DeletesJob):
    """A Job that can never have its token: deleted by its uid, unreported (its driver never ran)."""

    uid: str = ""

    kind: ClassVar[str] = "orphan"

    def step(self, io: IO) -> bool:
        return self.delete_job(io, uid=self.uid, why="a driver job without its token")
