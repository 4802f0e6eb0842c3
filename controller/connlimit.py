"""Bounds on the controller's two small HTTP servers (the probes, `controller.health`; /metrics,
`controller.metrics_server`), so that no client, and no number of them, can make the process
hold more than a fixed number of connections, threads and bytes.

The standard library's threading server runs a thread per connection with no limit and waits
forever on a silent client. Here (`Server`, a drop-in for `http.server.ThreadingHTTPServer`):

- at most `limit` connections at once (`Gate`). One more closes the oldest held connection that
  has not sent its request yet (a TLS handshake not finished, a request line or headers not read):
  an attacker's idle connections make room for the kubelet's probe or a scraper, which send their
  request at once, instead of locking them out. When every held connection is being answered,
  the new one is closed at once.
- each connection lasts at most `seconds` from its accept, whatever it does: the socket's timeout
  bounds every read and write (the TLS handshake is the first read), and the server's loop closes
  a connection past its deadline (a client that trickles a byte at a time).
- a request's line and headers are read up to `REQUEST_BYTES` in all; beyond, the connection
  reads as ended (`Handler`).

A connection is closed by shutting its socket down (`socket.socket.shutdown`, the plain socket's
method even for TLS: the TLS one drops the state its handler's thread is still reading through);
the thread blocked on it wakes and ends. The gate never blocks the accepting thread: it decides
under its lock, and the shutdowns happen outside it.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

log = logging.getLogger("controller.connlimit")

REQUEST_BYTES = 16 * 1024  # a probe's or a scrape's request line and headers fit in far less


class Gate:
    """Which connections a server holds: at most `limit`, each until its deadline `seconds` after
    it was admitted. Connections are any hashable objects (sockets in the server, tokens in tests)."""

    def __init__(self, *, limit: int, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or seconds <= 0:
            raise ValueError(f"limit={limit}, seconds={seconds}: expected limit >= 1 and seconds > 0")
        self.limit = limit
        self.seconds = seconds
        self.clock = clock
        self._lock = threading.Lock()
        # conn -> [deadline, answering]; insertion order is age order (oldest first).
        self._held: dict[Any, list[Any]] = {}

    def admit(self, conn: Any) -> tuple[bool, list[Any]]:
        """(whether CONN is held, the connections to close now: the oldest idle one to make room)."""
        with self._lock:
            victims: list[Any] = []
            if len(self._held) >= self.limit:
                idle = next((c for c, (_, answering) in self._held.items() if not answering), None)
                if idle is None:
                    return False, []
                del self._held[idle]
                victims.append(idle)
            self._held[conn] = [self.clock() + self.seconds, False]
            return True, victims

    def answering(self, conn: Any) -> None:
        """CONN sent its request: it is no longer the first to make room."""
        with self._lock:
            if conn in self._held:
                self._held[conn][1] = True

    def release(self, conn: Any) -> None:
        """CONN's handler is done with it (a connection no longer held is ignored)."""
        with self._lock:
            self._held.pop(conn, None)

    def overdue(self) -> list[Any]:
        """The connections past their deadline, no longer held: the caller closes them."""
        now = self.clock()
        with self._lock:
            late = [c for c, (deadline, _) in self._held.items() if deadline <= now]
            for conn in late:
                del self._held[conn]
        return late

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


def hang_up(conn: socket.socket) -> None:
    """Shut CONN down both ways: the thread reading or writing it wakes with an end or an error."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its handler


class Server(http.server.ThreadingHTTPServer):
    """A threading HTTP server behind a `Gate`; its handler class must derive from `Handler`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[Handler], *, limit: int, seconds: float,
                 name: str) -> None:
        self.gate = Gate(limit=limit, seconds=seconds)
        self.name = name
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        held, victims = self.gate.admit(request)
        for victim in victims:
            hang_up(victim)
        if not held:
            log.debug(f"{self.name}: every connection is answering, one refused", extra={"client": str(client_address)})
            self.shutdown_request(request)
            return
        request.settimeout(self.gate.seconds)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.gate.release(request)

    def service_actions(self) -> None:
        """Each turn of the serving loop (every half second): close what overran its deadline."""
        for conn in self.gate.overdue():
            hang_up(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that fails the TLS handshake, hangs up, overruns or was closed to make room: its
        # own problem, one debug line, not a traceback on stderr.
        log.debug(f"{self.name}: a connection failed", extra={"client": str(client_address)})


class _Capped:
    """A reader that reads as ended after `limit` bytes (readline is all the request parser uses)."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self.raw = raw
        self.left = limit

    def readline(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        line = self.raw.readline(self.left if size < 0 else min(size, self.left))
        self.left -= len(line)
        return line

    def read(self, size: int = -1) -> bytes:
        return self.readline(size)

    def close(self) -> None:
        self.raw.close()


class Handler(http.server.BaseHTTPRequestHandler):
    """The base of a `Server`'s handlers: caps what a request may send and tells the gate when the
    request is in. One request per connection (HTTP/1.0, the stdlib's default)."""

    server: Server

    def setup(self) -> None:
        super().setup()
        self.rfile = _Capped(self.rfile, REQUEST_BYTES)  # type: ignore[assignment]

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed:
            self.server.gate.answering(self.request)
        return parsed

    def log_message(self, *args: Any) -> None:  # probes and scrapes are not news
        pass
