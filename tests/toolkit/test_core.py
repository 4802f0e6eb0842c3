"""The core the three processes share (toolkit.paths, .backoff, .jsonlog,
.envparse, .envtable): the backoff schedule and Retry-After, one log record written by
the sidecar, the controller and the dispatcher alike, resource paths, and the
value parsers under each process's settings."""

from __future__ import annotations

import email.utils
import io
import json
import logging
import random
import re
import pathlib
import subprocess
import sys

import pytest

from controller import app
from controller import settings as controller_settings
from dispatcher import logs
from dispatcher import settings as dispatcher_settings
from sidecar import report
from toolkit import backoff, envparse, envtable, jsonlog, paths

REPO = pathlib.Path(__file__).resolve().parents[2]

# -- backoff ----------------------------------------------------------------


@pytest.mark.parametrize(("failures", "fraction", "retry_after", "seconds"), [
    (1, 0.0, None, 0.5),
    (1, 0.999, None, 0.9995),
    (2, 0.0, None, 1.0),
    (4, 0.0, None, 4.0),
    (7, 0.0, None, 30.0),     # capped at 60, lower half
    (100, 0.0, None, 30.0),   # no overflow
    (1, 0.0, 20.0, 20.0),     # Retry-After wins when longer
    (1, 0.5, 20.0, 25.0),     # ... jittered upwards, never below it
    (1, 0.999, 20.0, 29.99),  # ... by less than half
    (5, 0.0, 1.0, 8.0),       # the backoff wins when longer
    (1, 0.0, 500.0, 60.0),    # Retry-After is capped too
    (1, 0.999, 50.0, 60.0),   # ... with its jitter
])
def test_the_sidecar_s_backoff_schedule(failures: int, fraction: float, retry_after: float | None,
                                         seconds: float) -> None:
    got = backoff.delay(failures, base=1.0, cap=60.0, retry_after=retry_after, fraction=fraction)
    assert got == pytest.approx(seconds)


def test_a_backoff_grows_to_its_cap_in_the_upper_half_and_starts_over_on_reset() -> None:
    pause = backoff.Backoff(base=0.2, cap=30.0, rng=random.Random(7))
    ceilings = [min(30.0, 0.2 * 2**n) for n in range(12)]
    delays = [pause.next_delay() for _ in ceilings]
    assert all(c / 2 <= d <= c for c, d in zip(ceilings, delays)), delays
    assert len(set(delays)) == len(delays)  # jittered: no two alike
    pause.reset()
    assert 0.1 <= pause.next_delay() <= 0.2


def test_a_retry_after_above_the_backoff_cap_holds_up_to_its_own_cap() -> None:
    pause = backoff.Backoff(base=0.05, cap=2.0, retry_cap=10.0, rng=random.Random(1))
    assert 7.0 <= pause.next_delay(retry_after=7.0) <= 10.0
    assert pause.next_delay(retry_after=60.0) == 10.0


def test_retry_after_reads_seconds_and_http_dates_and_ignores_garbage() -> None:
    now = 1_900_000_000.0
    assert backoff.retry_after("7", limit=600, now=now) == 7
    assert backoff.retry_after(" 7 ", limit=600, now=now) == 7
    assert backoff.retry_after(email.utils.formatdate(now + 30, usegmt=True), limit=600, now=now) == 30
    assert backoff.retry_after(email.utils.formatdate(now - 30, usegmt=True), limit=600, now=now) == 0
    assert backoff.retry_after("999999", limit=600, now=now) == 600
    for garbage in (None, "", "soon", "-5", "1.5e9", "Wed, 99 Foo 2030", "\u00b2"):
        assert backoff.retry_after(garbage, limit=600, now=now) is None


# -- the log record -----------------------------------------------------------

SCHEMA = ["time", "level", "component", "message"]
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _log_record(message: str, *, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = logging.LogRecord("test", logging.WARNING, __file__, 1, message, None, exc_info)
    record.__dict__.update(extra)
    return record


def test_the_three_processes_write_one_record() -> None:
    err = io.StringIO()
    stderr, sys.stderr = sys.stderr, err
    try:
        report.log("verdict", level="warning", pod="p", rules=["below-floor"])
    finally:
        sys.stderr = stderr
    sidecar = json.loads(err.getvalue())
    controller = json.loads(app.JsonFormatter().format(_log_record("check ready", workload="ns/w")))
    dispatcher = json.loads(logs.JsonFormatter().format(_log_record("created", fields={"job": "j"})))
    for line, component in ((sidecar, "dispatch-sidecar"), (controller, "dispatch-controller"),
                            (dispatcher, "dispatcher")):
        assert list(line)[:4] == SCHEMA, line
        assert TIME.fullmatch(str(line["time"])) and line["level"] == "warning" and line["component"] == component
    assert (sidecar["message"], sidecar["pod"], sidecar["rules"]) == ("verdict", "p", ["below-floor"])
    assert (controller["message"], controller["workload"], controller["logger"]) == ("check ready", "ns/w", "test")
    assert (dispatcher["message"], dispatcher["job"]) == ("created", "j")


def test_a_failure_adds_its_last_line_and_only_the_controller_its_traceback() -> None:
    try:
        raise ValueError("bad\nworse")
    except ValueError as e:
        exc = e
    controller = json.loads(app.JsonFormatter().format(_log_record("reconcile failed", exc=exc)))
    dispatcher = json.loads(logs.JsonFormatter().format(_log_record("reconcile failed", exc=exc)))
    assert controller["error"] == dispatcher["error"] == "worse"
    assert controller["traceback"].startswith("Traceback") and "traceback" not in dispatcher


def test_fields_never_replace_the_schema_and_odd_values_become_text() -> None:
    rec = jsonlog.record(component="c", level="info", message="m", created=0.5,
                         fields={"message": "spoof", "time": "then", "obj": object, "n": 1})
    line = json.loads(jsonlog.line(rec))
    assert (line["time"], line["message"], line["n"]) == ("1970-01-01T00:00:00.500Z", "m", 1)
    assert line["obj"] == str(object)


# -- resource paths -------------------------------------------------------------


def test_paths_of_the_kinds_and_every_segment_quoted() -> None:
    assert paths.TRAINJOB.path(namespace="ns", name="tj") == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/tj"
    assert paths.JOBSET.path(namespace="ns", name="tj") == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets/tj"
    assert paths.EVENT.path(namespace="ns") == "/api/v1/namespaces/ns/events"
    assert paths.WORKLOAD.path(namespace="ns", name="w", sub="status").endswith("/namespaces/ns/workloads/w/status")
    assert paths.ADMISSION_CHECK.path(namespace="ignored", name="c") == "/apis/kueue.x-k8s.io/v1beta2/admissionchecks/c"
    assert paths.TRAINJOB.path(namespace="../x", name="a/b?c") == (
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/..%2Fx/trainjobs/a%2Fb%3Fc")


# -- value parsers ------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [("0", 0), ("65535", 65535), ("007", 7)])
def test_whole_numbers(text: str, want: int) -> None:
    assert envparse.whole(text, low=0, high=65535) == want


@pytest.mark.parametrize("text", ["", " 1", "1 ", "-1", "+1", "1_0", "1.0", "\u00b2", "\u0661"])
def test_what_is_not_a_whole_number(text: str) -> None:
    with pytest.raises(envparse.Malformed):
        envparse.whole(text, low=0, high=10)


def test_a_whole_number_out_of_range_carries_its_value() -> None:
    with pytest.raises(envparse.OutOfRange) as e:
        envparse.whole("11", low=0, high=10)
    assert e.value.value == 11


@pytest.mark.parametrize(("text", "kind"), [("soon", envparse.Malformed), ("nan", envparse.OutOfRange),
                                           ("inf", envparse.OutOfRange), ("0", envparse.OutOfRange),
                                           ("1e9", envparse.OutOfRange)])
def test_what_is_not_a_number_of_seconds_in_range(text: str, kind: type[Exception]) -> None:
    with pytest.raises(kind):
        envparse.seconds(text, low=0.01, high=3600)
    assert envparse.seconds("2.5", low=0.01, high=3600) == 2.5


def test_booleans_and_the_empty_string_as_unset() -> None:
    assert [envparse.boolean(w) for w in ("true", "false")] == [True, False]
    for word in ("1", "yes", "on", "0", "no", "off", "TRUE", " true", "t", ""):
        with pytest.raises(envparse.Malformed):
            envparse.boolean(word)
    assert [envparse.get({"A": "", "B": "x"}, n) for n in ("A", "B", "C")] == [None, "x", None]


BOOLEAN_TEXTS = ["true", "false", "TRUE", "False", " true ", "true\n", "1", "0", "yes", "no", "on", "off", "t", "f",
                 "y", "n", "enable", "truee", "ｔｒｕｅ"]


def _controller_bool(text: str) -> bool | None:
    try:
        return bool(envtable.parse(controller_settings.BY_FIELD["leader_elect"], text, source="X"))
    except controller_settings.SettingsError:
        return None


def _dispatcher_bool(text: str) -> bool | None:
    env = {"TCAB_BACKEND_URL": "http://b", "TCAB_BACKEND_SERVICE_TOKEN": "t", "TCAB_DISPATCHER_DRIVER_IMAGE": "d",
           "TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT": text}
    try:
        return dispatcher_settings.from_env(env).driver_run_as_non_root
    except dispatcher_settings.SettingsError:
        return None


@pytest.mark.parametrize("text", BOOLEAN_TEXTS)
def test_the_controller_and_the_dispatcher_read_a_boolean_setting_alike_true_or_false_only(text: str) -> None:
    """The one rule: `true` or `false`, any case, blanks around ignored; nothing else (1/0, yes/no, on/off
    are refused, so a value meant for another reader is never taken for one of ours)."""
    word = text.strip().lower()
    expected = {"true": True, "false": False}.get(word) if word.isascii() else None
    assert (_controller_bool(text), _dispatcher_bool(text)) == (expected, expected)


def test_the_core_imports_only_the_standard_library() -> None:
    code = ("import sys; import toolkit.paths, toolkit.backoff, toolkit.jsonlog, toolkit.envparse, toolkit.envtable; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'toolkit', 'typing', 'logging'}))")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ("['toolkit', 'toolkit.backoff', 'toolkit.envparse', 'toolkit.envtable', "
                                   "'toolkit.jsonlog', 'toolkit.names', 'toolkit.paths']")
