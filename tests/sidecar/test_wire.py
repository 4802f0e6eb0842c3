"""sidecar.wire against a real TLS server on loopback, which sends exact bytes:
the three ways a response body ends (Content-Length, chunked, the connection
closing), keep-alive across requests, and the checks TLS must make (the CA,
the host name, TLS at all). The certificates come from the harness's
throwaway CA (openssl)."""

from __future__ import annotations

import contextlib
import pathlib
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from devcluster import harness
from sidecar import wire


class Server:
    """Answers each request with the next of RESPONSES (raw bytes) and closes a connection after an
    answer that says `Connection: close`; records each request's head and the connection it came on."""

    def __init__(self, responses: list[bytes], *, context: ssl.SSLContext | None, host: str = "127.0.0.1") -> None:
        self.responses = list(responses)
        self.requests: list[tuple[int, bytes]] = []
        self.listener = socket.create_server((host, 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.context = context
        self.thread = threading.Thread(target=self._serve)

    def _serve(self) -> None:
        connection = 0
        while self.responses and not self.stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except TimeoutError:
                continue
            raw.settimeout(10)
            connection += 1
            if self.context is None:  # plain HTTP: whatever arrives (a TLS hello) gets the answer
                with raw:
                    raw.recv(65536)
                    raw.sendall(self.responses[0])
                continue
            try:
                conn = self.context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                raw.close()  # the client refused the handshake
                continue
            with conn:
                data = b""
                while self.responses:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if b"\r\n\r\n" not in data:
                        break
                    head, data = data.split(b"\r\n\r\n", 1)
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(data) < length:
                        data += conn.recv(65536)
                    data = data[length:]
                    self.requests.append((connection, head))
                    answer = self.responses.pop(0)
                    conn.sendall(answer)
                    if b"connection: close" in answer.lower():
                        break

    @contextlib.contextmanager
    def running(self) -> Iterator[Server]:
        self.thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self.thread.join(timeout=10)
            self.listener.close()
            assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ssl.SSLContext]:
    ca = harness._Pki(tmp_path_factory.mktemp("pki"))
    cert, key = ca.issue("server", subject="/CN=fake-apiserver", server=True)  # for 127.0.0.1 and localhost
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return ca.path("ca.crt"), context


def connect(ca_file: str, port: int, host: str = "127.0.0.1") -> wire.Connection:
    return wire.Connection(host, port, context=wire.tls_context(ca_file), timeout=10)


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), b"".join(e + b"\r\n" for e in extra), body)


def test_content_length_bodies_share_one_keep_alive_connection(pki: tuple[str, ssl.SSLContext]) -> None:
    with Server([ok(b'{"a":1}', b"Retry-After: 3"), ok(b"{}")], context=pki[1]).running() as server:
        conn = connect(pki[0], server.port)
        first = conn.request("GET", "/x", headers={"Accept": "application/json"}, body=None)
        second = conn.request("POST", "/y", headers={}, body=b'{"b":2}')
        conn.close()
    assert (first.status, first.body, first.headers["retry-after"]) == (200, b'{"a":1}', "3")
    assert (second.status, second.body) == (200, b"{}")
    assert [(n, head.split(b"\r\n")[0]) for n, head in server.requests] == [(1, b"GET /x HTTP/1.1"),
                                                                            (1, b"POST /y HTTP/1.1")]
    assert b"Content-Length: 7" in server.requests[1][1]
    assert f"Host: 127.0.0.1:{server.port}".encode() in server.requests[0][1]


def test_a_chunked_body_is_joined(pki: tuple[str, ssl.SSLContext]) -> None:
    chunked = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n9;x=y\r\n:[1,2,3]}\r\n0\r\nT: 1\r\n\r\n"
    with Server([chunked, ok(b"{}")], context=pki[1]).running() as server:
        conn = connect(pki[0], server.port)
        response = conn.request("GET", "/c", headers={}, body=None)
        after = conn.request("GET", "/d", headers={}, body=None)  # the chunked body was read to its end
        conn.close()
    assert (response.status, response.body) == (201, b'{"a":[1,2,3]}')
    assert after.body == b"{}"
    assert [n for n, _ in server.requests] == [1, 1]


def test_a_body_without_length_ends_with_the_connection_and_the_next_request_reconnects(
        pki: tuple[str, ssl.SSLContext]) -> None:
    with Server([b"HTTP/1.1 503 Unavailable\r\nConnection: close\r\n\r\nslow down", ok(b"{}")],
                context=pki[1]).running() as server:
        conn = connect(pki[0], server.port)
        first = conn.request("GET", "/a", headers={}, body=None)
        second = conn.request("GET", "/b", headers={}, body=None)
        conn.close()
    assert (first.status, first.body, second.body) == (503, b"slow down", b"{}")
    assert [n for n, _ in server.requests] == [1, 2]


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 2x0 OK\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort",
                                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n+5\r\n"])
def test_an_unreadable_response_is_a_protocol_error(pki: tuple[str, ssl.SSLContext], answer: bytes) -> None:
    with Server([answer], context=pki[1]).running() as server:
        conn = connect(pki[0], server.port)
        with pytest.raises(wire.ProtocolError):
            conn.request("GET", "/", headers={}, body=None)
        conn.close()


def test_a_server_signed_by_another_ca_is_refused(pki: tuple[str, ssl.SSLContext], tmp_path: pathlib.Path) -> None:
    other = harness._Pki(tmp_path / "other")
    with Server([ok(b"{}")], context=pki[1]).running() as server:
        conn = connect(other.path("ca.crt"), server.port)
        with pytest.raises(wire.TLSError, match="CERTIFICATE_VERIFY_FAILED"):
            conn.request("GET", "/", headers={}, body=None)
    assert server.requests == []


def test_a_server_whose_certificate_names_another_host_is_refused(pki: tuple[str, ssl.SSLContext]) -> None:
    # The certificate is for 127.0.0.1 and localhost; 127.0.0.2 is loopback too.
    with Server([ok(b"{}")], context=pki[1], host="127.0.0.2").running() as server:
        conn = connect(pki[0], server.port, host="127.0.0.2")
        with pytest.raises(wire.TLSError, match="IP address mismatch"):
            conn.request("GET", "/", headers={}, body=None)
    assert server.requests == []
    with Server([ok(b"{}")], context=pki[1]).running() as server:  # and the name it does hold is accepted
        conn = connect(pki[0], server.port, host="localhost")
        assert conn.request("GET", "/", headers={}, body=None).body == b"{}"
        conn.close()


def test_a_plain_http_server_is_refused(pki: tuple[str, ssl.SSLContext]) -> None:
    with Server([ok(b"{}")], context=None).running() as server:
        conn = connect(pki[0], server.port)
        with pytest.raises(wire.TLSError, match="WRONG_VERSION_NUMBER"):
            conn.request("GET", "/", headers={}, body=None)


def test_a_file_that_is_not_a_ca_bundle_is_a_tls_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    with pytest.raises(wire.TLSError):
        wire.tls_context(str(tmp_path / "ca.crt"))
    with pytest.raises(FileNotFoundError):
        wire.tls_context(str(tmp_path / "missing.crt"))
