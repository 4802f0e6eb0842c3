"""The sidecar process against a server that answers 503 or 429 with
Retry-After, then succeeds: it logs the failure, waits at least Retry-After,
retries, reaches its verdict, and keeps running.

The server is a real HTTPS server on loopback (the standard library's
http.server, its certificate issued by the harness's throwaway CA), not a mock
of the client: the sidecar's own HTTP and TLS code (sidecar.wire) talks to it. It
answers only what a check asks (GET TrainJob, POST Event) and records when each
request arrived, so the wait is measured on the server's side.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import pathlib
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import harness
from tests.lint import test_layers
from toolkit import names

REPO = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "ns"
TRAINJOB = "tj"
RECORDED = "11111111-2222-3333-4444-555555555555"
RETRY_AFTER = 1
TRAINJOB_PATH = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/{TRAINJOB}"
EVENTS_PATH = f"/api/v1/namespaces/{NAMESPACE}/events"


class Server(http.server.ThreadingHTTPServer):
    """Fails the first `failures[method]` requests of each method with
    `status` and Retry-After, then answers as the apiserver would."""

    daemon_threads = False  # server_close() joins every connection's thread: none outlives the test

    def __init__(self, port: int, *, floor: str, failures: dict[str, int], status: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.floor = floor
        self.failures = dict(failures)
        self.status = status
        self.seen: list[tuple[str, str, int, float]] = []  # method, path, status answered, arrival
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the sidecar uses it within a check
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the test reads the sidecar's log, not the server's

    def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        arrived = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            failing = self.server.failures.get(method, 0) > 0
            if failing:
                self.server.failures[method] -= 1
            status = self.server.status if failing else {"GET": 200, "POST": 201}[method]
            if (method, self.path) not in (("GET", TRAINJOB_PATH), ("POST", EVENTS_PATH)):
                status = 404
            self.server.seen.append((method, self.path, status, arrived))
            if status == 201:
                self.server.events.append(json.loads(body))
        if failing and status != 404:
            self._answer(status, {"kind": "Status", "status": "Failure", "code": status,
                                  "message": f"try again in {RETRY_AFTER}s"},
                         {"Retry-After": str(RETRY_AFTER)})
        elif status == 200:
            self._answer(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                               "metadata": {"name": TRAINJOB, "namespace": NAMESPACE, "uid": "tj-uid",
                                            "annotations": {names.FLOOR_ANNOTATION: self.server.floor,
                                                            names.JOBSET_UID_ANNOTATION: RECORDED}}})
        elif status == 201:
            self._answer(201, json.loads(body))
        else:
            self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> tuple[str, ssl.SSLContext]:
    """(CA file for the sidecar, the server's TLS context) from the harness's CA helper."""
    ca = harness._Pki(tmp_path / "pki")
    cert, key = ca.issue("server", subject="/CN=fake-apiserver", server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return ca.path("ca.crt"), context


@contextlib.contextmanager
def serve(pki: tuple[str, ssl.SSLContext], **kwargs: Any) -> Iterator[Server]:
    server = Server(harness.free_port(), **kwargs)
    server.socket = pki[1].wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def sidecar(tmp_path: pathlib.Path, ca_file: str, port: int, *, admission: str, flags: tuple[str, ...] = (),
            **extra_env: str) -> subprocess.Popen[str]:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "name").write_text("tj-node-0-0-abcde")
    (podinfo / "namespace").write_text(NAMESPACE)
    (podinfo / "labels").write_text(f'{names.JOBSET_NAME_LABEL}="{TRAINJOB}"\n{names.JOBSET_UID_LABEL}="{RECORDED}"\n'
                                    f'{names.RESTART_LABEL}="0"')
    (podinfo / "annotations").write_text(f'{names.ADMISSION_ANNOTATION}="{admission}"')
    (tmp_path / "token").write_text("t")
    env = {"PATH": "/usr/bin:/bin", "DISPATCH_SIDECAR_PODINFO_DIR": str(podinfo),
           "DISPATCH_SIDECAR_API_SERVER": f"https://127.0.0.1:{port}",
           "DISPATCH_SIDECAR_TOKEN_FILE": str(tmp_path / "token"), "DISPATCH_SIDECAR_CA_FILE": ca_file,
           # A backoff far below Retry-After, so only Retry-After can explain the wait.
           "DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS": "0.05", "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS": "10",
           "DISPATCH_SIDECAR_INTERVAL_SECONDS": "0.2", **extra_env}
    return subprocess.Popen([sys.executable, "-S", *flags, "-m", "sidecar"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def read_until(proc: subprocess.Popen[str], msg: str, *, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """Every line up to the `count`-th line with this msg."""
    assert proc.stderr is not None
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while sum(1 for line in lines if line["message"] == msg) < count:
        assert time.monotonic() < deadline, f"no {count} x {msg!r} in {lines}"
        raw = proc.stderr.readline()
        assert raw, f"the sidecar ended ({proc.wait()}) before {count} x {msg!r}: {lines}"
        lines.append(json.loads(raw))
    return lines


def terminate(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """SIGTERM; it must exit 0 promptly. Returns the remaining lines."""
    assert proc.stderr is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    return [json.loads(raw) for raw in proc.stderr.read().splitlines()]


def cleanup(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


@pytest.mark.parametrize("status", [503, 429])
def test_a_transient_answer_is_logged_and_retried_after_retry_after(
        tmp_path: pathlib.Path, pki: tuple[str, ssl.SSLContext], status: int) -> None:
    with serve(pki, floor="1", failures={"GET": 1}, status=status) as server:
        proc = sidecar(tmp_path, pki[0], server.server_address[1], admission="1")
        try:
            lines = read_until(proc, "verdict", count=2)
            assert proc.poll() is None, "the sidecar must keep running after a transient failure"
            lines_after = terminate(proc)
        finally:
            cleanup(proc)

    failed = [line for line in lines if line["message"] == "check failed"]
    assert len(failed) == 1, lines
    assert f"{status} GET {TRAINJOB_PATH}: try again in {RETRY_AFTER}s" in failed[0]["error"]
    assert RETRY_AFTER <= failed[0]["retry_in_seconds"] < RETRY_AFTER * 1.5
    requests = [line for line in lines if line["message"] == "request"]
    assert [r["status"] for r in requests[:2]] == [status, 200]
    # Measured where it counts: when the retry reached the server.
    (first, _, answered, at), (second, _, _, again) = server.seen[:2]
    assert (first, second, answered) == ("GET", "GET", status)
    # The wait has a lower bound only: the delay chosen is checked above, exactly, from the log
    # (`retry_in_seconds`); how long after it the retry lands depends on the machine's load.
    assert again - at >= RETRY_AFTER
    verdicts = [line for line in lines if line["message"] == "verdict"]
    assert [v["verdict"] for v in verdicts] == ["ok", "ok"]
    assert (lines_after[-1]["message"], lines_after[-1]["reason"]) == ("stop", "SIGTERM")


def test_a_failed_event_post_is_retried_and_the_event_sent_once(
        tmp_path: pathlib.Path, pki: tuple[str, ssl.SSLContext]) -> None:
    with serve(pki, floor="3", failures={"POST": 1}, status=503) as server:
        proc = sidecar(tmp_path, pki[0], server.server_address[1], admission="2")
        try:
            lines = read_until(proc, "verdict", count=2)
            assert proc.poll() is None
            terminate(proc)
        finally:
            cleanup(proc)

    # GET, POST (503), wait, GET, POST (201); then the next check only reads.
    assert [(m, s) for m, _, s, _ in server.seen[:5]] == [
        ("GET", 200), ("POST", 503), ("GET", 200), ("POST", 201), ("GET", 200)]
    assert server.seen[2][3] - server.seen[1][3] >= RETRY_AFTER
    (event,) = server.events
    assert event["reason"] == names.SIDECAR_VIOLATION_REASON
    assert event["message"].startswith("below-floor: ")
    verdicts = [line for line in lines if line["message"] == "verdict"]
    assert [(v["verdict"], v["events"]) for v in verdicts] == [("violation", 1), ("violation", 0)]
    assert [line["message"] for line in lines].count("check failed") == 1


def test_every_module_a_check_imports_is_in_the_image(tmp_path: pathlib.Path, pki: tuple[str, ssl.SSLContext]) -> None:
    # The image carries only the import closure of mkroot.ROOTS["sidecar"] (images/mkroot.py). A whole
    # check, through a 503 with Retry-After, a connection, a violation and its Event POST, and the
    # file the startupProbe waits for, run with -X importtime, lists every module the sidecar loads,
    # a lazy import included: each must be in it.
    spec = importlib.util.spec_from_file_location("mkroot", REPO / "images" / "mkroot.py")
    assert spec is not None and spec.loader is not None
    mkroot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mkroot)
    with serve(pki, floor="3", failures={"GET": 1}, status=503) as server:
        proc = sidecar(tmp_path, pki[0], server.server_address[1], admission="2", flags=("-X", "importtime"),
                       DISPATCH_SIDECAR_MAX_CHECKS="1", DISPATCH_SIDECAR_STARTED_FILE=str(tmp_path / "started"))
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            cleanup(proc)
    assert proc.returncode == 0, err
    timed = [line for line in err.splitlines() if line.startswith("import time:")]
    logged = [json.loads(line) for line in err.splitlines() if not line.startswith("import time:")]
    assert [(v["verdict"], v["events"]) for v in logged if v["message"] == "verdict"] == [("violation", 1)]
    assert [line["message"] for line in logged].count("check failed") == 1
    assert (tmp_path / "started").read_text() == "1\n"  # what the startupProbe waits for
    imported = {line.rsplit("|", 1)[1].strip() for line in timed[1:]}  # the first line is the header
    assert {"sidecar.wire", "json"} <= imported
    # Of the toolkit, the core alone (docs/architecture.md): nothing of the identity domain, the
    # Kubernetes client or the operations is loaded by a whole check.
    toolkit = {m for m in imported if m.split(".")[0] == "toolkit"}
    assert {"toolkit.names", "toolkit.detect"} <= toolkit
    assert sorted(m for m in toolkit if test_layers.layer_of(m) != "core") == []
    missing = imported - set(mkroot.closure(REPO)) - {"sidecar.__main__"}
    # An import that fails by design is listed too (copy.py tries org.python.core, Jython's): only a
    # module that exists can be missing from the image.
    assert {name for name in missing if exists(name)} == set()


def exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
