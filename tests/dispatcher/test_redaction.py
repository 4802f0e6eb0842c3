"""Tokens are checked where they enter and redacted wherever they could leave.

Pure logic (the token rule, the log formatter, the death report's body) is
tested on its own; the backend client against the real reference backend
(real HTTP, its SQLite file), with a bad token written into its run table as
a backend that mints one would hand it out.
"""

from __future__ import annotations

import json
import logging
import pathlib
import sqlite3
import sys
import uuid
from collections.abc import Iterator

import pytest

from dispatcher import backend, logs, reporter, settings
from tests.refbackend import proc

# A character each that breaks a header or hides from a string match once escaped.
LEAKY = {"newline": "\n", "carriage-return": "\r", "quote": '"', "backslash": "\\", "non-ascii": "\u00e9\u2603"}


def leaky(kind: str) -> tuple[str, tuple[str, str]]:
    """A token with LEAKY[kind] between two random halves; the halves are what must never be seen."""
    a, b = uuid.uuid4().hex[:14], uuid.uuid4().hex[:14]
    return f"{a}{LEAKY[kind]}{b}", (a, b)


def good() -> str:
    return "tok-" + uuid.uuid4().hex


def record(message: str, *, fields: object = None, exc: BaseException | None = None) -> logging.LogRecord:
    r = logging.LogRecord("dispatcher", logging.ERROR, __file__, 1, message, (), None)
    if fields is not None:
        r.fields = fields
    if exc is not None:
        try:
            raise exc
        except BaseException:
            r.exc_info = sys.exc_info()
    return r


# -- the rule ---------------------------------------------------------------

@pytest.mark.parametrize("token", ["a", "tok-123", "A.b_c~d+e/f", "abc==", "x" * backend.MAX_TOKEN_CHARS])
def test_a_bearer_token_of_rfc_6750_characters_within_the_bound_is_accepted(token: str) -> None:
    assert backend.token_problem(token) is None


@pytest.mark.parametrize("token", ["", "a b", "a\nb", 'a"b', "a\\b", "a\u00e9b", "a=b", "=a", "a\tb", "a;b",
                                   "x" * (backend.MAX_TOKEN_CHARS + 1)])
def test_anything_else_is_refused_with_a_reason_that_never_quotes_it(token: str) -> None:
    problem = backend.token_problem(token)
    assert problem is not None and "\n" not in problem
    assert token not in problem or token == ""


@pytest.mark.parametrize("kind", sorted(LEAKY))
def test_a_service_token_that_is_not_a_bearer_token_is_refused_in_one_line_without_its_value(kind: str) -> None:
    token, halves = leaky(kind)
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env({"TCAB_BACKEND_URL": "http://b:1", "TCAB_BACKEND_SERVICE_TOKEN": token,
                           "TCAB_DISPATCHER_DRIVER_IMAGE": "d:1"})
    message = str(e.value)
    assert message.startswith("TCAB_BACKEND_SERVICE_TOKEN: holds a character outside an RFC 6750 bearer token")
    assert "\n" not in message and not any(h in message for h in halves)


# -- the log formatter ------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(LEAKY))
def test_a_held_token_is_redacted_from_the_record_before_json_escapes_it(kind: str) -> None:
    token, halves = leaky(kind)
    logs.hold(token)
    formatter = logs.JsonFormatter()
    header = f"Bearer {token}".encode()
    lines = [
        formatter.format(record(f"sending Authorization: Bearer {token}")),
        formatter.format(record("crashed", fields={"error": repr(ValueError(f"Invalid header value {header!r}")),
                                                   "nested": {"list": [token], token: 1}})),
        formatter.format(record("failed", exc=ValueError(f"Invalid header value {header!r}"))),
    ]
    for line in lines:
        assert not any(h in line for h in halves), line
        assert "[redacted]" in line
        json.loads(line)


def test_the_formatter_s_own_secrets_are_redacted_though_json_would_escape_them() -> None:
    token, halves = leaky("quote")
    line = logs.JsonFormatter(secrets=(token,)).format(record(f"token={token}"))
    assert not any(h in line for h in halves) and json.loads(line)["message"] == "token=[redacted]"


def test_valid_tokens_are_redacted_inside_paths_and_words_and_the_longest_wins() -> None:
    short, long = good(), good()
    logs.hold(short)
    logs.hold(long + short)
    text = logs.redact(f"/jobs/{short}/status x{long}{short}y {short}")
    assert short not in text and long not in text
    assert text == "/jobs/[redacted]/status x[redacted]y [redacted]"


def test_a_text_without_a_held_token_is_left_as_it_is() -> None:
    text = "death reported job=tcab-run-1 outcome=accepted"
    assert logs.redact(text) == text


# -- the death report ---------------------------------------------------------

def test_a_death_report_carries_no_token_from_the_log_tail_the_termination_message_or_the_events() -> None:
    run_token, service_token, other_run = good(), good(), good()
    logs.hold(other_run)  # another run's token this process holds
    # The token straddles the 64 KiB cut: redacted before the cut, so no half of it is kept.
    head = f"driver: auth failed for Bearer {run_token}\n"
    filler = "x" * (reporter.MAX_LOG_CHARS - len(head) + len(run_token) // 2)
    log_tail = f"{head[:-len(run_token) - 1]}{run_token}\n{filler} {other_run} {service_token}\n"
    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"name": "driver", "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": f"urllib3: Invalid header b'Bearer {run_token}'"}}}]}}
    events = [{"involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Leak", "message": f"token {service_token}"}]
    body = reporter.describe(kind="failed", job_name="j", job=None, pod=pod, events=events, log_tail=log_tail,
                             log_error=None, secrets=(run_token, service_token))
    text = json.dumps(body)
    for secret in (run_token, service_token, other_run):
        assert secret not in text
        assert secret[: len(secret) // 2] not in text and secret[len(secret) // 2:] not in text
    assert body["error"]["message"] == "urllib3: Invalid header b'Bearer [redacted]'"
    assert body["error"]["events"][0]["message"] == "token [redacted]"
    assert len(body["error"]["log_tail"]) <= reporter.MAX_LOG_CHARS


@pytest.mark.parametrize("kind", sorted(LEAKY))
def test_a_token_read_back_from_a_secret_that_is_not_a_bearer_token_is_not_used(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    import base64
    token, halves = leaky(kind)
    secret = {"metadata": {"name": "tcab-run-x"}, "data": {"token": base64.b64encode(token.encode()).decode()}}
    with caplog.at_level(logging.ERROR):
        assert reporter.token_from_secret(secret) is None
    assert caplog.records[-1].getMessage() == "the token in the job's Secret is not a bearer token; it is not used"
    line = logs.JsonFormatter().format(caplog.records[-1])
    assert not any(h in line for h in halves)


# -- the backend client, against the real reference backend -------------------

@pytest.fixture
def ref() -> Iterator[proc.Backend]:
    with proc.Backend() as b:
        yield b


def set_token(ref: proc.Backend, run_id: str, token: str) -> None:
    """Make the backend hand out `token` for the run, as a backend that mints a bad one would."""
    db = sqlite3.connect(pathlib.Path(ref.dir.name) / "runs.db", timeout=30)
    try:
        with db:
            db.execute("UPDATE runs SET token = ? WHERE id = ?", (token, run_id))
    finally:
        db.close()


def stored_reports(ref: proc.Backend) -> str:
    db = sqlite3.connect(pathlib.Path(ref.dir.name) / "runs.db", timeout=30)
    try:
        return "\n".join(row[0] for row in db.execute("SELECT body FROM reports"))
    finally:
        db.close()


@pytest.mark.parametrize("kind", sorted(LEAKY))
def test_a_claimed_run_with_a_bad_token_is_refused_and_reported_with_the_service_token_never_its_own(
        ref: proc.Backend, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    token, halves = leaky(kind)
    bad, after = ref.enqueue(), ref.enqueue()
    set_token(ref, bad["id"], token)
    client = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    try:
        with caplog.at_level(logging.ERROR):
            with pytest.raises(backend.TokenRefused) as e:
                client.claim()
        assert client.requests == 2  # the claim, and the refusal (with the service token)
        assert f"run {bad['id']} refused" in str(e.value) and not any(h in str(e.value) for h in halves)
        refusal = [r for r in caplog.records if r.getMessage().startswith("run refused")]
        assert len(refusal) == 1 and refusal[0].fields["job_id"] == bad["id"]  # type: ignore[attr-defined]
        assert not any(h in logs.JsonFormatter().format(r) for r in caplog.records for h in halves)
        # The loop goes on: the next claim is the next run.
        claim = client.claim()
        assert claim is not None and claim.job_id == after["id"] and claim.token == after["token"]
    finally:
        client.close()
    assert not any(h in stored_reports(ref) for h in halves)


@pytest.mark.parametrize("kind", sorted(LEAKY))
def test_a_report_with_a_bad_token_is_refused_unsent(ref: proc.Backend, kind: str) -> None:
    token, _ = leaky(kind)
    run = ref.enqueue()
    client = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    try:
        answer = client.report(job_id=run["id"], token=token, body={"status": "failed"})
        assert answer == backend.Answer(backend.Outcome.REFUSED, 0) and client.requests == 0
    finally:
        client.close()
    assert ref.get(run["id"])["state"] == "pending"


def test_a_report_body_is_scrubbed_of_the_run_s_token_and_the_service_token_before_it_is_sent(
        ref: proc.Backend) -> None:
    run = ref.enqueue()
    client = backend.Backend(url=ref.url, service_token=ref.token, timeout=5)
    try:
        body = {"status": "failed", "error": {"log_tail": f"Bearer {run['token']} svc={ref.token}",
                                              "events": [{"message": run["token"]}]}}
        assert client.report(job_id=run["id"], token=run["token"], body=body).outcome is backend.Outcome.ACCEPTED
    finally:
        client.close()
    stored = stored_reports(ref)
    assert run["token"] not in stored and ref.token not in stored
    assert ref.get(run["id"])["reports"][0]["body"]["error"]["log_tail"] == "Bearer [redacted] svc=[redacted]"
