"""The sidecar as a process, without an apiserver: signals, bad settings, and
a port that refuses connections (a real closed port, not a mock)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from devcluster import harness

REPO = pathlib.Path(__file__).resolve().parents[2]


def closed_port() -> int:
    # A port below the ephemeral range, so no outgoing connection takes it meanwhile.
    return harness.free_port()


def start(tmp_path: pathlib.Path, **env: str) -> subprocess.Popen[str]:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "name").write_text("p")
    (podinfo / "namespace").write_text("ns")
    (podinfo / "labels").write_text('jobset.sigs.k8s.io/jobset-name="tj"')
    (podinfo / "annotations").write_text('dispatch.phpboyscout.uk/admission="1"')
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    full = {"PATH": os.environ["PATH"], "DISPATCH_SIDECAR_PODINFO_DIR": str(podinfo),
            "DISPATCH_SIDECAR_API_SERVER": f"https://127.0.0.1:{closed_port()}",
            "DISPATCH_SIDECAR_TOKEN_FILE": str(tmp_path / "token"),
            "DISPATCH_SIDECAR_CA_FILE": "/etc/ssl/certs/ca-certificates.crt", **env}
    return subprocess.Popen([sys.executable, "-m", "sidecar"], cwd=REPO, env=full, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def read_until(proc: subprocess.Popen[str], msg: str) -> list[dict[str, object]]:
    assert proc.stderr is not None
    lines = []
    while True:
        raw = proc.stderr.readline()
        assert raw, f"ended before {msg!r}: {lines}"
        lines.append(json.loads(raw))
        if lines[-1]["message"] == msg:
            return lines


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


# A backoff of at least 300 s (the first delay is half the base or more: toolkit.backoff), and a
# bound of PROMPT on the answer to a signal: far above the fraction of a second it takes on a busy
# machine, far below the 150 s a sidecar that finished its backoff first would take.
SLOW_BACKOFF = {"DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS": "300", "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS": "600"}
PROMPT = 60.0


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_exits_0_promptly_while_backing_off(tmp_path: pathlib.Path, signo: int) -> None:
    proc = start(tmp_path, **SLOW_BACKOFF)
    try:
        failed = read_until(proc, "check failed")[-1]
        assert "Connection refused" in str(failed["error"])
        proc.send_signal(signo)
        assert proc.wait(timeout=PROMPT) == 0
        assert proc.stderr is not None
        last = json.loads(proc.stderr.read().splitlines()[-1])
        assert (last["message"], last["reason"]) == ("stop", signal.Signals(signo).name)
    finally:
        stop(proc)


def test_sighup_rechecks_at_once(tmp_path: pathlib.Path) -> None:
    proc = start(tmp_path, **SLOW_BACKOFF)
    try:
        read_until(proc, "check failed")
        sent = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        lines = read_until(proc, "check failed")
        assert time.monotonic() - sent < PROMPT
        assert [line["message"] for line in lines] == ["re-check on SIGHUP", "request", "check failed"]
        assert lines[1]["n"] == 2
    finally:
        stop(proc)


def test_a_malformed_downward_api_file_is_logged_and_retried(tmp_path: pathlib.Path) -> None:
    proc = start(tmp_path, DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS="0.05", DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS="0.1")
    try:
        (tmp_path / "podinfo" / "annotations").write_text("dispatch.phpboyscout.uk/admission=3")
        lines = read_until(proc, "check failed")
        while "pod info" not in str(lines[-1]["error"]):
            lines = read_until(proc, "check failed")
        assert "annotations line 1" in str(lines[-1]["error"])
        assert proc.poll() is None
    finally:
        stop(proc)


def test_bad_settings_exit_2_with_one_line(tmp_path: pathlib.Path) -> None:
    proc = start(tmp_path, DISPATCH_SIDECAR_INTERVAL_SECONDS="soon")
    try:
        assert proc.wait(timeout=10) == 2
        assert proc.stderr is not None
        assert proc.stderr.read().splitlines() == [
            "dispatch-sidecar: DISPATCH_SIDECAR_INTERVAL_SECONDS='soon': expected a number of seconds from 0.01 to 86400"]
    finally:
        stop(proc)


def test_imports_stay_standard_library_only() -> None:
    # The sidecar pays for every import in every pod: no kubernetes client, no
    # YAML, no logging package, and of the toolkit only names, detect and the
    # standard-library core the three processes share (paths, backoff,
    # jsonlog, envparse, envtable; so toolkit/__init__.py must stay import-free).
    code = ("import sys, sidecar.main; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'toolkit', 'kubernetes', 'yaml', 'urllib3', 'click', 'docker', 'typing', 'logging'}))")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ("['toolkit', 'toolkit.backoff', 'toolkit.detect', 'toolkit.envparse', "
                                   "'toolkit.envtable', 'toolkit.jsonlog', 'toolkit.names', 'toolkit.paths']")
