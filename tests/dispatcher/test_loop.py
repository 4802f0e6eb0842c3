"""The dispatcher's loop, `Dispatcher.run(max_ticks=...)`, through its retry, abandon and tombstone
paths: the real loop, the real reference backend over HTTP, and the in-memory client of
tests/dispatcher/fakekube.py in place of the apiserver, so each path takes moments. The control-plane
tests (test_cluster.py, test_pipelining.py, test_token_leak.py) remain the proof on the real thing.
"""

from __future__ import annotations

import inspect
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dispatcher import app, backend, heartbeat, jobspec, settings
from dispatcher.stages import create, task
from tests.dispatcher import fakekube
from tests.refbackend import proc
from toolkit import kube, paths

NS = "runs"


@pytest.fixture
def ref() -> Iterator[proc.Backend]:
    with proc.Backend() as b:
        yield b


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks and creates retry within milliseconds (the paths are the same; only the pauses shrink)."""
    monkeypatch.setattr(task, "RETRY_BASE", 0.001)
    monkeypatch.setattr(task, "RETRY_CAP", 0.01)


def config_for(ref: proc.Backend, **extra: str) -> settings.Settings:
    return settings.from_env({"TCAB_BACKEND_URL": ref.url, "TCAB_BACKEND_SERVICE_TOKEN": ref.token,
                              "TCAB_DISPATCHER_DRIVER_IMAGE": "driver:1", "TCAB_DISPATCHER_NAMESPACE": NS,
                              "TCAB_DISPATCHER_POLL_INTERVAL": "0.05", **extra})


def drive(d: app.Dispatcher, until: Callable[[], bool], *, timeout: float = 20.0) -> None:
    """Run the loop (bounded by max_ticks) until `until()` holds, then stop it and wait for it."""
    loop = threading.Thread(target=d.run, kwargs={"max_ticks": 5000}, daemon=True)
    loop.start()
    deadline = time.monotonic() + timeout
    try:
        while not until():
            assert loop.is_alive(), "the loop ended before the condition held"
            assert time.monotonic() < deadline, "the condition never held"
            time.sleep(0.01)
    finally:
        d.stop()
        loop.join(30)
    assert not loop.is_alive()


def dispatcher(ref: proc.Backend, fake: fakekube.FakeClient, *, tokens: dict[str, str] | None = None,
               **extra: str) -> tuple[app.Dispatcher, backend.Backend]:
    api = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    made = app.Dispatcher(config_for(ref, **extra), client=fake, api=api, tokens=tokens)  # type: ignore[arg-type]
    return made, api


def calls(fake: fakekube.FakeClient, method: str, plural: str) -> int:
    return sum(1 for m, p, _ in fake.calls if (m, p) == (method, plural))


def test_a_create_without_an_answer_is_retried_and_the_run_gets_one_job_and_its_secret(ref: proc.Backend) -> None:
    run = ref.enqueue()
    fake = fakekube.FakeClient()
    fake.fail("create", "jobs", kube.Unavailable("connection refused"), kube.Unavailable("connection reset"))
    d, api = dispatcher(ref, fake)
    try:
        drive(d, lambda: d.dispatched == 1)
    finally:
        api.close()
    name = jobspec.job_name(run["id"])
    assert fake.named("jobs") == [name] and calls(fake, "create", "jobs") == 3
    job = fake.get(paths.JOB, name=name, namespace=NS)
    assert jobspec.serves(fake.get(paths.SECRET, name=name, namespace=NS), job["metadata"]["uid"])
    assert ref.get(run["id"])["state"] == "claimed"


def test_a_secret_create_retried_after_its_job_was_made_creates_the_job_once_and_counts_it_dispatched(
        ref: proc.Backend) -> None:
    run = ref.enqueue()
    fake = fakekube.FakeClient()
    fake.fail("create", "secrets", kube.ApiError(500, "InternalError", "etcd leader changed"))
    d, api = dispatcher(ref, fake)
    try:
        drive(d, lambda: d.ledger.get(jobspec.job_name(run["id"])) is not None
              and d.ledger.get(jobspec.job_name(run["id"])).secret_ok)  # type: ignore[union-attr]
    finally:
        api.close()
    assert calls(fake, "create", "jobs") == 1 and calls(fake, "create", "secrets") == 2
    assert d.dispatched == 1


def test_a_job_refused_by_the_apiserver_is_reported_failed_and_the_run_is_not_lost(ref: proc.Backend) -> None:
    run = ref.enqueue()
    fake = fakekube.FakeClient()
    fake.fail("create", "jobs", kube.Invalid(422, "Invalid", "spec.template: Invalid value"))
    d, api = dispatcher(ref, fake)
    try:
        drive(d, lambda: ref.get(run["id"])["state"] == "failed")
    finally:
        api.close()
    assert fake.named("jobs") == [] and d.ledger.unfinished() == 0 and not d.tokens
    (delivered,) = ref.get(run["id"])["reports"]
    error = delivered["body"]["error"]
    assert error.get("reason") == "DispatchFailed" and "Invalid value" in error.get("message", "")


def orphan(ref: proc.Backend, fake: fakekube.FakeClient) -> tuple[dict[str, str], str, str]:
    """A run claimed by a dispatcher that died between its two creates: its Job, no Secret."""
    run = ref.enqueue()
    dead = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    try:
        claim = dead.claim()
    finally:
        dead.close()
    assert claim is not None and claim.job_id == run["id"]
    made = fake.put(paths.JOB, jobspec.job(claim, config_for(ref)), namespace=NS)
    return run, made["metadata"]["name"], made["metadata"]["uid"]


def test_a_job_found_without_its_secret_gets_a_tombstone_and_is_deleted_by_uid_unreported(ref: proc.Backend) -> None:
    fake = fakekube.FakeClient()
    run, name, uid = orphan(ref, fake)
    d, api = dispatcher(ref, fake)
    try:
        drive(d, lambda: name not in fake.named("jobs") and d.ledger.unfinished() == 0 and not d.reports)
    finally:
        api.close()
    writes = [(m, p, n) for m, p, n in fake.calls if m in ("create", "delete")]
    assert writes == [("create", "secrets", name), ("delete", "jobs", name)], "tombstone first, then the delete"
    assert fake.named("secrets") == [], "the tombstone went with its Job"
    assert ref.get(run["id"])["state"] == "claimed", "unreported: the backend offers the run again after its lease"
    assert not d.tokens


def test_an_orphan_whose_delete_never_goes_through_is_abandoned_then_judged_again(
        ref: proc.Backend, caplog: pytest.LogCaptureFixture) -> None:
    fake = fakekube.FakeClient()
    run, name, uid = orphan(ref, fake)
    fake.fail("delete", "jobs", *[kube.ApiError(503, "ServiceUnavailable", "")] * app.MAX_REPORT_ATTEMPTS)
    d, api = dispatcher(ref, fake)
    try:
        with caplog.at_level(logging.INFO, logger="dispatcher"):
            drive(d, lambda: calls(fake, "delete", "jobs") == app.MAX_REPORT_ATTEMPTS and not d.reports)
    finally:
        api.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["death report abandoned: the backend never took it"]
    entry = d.ledger.get(name)
    assert entry is not None and not entry.expired, "unexpired: the next start check may try the delete again"
    assert fake.named("jobs") == [name] and ref.get(run["id"])["state"] == "claimed"


def test_a_failed_driver_s_report_is_retried_past_the_backend_s_503s_and_delivered_once(ref: proc.Backend) -> None:
    run = ref.enqueue()
    fake = fakekube.FakeClient()
    d, api = dispatcher(ref, fake)
    name = jobspec.job_name(run["id"])
    ref.fault(status=503, on="status", count=2)
    try:
        def failed_and_reported() -> bool:
            job = fake.objects.get(("jobs", NS, name))
            if d.dispatched == 1 and job is not None and job.get("status") is None:
                fakekube.finish(fake, name=name, namespace=NS, state="Failed")
            if ref.get(run["id"])["state"] == "failed" and not d.reports:
                fake.delete(paths.JOB, name=name, namespace=NS, missing_ok=True)  # its TTL ran out
                return not d.tokens  # the token's one record goes once the Job is gone too
            return False
        drive(d, failed_and_reported)
    finally:
        api.close()
    assert ref.faults()["hits"]["status"] == 3, "two refused, the third delivered"
    assert len(ref.get(run["id"])["reports"]) == 1


def test_a_run_whose_job_vanished_costs_two_info_lines_dispatched_and_death_reported_with_its_cause(
        ref: proc.Backend, caplog: pytest.LogCaptureFixture) -> None:
    run = ref.enqueue()
    fake = fakekube.FakeClient()
    d, api = dispatcher(ref, fake)
    name = jobspec.job_name(run["id"])
    try:
        def vanished_and_reported() -> bool:
            if d.dispatched == 1 and fake.objects.get(("jobs", NS, name)) is not None:
                fake.delete(paths.JOB, name=name, namespace=NS, missing_ok=True)
            return ref.get(run["id"])["state"] == "failed" and not d.reports
        with caplog.at_level(logging.INFO, logger="dispatcher"):
            drive(d, vanished_and_reported)
    finally:
        api.close()
    per_run = [r for r in caplog.records if r.levelno >= logging.INFO and getattr(r, "fields", {}).get("job") == name]
    assert [r.getMessage() for r in per_run] == ["dispatched", "death reported"]
    assert per_run[1].fields["cause"] == "vanished" and per_run[1].fields["outcome"] == "accepted"  # type: ignore[attr-defined]


def test_the_create_result_is_named_and_keeps_the_token_out_of_its_repr() -> None:
    claim = backend.Claim(job_id="r", token="s3cr3t-t0ken", launch_request={})
    result = create.Created(create.Outcome.CREATED, "tcab-run-r", claim, uid="u", latency=0.01)
    assert (result.outcome, result.uid, result.why) == (create.Outcome.CREATED, "u", "")
    assert "s3cr3t-t0ken" not in repr(result)


@pytest.mark.parametrize("method", ["create", "get", "delete", "each", "list", "watch", "read_log", "close"])
def test_the_fake_takes_the_shared_client_s_arguments(method: str) -> None:
    """The stand-in answers the calls the real client takes, argument for argument."""
    real = inspect.signature(getattr(kube.Client, method)).parameters
    fake = inspect.signature(getattr(fakekube.FakeClient, method)).parameters
    assert [(p.name, p.kind) for p in fake.values()] == [(p.name, p.kind) for p in real.values()]


class WritesSeen(dict[str, str]):
    """The token record, noting the thread of every write to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: set[str] = set()

    def __setitem__(self, key: str, value: str) -> None:
        self.writers.add(threading.current_thread().name)
        super().__setitem__(key, value)

    def pop(self, key: str, *default: object) -> object:  # type: ignore[override]
        self.writers.add(threading.current_thread().name)
        return super().pop(key, *default)


def test_a_token_read_back_from_its_secret_is_recorded_by_the_loop_not_by_a_worker(ref: proc.Backend) -> None:
    """A run claimed by a dispatcher now gone (its Job and Secret stand, its token is in no record
    here) fails: the report reads the token from the Secret on a worker and hands it back; only the
    loop writes the token record (`app`: one thread owns the state)."""
    run = ref.enqueue()
    gone = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    try:
        claim = gone.claim()
    finally:
        gone.close()
    assert claim is not None and claim.job_id == run["id"]
    fake = fakekube.FakeClient()
    made = fake.put(paths.JOB, jobspec.job(claim, config_for(ref)), namespace=NS)
    name = made["metadata"]["name"]
    fake.put(paths.SECRET, jobspec.secret(claim, config_for(ref), job_uid=made["metadata"]["uid"]), namespace=NS)
    tokens = WritesSeen()
    d, api = dispatcher(ref, fake, tokens=tokens)
    loop_threads: list[str] = []
    run_loop = d.run
    d.run = lambda **kw: loop_threads.append(threading.current_thread().name) or run_loop(**kw)  # type: ignore[method-assign]
    try:
        def failed_and_reported() -> bool:
            if d.ledger.get(name) is not None and not d.checks and (fake.objects[("jobs", NS, name)].get("status")
                                                                     is None):
                fakekube.finish(fake, name=name, namespace=NS, state="Failed")
            return ref.get(run["id"])["state"] == "failed" and not d.reports
        drive(d, failed_and_reported)
    finally:
        api.close()
    assert len(ref.get(run["id"])["reports"]) == 1, "reported with the token read back from the Secret"
    assert tokens.writers == set(loop_threads), f"written from {sorted(tokens.writers)}"


def test_the_loop_keeps_its_heartbeat_fresh_touching_it_about_once_a_second_and_the_probe_passes(
        ref: proc.Backend, tmp_path: pathlib.Path) -> None:
    """Each time the loop touches the file it is set back an hour; it must come back fresh, again and
    again (the loop keeps beating while idle, claiming every 0.05 s), but not more often than
    heartbeat.EVERY: the loop turns twenty times a second here, and the file is touched once."""
    beat = tmp_path / "alive"
    stale = time.time() - 3600
    seen: list[float] = []

    def refreshed_three_times() -> bool:
        if beat.exists() and beat.stat().st_mtime > stale + 1800:
            seen.append(time.monotonic())
            if len(seen) < 3:
                os.utime(beat, (stale, stale))
        return len(seen) >= 3

    d, api = dispatcher(ref, fakekube.FakeClient(), TCAB_DISPATCHER_HEARTBEAT_FILE=str(beat))
    try:
        drive(d, refreshed_three_times)
    finally:
        api.close()
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert all(heartbeat.EVERY * 0.5 <= gap <= 10 for gap in gaps), gaps
    done = subprocess.run([sys.executable, "-m", "dispatcher.alive", "--max-age", "30", str(beat)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_heartbeat_that_cannot_be_written_is_one_error_line_until_it_can(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "beats"
    beat = heartbeat.Heartbeat(str(folder / "alive"))
    with caplog.at_level(logging.INFO, logger="dispatcher"):
        for now in (0.0, 1.0, 2.0):  # the directory is missing: the touch fails each time, said once
            beat.beat(now)
        folder.mkdir()
        beat.beat(2.5)  # within EVERY of the last try: not tried
        assert not (folder / "alive").exists()
        beat.beat(3.0)
    assert (folder / "alive").exists()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("ERROR", "heartbeat not written"), ("INFO", "heartbeat written again")]
