"""The reference backend's fault hook: what the dispatcher's fault tests stand on."""

from __future__ import annotations

import socket
import struct
import time
import urllib.error
import urllib.request

import pytest

from tests.refbackend import proc


def test_a_fault_answers_the_next_n_requests_of_its_endpoint_then_the_real_answers_return() -> None:
    with proc.Backend() as backend:
        run = backend.enqueue()
        backend.fault(status=429, count=2, on="next", retry_after="7")
        request = urllib.request.Request(backend.url + "/jobs/next", data=b"", method="POST",
                                         headers={"Authorization": f"Bearer {backend.token}"})
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(request, timeout=10)
            assert (e.value.code, e.value.headers["Retry-After"]) == (429, "7")
            e.value.close()
        assert backend.faults()["faults"] == []
        assert backend.call("POST", "/jobs/next")[1]["id"] == run["id"]
        # A fault on claims leaves status reports alone.
        backend.fault(status=503, on="next")
        assert backend.call("POST", f"/jobs/{run['id']}/status", {"status": "running"}, token=run["token"])[0] == 200
        assert backend.faults() == {"faults": [{"count": 1, "status": 503, "on": "next"}],
                                    "hits": {"next": 3, "status": 1}}


def test_a_delayed_request_is_served_after_the_delay() -> None:
    with proc.Backend() as backend:
        run = backend.enqueue()
        backend.fault(delay=0.5, on="next")
        started = time.monotonic()
        code, body = backend.call("POST", "/jobs/next")
        assert (code, body["id"]) == (200, run["id"]) and time.monotonic() - started >= 0.5


@pytest.mark.parametrize("fault", [
    [], "503", {"status": "503"}, {"status": 503, "count": 0}, {"status": 503, "count": True},
    {"status": 99}, {"delay": -1}, {"delay": "1"}, {"status": 503, "on": "jobs"}, {"count": 2},
    {"status": 503, "whatever": 1}, {"status": 429, "retry_after": "1\nX-Evil: 1"},
])
def test_a_malformed_fault_is_400_and_changes_nothing(fault: object) -> None:
    with proc.Backend() as backend:
        code, body = backend.call("POST", "/_faults", fault)
        assert code == 400 and body["error"]
        assert backend.faults() == {"faults": [], "hits": {"next": 0, "status": 0}}
        assert backend.proc.poll() is None


def test_a_client_that_goes_away_mid_request_costs_no_traceback() -> None:
    with proc.Backend() as backend:
        host, port = backend.url.removeprefix("http://").split(":")
        for request in (b"POST /jobs/next HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"a\"",
                        b"GARBAGE\r\n\r\n", b"POST /jobs HTTP/1.1\r\nContent-Length: zz\r\n\r\n"):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(request)
                time.sleep(0.2)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a RST
        time.sleep(0.5)
        assert backend.call("POST", "/jobs/next")[0] == 204  # still serving
        assert "Traceback" not in backend.stderr(), backend.stderr()


def test_the_fault_hooks_are_refused_unless_the_server_was_started_with_faults() -> None:
    with proc.Backend(faults=False) as backend:
        run = backend.enqueue()
        for method, body in (("POST", {"status": 503, "on": "next"}), ("GET", None)):
            code, answer = backend.call(method, "/_faults", body)
            assert (code, answer) == (404, {"error": "the fault hooks are off (start the server with --faults)"})
        # Nothing was injected: the claim is served for real.
        assert backend.call("POST", "/jobs/next")[1]["id"] == run["id"]
