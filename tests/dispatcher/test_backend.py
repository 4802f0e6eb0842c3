"""The dispatcher's backend client and the loop's retry bookkeeping, against the real reference backend."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher import app, backend, settings
from dispatcher.stages import report
from tests.refbackend import proc


@pytest.fixture
def ref() -> Iterator[proc.Backend]:
    with proc.Backend() as b:
        yield b


def test_a_429_with_retry_after_reaches_the_caller_for_claims_and_reports(ref: proc.Backend) -> None:
    run = ref.enqueue()
    client = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    try:
        ref.fault(status=429, on="next", retry_after="7")
        with pytest.raises(backend.BackendError) as e:
            client.claim()
        assert e.value.retry_after == 7
        ref.fault(status=503, on="status", retry_after="9")
        assert client.report(job_id=run["id"], token=run["token"], body={"status": "failed"}) == backend.Answer(
            backend.Outcome.RETRY, 503, 9.0)
        assert client.report(job_id=run["id"], token=run["token"], body={"status": "failed"}).outcome is \
            backend.Outcome.ACCEPTED
    finally:
        client.close()


def dispatcher_for(ref: proc.Backend) -> app.Dispatcher:
    """The real loop object over the real backend; no Kubernetes call is reached in these tests."""
    config = settings.from_env({"TCAB_BACKEND_URL": ref.url, "TCAB_BACKEND_SERVICE_TOKEN": ref.token,
                                "TCAB_DISPATCHER_DRIVER_IMAGE": "driver:1", "TCAB_DISPATCHER_NAMESPACE": "ns"})
    client = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    return app.Dispatcher(config, client=None, api=client)  # type: ignore[arg-type]


def close(d: app.Dispatcher) -> None:
    d.pool.shutdown(wait=True)
    d.backend.close()


def test_the_loop_waits_out_a_claims_retry_after(ref: proc.Backend) -> None:
    d = dispatcher_for(ref)
    try:
        ref.enqueue()
        ref.fault(status=429, on="next", retry_after="7")
        d.synced = True
        before = time.monotonic()
        d.claims.tick(in_hand=d.in_hand)
        d._drain(timeout=10)  # the claim runs on the pool; its answer comes back through the inbox
        assert d.claims.next >= before + 7, "claimed again before the backend's Retry-After"
        assert d.in_hand == 0 and d.ledger.unfinished() == 0
    finally:
        close(d)


def report_once(d: app.Dispatcher, pending: report.Report) -> None:
    """One step of PENDING as the loop runs it: begin on the loop's thread, step, then settle."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    pending.begin(d.report_state)
    future.set_result(pending.step(d.report_io))
    d._stepped(pending, future, state=d.report_state)


def test_the_loop_waits_out_a_reports_retry_after(ref: proc.Backend) -> None:
    run = ref.enqueue()
    d = dispatcher_for(ref)
    try:
        pending = report.Death("tcab-run-x", run["id"], cause="failed",
                               body={"status": "failed", "error": {"reason": "OOMKilled"}})
        d.tokens[pending.name] = run["token"]
        d.reports[pending.name] = pending
        ref.fault(status=429, on="status", retry_after="7")
        before = time.monotonic()
        report_once(d, pending)
        assert pending.name in d.reports and pending.due >= before + 7
        report_once(d, pending)  # no fault left: delivered
        assert pending.name not in d.reports and ref.get(run["id"])["state"] == "failed"
    finally:
        close(d)


def test_a_report_abandoned_after_the_last_attempt_logs_an_error(ref: proc.Backend,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    run = ref.enqueue()
    d = dispatcher_for(ref)
    try:
        pending = report.Death("tcab-run-x", run["id"], cause="failed",
                               body={"status": "failed", "error": {"reason": "OOMKilled"}},
                               attempts=app.MAX_REPORT_ATTEMPTS - 2)
        d.tokens[pending.name] = run["token"]
        d.reports[pending.name] = pending
        ref.fault(status=503, on="status", count=5)
        with caplog.at_level(logging.INFO, logger="dispatcher"):
            report_once(d, pending)
            assert pending.name in d.reports and not [r for r in caplog.records if r.levelno >= logging.ERROR]
            report_once(d, pending)
        assert pending.name not in d.reports
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [r.getMessage() for r in errors] == ["death report abandoned: the backend never took it"]
        assert errors[0].fields["attempts"] == app.MAX_REPORT_ATTEMPTS  # type: ignore[attr-defined]
        assert ref.faults()["hits"]["status"] == 2
    finally:
        close(d)
