"""The probes' and /metrics' ports under clients that hold, trickle, flood and guess: the real
servers on loopback (controller.health, controller.connlimit), and the controller as a real process
on the real apiserver for the review budget (controller.review_budget through /metrics)."""

from __future__ import annotations

import http.client
import pathlib
import secrets
import socket
import time
from collections.abc import Iterator

import pytest

from controller import health, settings
from devcluster import metrics
from tests.controller.conftest import ControllerProcess, run_controller_once

LIMIT = 4
SECONDS = 2


@pytest.fixture
def probes() -> Iterator[health.HealthServer]:
    server = health.HealthServer(host="127.0.0.1", port=0, max_connections=LIMIT, connection_seconds=SECONDS)
    server.live.set()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _get(port: int, path: str = "/healthz") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def _closed_by_server(sock: socket.socket, *, within: float) -> float:
    """Seconds until the server closed SOCK (a read returns the end or a reset)."""
    start = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(1024):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_a_probe_gets_through_a_port_full_of_idle_connections(probes: health.HealthServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", probes.port), timeout=5) for _ in range(5 * LIMIT)]
    try:
        for _ in range(3):
            assert _get(probes.port) == 200
        assert len(probes.server.gate) <= LIMIT
        # The oldest idle ones were closed to make room, the first of all among them.
        assert _closed_by_server(idle[0], within=1) < 1
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_is_closed_at_its_deadline_even_while_it_trickles(probes: health.HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", probes.port), timeout=5) as silent, \
            socket.create_connection(("127.0.0.1", probes.port), timeout=5) as trickling:
        start = time.monotonic()
        trickling.sendall(b"GET /healthz HTTP/1.0\r\n")
        try:
            while time.monotonic() - start < SECONDS + 3:
                trickling.sendall(b"X-A: b\r\n")  # a header line every half second: never the end
                time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert time.monotonic() - start < SECONDS + 2
        assert _closed_by_server(silent, within=SECONDS + 2) < SECONDS + 2


def test_a_request_beyond_its_byte_cap_is_not_read_on(probes: health.HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", probes.port), timeout=5) as flood:
        flood.sendall(b"GET /healthz HTTP/1.0\r\n")
        sent = 0
        try:
            while sent < 1 << 20:
                flood.sendall(b"X-Flood: " + b"a" * 1000 + b"\r\n")
                sent += 1011
        except (BrokenPipeError, ConnectionResetError):
            pass
        # The headers read as ended at the cap: answered (or cut) without reading the megabyte.
        assert _closed_by_server(flood, within=SECONDS + 2) < SECONDS + 2
    assert _get(probes.port) == 200


@pytest.mark.cluster
def test_random_tokens_beyond_the_review_budget_get_429_and_a_known_scraper_still_200(
        namespace: str, start_controller) -> None:
    ctl: ControllerProcess = start_controller(extra=["--token-reviews-per-minute", "6"])  # a burst of one
    assert ctl.get("/metrics")[0] == 200  # the scraper's token, reviewed within the budget
    answers = [metrics.scrape(ctl.metrics_port, token=secrets.token_urlsafe(32))[0]  # type: ignore[arg-type]
               for _ in range(5)]
    assert answers == [429] * 5
    status, body = metrics.scrape(ctl.metrics_port, token="made-up")  # type: ignore[arg-type]
    assert (status, body) == (429, "Too Many Requests\n")
    assert ctl.get("/metrics")[0] == 200  # its decision is kept apart from the made-up ones


@pytest.mark.cluster
def test_a_scrape_and_a_probe_get_through_ports_full_of_idle_connections(namespace: str, start_controller) -> None:
    ctl: ControllerProcess = start_controller(extra=["--max-connections", str(LIMIT),
                                                     "--connection-seconds", str(SECONDS)])
    assert ctl.get("/metrics")[0] == 200  # its decision kept: what follows tests the port, not the review
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5)
            for port in (ctl.metrics_port, ctl.port) for _ in range(5 * LIMIT)]  # TLS never begun; no request
    try:
        assert ctl.get("/metrics")[0] == 200
        assert ctl.get("/healthz") == (200, "ok\n")
        # A TLS connection closed to make room: its handshake ends there.
        assert _closed_by_server(idle[0], within=1) < 1
        # The newest idle ones are closed at their deadline.
        assert _closed_by_server(idle[-1], within=SECONDS + 2) < SECONDS + 2
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize(("given", "line"), [
    (["--max-connections", "3"], "Error: --max-connections=3: expected a whole number from 4 to 4096"),
    (["--connection-seconds", "0"], "Error: --connection-seconds=0: expected a whole number from 1 to 300"),
    (["--token-reviews-per-minute", "60001"],
     "Error: --token-reviews-per-minute=60001: expected a whole number from 1 to 60000"),
])
def test_a_bound_outside_its_range_is_refused_in_one_line(tmp_path: pathlib.Path, given: list[str],
                                                          line: str) -> None:
    done = run_controller_once(tmp_path, *given)
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", [line])


def test_a_bound_from_the_environment_is_refused_naming_the_variable() -> None:
    with pytest.raises(settings.SettingsError, match="^DISPATCH_CONTROLLER_CONNECTION_SECONDS=301: "
                                                     "expected a whole number from 1 to 300$"):
        settings.Settings.from_env({"DISPATCH_CONTROLLER_CONNECTION_SECONDS": "301"})
