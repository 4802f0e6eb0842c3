"""The reference backend as a real subprocess over real HTTP, for tests and the bench.

`Backend()` starts `python -m refbackend` with `--faults` (the fault hooks the
dispatcher's fault tests use); pass `faults=False` for a backend started as an
operator would start it. `db=` points a second server at the first one's
SQLite file (two processes, one table).
"""

from __future__ import annotations

import http.client
import socket
import sqlite3
from typing import Any

from devcluster import runqueue

SERVICE_TOKEN = runqueue.SERVICE_TOKEN


class Client(runqueue.Client):
    """A running server's API (devcluster/runqueue.py), plus what only tests send: raw bytes, faults."""

    def raw(self, request: bytes, *, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
        """Send these exact bytes on a new connection, half-close it, and read one response.

        Raises when no HTTP response arrives (the server dropped the connection).
        """
        with socket.create_connection(self.address, timeout=timeout) as s:
            try:
                s.sendall(request)
                s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before reading it all: read that answer
            response = http.client.HTTPResponse(s, method="POST")
            response.begin()
            body = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, body

    def fault(self, **fault: Any) -> None:
        self._ok(200, "POST", "/_faults", fault)

    def faults(self) -> dict[str, Any]:
        """{"faults": [those left], "hits": {"next": N, "status": N}}."""
        return dict(self._ok(200, "GET", "/_faults"))


class Backend(runqueue.Backend, Client):
    """The server as a subprocess, with its fault hooks on unless FAULTS is False."""

    def __init__(self, *, lease: float = 300.0, faults: bool = True, db: str | None = None,
                 extra_args: tuple[str, ...] = (), host: str = "127.0.0.1") -> None:
        super().__init__(lease=lease, faults=faults, db=db, extra_args=extra_args, host=host)

    def __enter__(self) -> Backend:
        return self

    def dump(self) -> list[str]:
        """Every table of the SQLite file, as SQL, read through a connection of our own."""
        db = sqlite3.connect(self.db_path, timeout=30)
        try:
            return list(db.iterdump())
        finally:
            db.close()
