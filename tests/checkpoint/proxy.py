"""A small HTTP proxy of the object-store tests, between a client and a real
server on this machine: it forwards every request as it came and, for the
requests a test names, drops the response (the server did the work, the client
never hears of it): a lost response, as a network that fails after the request
arrived makes one. The client's own retry is then what the test watches.

One request per connection: every forwarded request and every response carries
`Connection: close`, so a client opens a new connection for its next request
and no framing of a kept-alive stream has to be parsed. An `Expect:
100-continue` is answered here (and not forwarded) so that a client sends its
body at once. A `Location` naming the server (a GCS resumable session) is
rewritten to the proxy, so the session's requests come through it too. No
header that a signature covers is changed: SigV4 signs neither `Connection`
nor `Expect`.

Every request is also logged with its `Range` header, the start of its body
(a GCS upload names its object there), and the wall-clock times
(time.time(), comparable with another process's on this machine) its head
arrived and its response was sent: what a test reads to count ranged reads and
to order uploads against a training step.

Threads: the accept loop and one per connection, all joined by `close()`.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WAIT = 30.0


def _read_head(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """(the head up to and with the blank line, what was read after it)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the head ended")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _read_exact(sock: socket.socket, buf: bytes, n: int) -> tuple[bytes, bytes]:
    while len(buf) < n:
        chunk = sock.recv(max(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("closed inside a body")
        buf += chunk
    return buf[:n], buf[n:]


def _read_chunked(sock: socket.socket, buf: bytes) -> bytes:
    """A chunked body, raw (sizes, data and the trailer), as it came."""
    out = b""
    while True:
        while b"\r\n" not in buf:
            buf += _more(sock)
        line, _, buf = buf.partition(b"\r\n")
        out += line + b"\r\n"
        size = int(line.split(b";")[0], 16)
        if size == 0:
            while not (buf.startswith(b"\r\n") or b"\r\n\r\n" in buf):
                buf += _more(sock)
            end = 2 if buf.startswith(b"\r\n") else buf.index(b"\r\n\r\n") + 4
            return out + buf[:end]
        data, buf = _read_exact(sock, buf, size + 2)
        out += data


def _more(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("closed inside a chunked body")
    return chunk


def _headers(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], [(k, v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]


def _render(first: str, headers: list[tuple[str, str]]) -> bytes:
    return ("\r\n".join([first] + [f"{k}: {v}" for k, v in headers]) + "\r\n\r\n").encode("latin-1")


@dataclass(frozen=True)
class Logged:
    """One request as it passed: its method, target, Range header (None: not ranged) and the first
    4 KiB of its body, and when its head arrived and its response went back (or was dropped)."""

    method: str
    target: str
    range: str | None
    body: bytes
    started: float
    ended: float


class Proxy:
    """Listens on 127.0.0.1 (an ephemeral port) in front of UPSTREAM ("127.0.0.1:PORT"). DROP
    decides, from a request's method and target, whether its response is lost; each request it
    chose is dropped once (`drops` times in all), the rest are forwarded."""

    def __init__(self, upstream: str, *, drop: Callable[[str, str], bool], drops: int = 1) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.drop, self.drops_left = drop, drops
        self.requests: list[str] = []
        self.log: list[Logged] = []
        self.dropped: list[str] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, name="proxy-accept")
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
                t = threading.Thread(target=self._serve, args=(conn,), name="proxy-conn")
                self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(WAIT)
            head, rest = _read_head(conn, b"")
            started = time.time()
            first, headers = _headers(head)
            fields = {k.lower(): v for k, v in headers}
            if fields.get("expect", "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            if "content-length" in fields:
                body, _ = _read_exact(conn, rest, int(fields["content-length"]))
            elif "chunked" in fields.get("transfer-encoding", "").lower():
                body = _read_chunked(conn, rest)
            else:
                body = b""
            keep = [(k, v) for k, v in headers if k.lower() not in ("connection", "expect")]
            method, target = first.split(" ")[:2]
            with self._lock:
                self.requests.append(f"{method} {target}")
                lose = self.drops_left > 0 and self.drop(method, target)
                if lose:
                    self.drops_left -= 1
                    self.dropped.append(f"{method} {target}")
            with socket.create_connection(self.upstream, timeout=WAIT) as up:
                try:
                    up.sendall(_render(first, keep + [("Connection", "close")]) + body)
                except OSError:
                    pass  # a server may answer (and close) before it read the whole body
                response = b""
                try:
                    while chunk := up.recv(65536):
                        response += chunk
                except OSError:
                    if not response:
                        raise
            if lose:
                self._logged(method, target, fields.get("range"), body[:4096], started)
                return  # the server did it; the client never hears
            rhead, rbody = _read_head_from(response)
            status, rheaders = _headers(rhead)
            server = f"{self.upstream[0]}:{self.upstream[1]}"
            rheaders = [(k, v.replace(server, self.address) if k.lower() == "location" else v)
                        for k, v in rheaders if k.lower() != "connection"]
            conn.sendall(_render(status, rheaders + [("Connection", "close")]) + rbody)
            self._logged(method, target, fields.get("range"), body[:4096], started)
        except OSError:
            pass  # the client or the server went away: so does this connection
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _logged(self, method: str, target: str, ranged: str | None, body: bytes, started: float) -> None:
        with self._lock:
            self.log.append(Logged(method, target, ranged, body, started, time.time()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._listener.close()
        try:  # wake the accept loop
            socket.create_connection(("127.0.0.1", int(self.address.rpartition(":")[2])), timeout=1).close()
        except OSError:
            pass
        self._accepting.join(WAIT)
        for t in list(self._threads):
            t.join(WAIT)
        assert not any(t.is_alive() for t in [self._accepting, *self._threads]), "a proxy thread did not end"

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_head_from(data: bytes) -> tuple[bytes, bytes]:
    # The 100 Continue the server may send first is not the response.
    while re.match(rb"HTTP/1\.[01] 100 ", data):
        data = data.partition(b"\r\n\r\n")[2]
    head, _, body = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", body
