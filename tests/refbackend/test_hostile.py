"""Malformed and hostile requests: each gets a JSON 4xx (never a 5xx, a dropped connection or a
traceback), is refused before the body is read where it can be, and changes nothing."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from tests.refbackend import proc

MAX_BODY = 1024 * 1024  # refbackend.server.MAX_BODY, stated in its docs


def request(method: str, path: str, *, token: str | None, body: bytes | None = None,
            length: str | None = "auto", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    if length == "auto":
        length = None if body is None else str(len(body))
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return head.encode("latin-1") + extra.encode("latin-1") + b"\r\n" + (body or b"")


def refused(backend: proc.Backend, raw: bytes, code: int) -> dict[str, Any]:
    """Send it; assert the status, a JSON error, and an unchanged database."""
    before = backend.dump()
    status, headers, body = backend.raw(raw)
    assert status == code, (status, body)
    answer = json.loads(body)
    assert isinstance(answer["error"], str) and answer["error"], answer
    assert headers["content-type"] == "application/json"
    assert backend.dump() == before
    return dict(answer)


@pytest.fixture(scope="module")
def backend() -> Any:
    with proc.Backend(faults=False, extra_args=("--timeout", "1")) as b:
        b.enqueue(id="existing")
        yield b
        assert "Traceback" not in b.stderr(), b.stderr()


# --- the body's size, before anything is read ---------------------------------------------------------------

def test_a_body_over_the_limit_is_413_before_it_is_read(backend: proc.Backend) -> None:
    # Only the headers are sent. A server that tried to read 1 MiB + 1 would wait for the body until
    # its socket timeout and answer 408 (the test below), so the 413 itself shows the body was never
    # waited for: no clock is needed.
    raw = request("POST", "/jobs", token=backend.token, length=str(MAX_BODY + 1))
    with socket.create_connection(backend.address, timeout=60) as s:
        s.sendall(raw)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"1048576" in answer  # the error states the bound


def test_a_body_at_the_limit_is_read(backend: proc.Backend) -> None:
    body = json.dumps({"harness": "big", "launch_request": "x" * (MAX_BODY - 60)}).encode()
    body += b" " * (MAX_BODY - len(body))
    status, _, answer = backend.raw(request("POST", "/jobs", token=backend.token, body=body))
    assert status == 201, answer


@pytest.mark.parametrize("length, code", [(None, 411), ("-1", 400), ("zz", 400), ("1e3", 400), ("+5", 400),
                                          (" ", 400), ("99999999999999999999999", 413)])
def test_a_missing_or_malformed_content_length_on_a_post_is_refused(backend: proc.Backend, length: str | None,
                                                                     code: int) -> None:
    refused(backend, request("POST", "/jobs", token=backend.token, body=b'{"harness": "h"}', length=length), code)


def test_a_chunked_body_is_refused(backend: proc.Backend) -> None:
    raw = request("POST", "/jobs", token=backend.token, length=None, extra="Transfer-Encoding: chunked\r\n")
    refused(backend, raw + b"10\r\n{\"harness\": \"h\"}\r\n0\r\n\r\n", 411)


def test_a_body_shorter_than_its_content_length_is_400_not_half_a_request(backend: proc.Backend) -> None:
    refused(backend, request("POST", "/jobs", token=backend.token, body=b'{"harness": "h"}', length="40"), 400)


# The server's socket timeout is 1 s (the fixture); the client waits up to CUT_OFF_BOUND for the cut-off, far
# above the 1 s expected on a busy machine, and far below "never": a server that kept the connection
# open would leave the client's recv to time out, which fails the test.
CUT_OFF_BOUND = 60.0


def test_a_client_that_stops_sending_is_cut_off_after_the_socket_timeout(backend: proc.Backend) -> None:
    with socket.create_connection(backend.address, timeout=CUT_OFF_BOUND) as s:
        s.sendall(request("POST", "/jobs", token=backend.token, length="100") + b'{"harn')
        answer = s.recv(65536)
        assert b"HTTP/1.1 408 " in answer or answer == b"", answer
    with socket.create_connection(backend.address, timeout=CUT_OFF_BOUND) as s:
        s.sendall(b"POST /jobs HTTP/1.1\r\n")  # not even the headers
        while s.recv(65536):
            pass


# --- authentication first ----------------------------------------------------------------------------------

def test_the_token_is_checked_before_the_body_is_read(backend: proc.Backend) -> None:
    # A stranger's 1 MiB is never read: the 401 comes while the body is still being sent.
    for method, path in (("POST", "/jobs"), ("POST", "/jobs/next"), ("PUT", "/harnesses/h"),
                         ("POST", "/jobs/existing/status")):
        raw = request(method, path, token="wrong", length=str(MAX_BODY))
        with socket.create_connection(backend.address, timeout=10) as s:
            s.sendall(raw)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 401 "), (path, answer)


@pytest.mark.parametrize("token", ["é", "tok\u00ff", "\u00e9" * 40])
def test_a_non_ascii_bearer_token_is_401(backend: proc.Backend, token: str) -> None:
    refused(backend, request("POST", "/jobs/next", token=token, body=b""), 401)
    refused(backend, request("POST", "/jobs/existing/status", token=token, body=b'{"status": "failed"}'), 401)
    refused(backend, request("GET", "/jobs/existing", token=token), 401)


def test_a_wrong_token_learns_nothing_about_which_run_ids_exist(backend: proc.Backend) -> None:
    body = b'{"status": "failed"}'
    known = refused(backend, request("POST", "/jobs/existing/status", token="guess", body=body), 401)
    unknown = refused(backend, request("POST", "/jobs/never-was/status", token="guess", body=body), 401)
    assert known == unknown
    # A real credential (a run's own token) still hears 404 for an id that does not exist.
    run = backend.enqueue()
    status, _, answer = backend.raw(request("POST", "/jobs/never-was/status", token=run["token"], body=body))
    assert status == 404, answer


# --- the body's content ------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, field", [
    (b"[" * 100000 + b"]" * 100000, "nested"),
    (b'{"harness": "h", "launch_request": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}", "nested"),
    (b'{"harness": "h", "launch_request": {"x": NaN}}', "finite"),
    (b'{"harness": "h", "launch_request": {"x": -Infinity}}', "finite"),
    (b'{"harness": "h", "launch_request": {"x": 1e999}}', "finite"),
    (b'{"harness": "h", "launch_request": {"x": ' + b"9" * 5000 + b"}}", "integer"),
    (b'{"harness": "h\\ud800"}', "surrogate"),
    (b'{"harness": "h", "harness": "g"}', "harness"),
    (b'\xff\xfe{}', "JSON"),
    (b'"just a string"', "object"),
    (b'{"harness": 5}', "harness"),
    (b'{"harness": ""}', "harness"),
    (b'{"harness": "h", "id": 5}', "id"),
    (b'{"harness": "h", "id": ["a"]}', "id"),
    (b'{"harness": "h", "id": ""}', "id"),
    (b'{"harness": "h", "id": {"a": 1}}', "id"),
    (b'{"harness": "h", "id": "a", "id": "b"}', "id"),
    (b'{"harness": "h", "launch_request": {"n": 99999999999999999999999}}', "integer"),
])
def test_a_malformed_enqueue_is_400_naming_what_is_wrong(backend: proc.Backend, body: bytes, field: str) -> None:
    answer = refused(backend, request("POST", "/jobs", token=backend.token, body=body), 400)
    assert field in answer["error"], answer


def test_an_id_that_exists_already_is_409(backend: proc.Backend) -> None:
    answer = refused(backend, request("POST", "/jobs", token=backend.token,
                                      body=b'{"harness": "h", "id": "existing"}'), 409)
    assert "existing" in answer["error"]


@pytest.mark.parametrize("limit", [b"true", b"false", b"1.0", b"0", b"-3", b'"2"', b"null", b"1e999",
                                   b"99999999999999999999", b"10000001"])
def test_max_parallel_must_be_an_integer_in_its_bounds(backend: proc.Backend, limit: bytes) -> None:
    answer = refused(backend, request("PUT", "/harnesses/h", token=backend.token,
                                      body=b'{"max_parallel": ' + limit + b"}"), 400)
    assert "max_parallel" in answer["error"], answer


@pytest.mark.parametrize("body", [b'{"status": "failed", "error": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                  b'{"status": "failed", "exit_code": NaN}', b'{"status": true}', b"[]",
                                  b'{"status": "failed", "status": "running"}'])
def test_a_malformed_status_report_is_400(backend: proc.Backend, body: bytes) -> None:
    run = backend.enqueue()
    refused(backend, request("POST", f"/jobs/{run['id']}/status", token=run["token"], body=body), 400)
    assert backend.get(run["id"])["state"] == "pending"


@pytest.mark.parametrize("raw", [
    b"DELETE /jobs/existing HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"BREW /jobs HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"GET /jobs HTTP/2.0\r\nConnection: close\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
])
def test_an_unknown_method_version_or_oversized_head_is_a_json_4xx(backend: proc.Backend, raw: bytes) -> None:
    before = backend.dump()
    status, headers, body = backend.raw(raw)
    assert 400 <= status < 500, (status, body)
    assert json.loads(body)["error"]
    assert backend.dump() == before


def test_the_server_still_serves_after_all_of_it(backend: proc.Backend) -> None:
    assert backend.call("GET", "/jobs/existing")[0] == 200
    assert backend.proc.poll() is None


def test_a_get_with_a_body_is_answered_and_its_body_never_taken_for_a_second_request(backend: proc.Backend) -> None:
    # Keep-alive, and a "body" that is itself a request: it must not be served.
    smuggled = request("POST", "/jobs", token=backend.token, body=b'{"harness": "smuggled"}')
    raw = (f"GET /jobs/existing HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {backend.token}\r\n"
           f"Content-Length: {len(smuggled)}\r\n\r\n").encode() + smuggled
    before = backend.dump()
    with socket.create_connection(backend.address, timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1 ") == 1, data
    assert b"Connection: close" in data
    assert backend.dump() == before
