"""An apiserver stand-in on a real local socket that can take a request and never answer it.

What a controller sees of an apiserver whose packets are dropped is a connection that was
accepted and then says nothing; refusing the connection (a closed port) is a different fault, and
the one the client library already handled. This server answers the little the tests need (the
Lease's read, create and update; a list of each collection from `lists`; everything else 404),
records every request, and holds a request for as long as `hold(method, path)` says so: no
answer meanwhile, and none at all once `close` is called. A watch is held until `close` (an open
stream that sends no event). Each answer closes its connection, so every handler thread handles
one request and `close` joins them all.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


class HoldingApiserver:
    def __init__(self) -> None:
        self.lists: dict[str, list[Obj]] = {}  # a collection's path -> its items
        self.hold: Callable[[str, str], bool] = lambda method, path: False
        self.leases: dict[str, Obj] = {}  # a Lease's path -> the Lease
        self.requests: list[tuple[float, str, str]] = []  # (time.monotonic(), method, path) as they arrive
        self.lease_writes: list[float] = []  # time.monotonic() after each Lease create or update answered
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._version = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner._handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test reads `requests`, not stderr

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = False  # server_close joins every handler
        self._thread = threading.Thread(target=self._server.serve_forever, name="holding-apiserver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HoldingApiserver:
        self._thread.start()
        return self

    def close(self) -> None:
        """Let every held request go (closing it unanswered) and stop; a second call does nothing."""
        if self._released.is_set():
            return
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def arrivals(self, method: str, path: str) -> list[float]:
        """When each request for `method` and `path` arrived (time.monotonic())."""
        with self._lock:
            return [at for at, m, p in self.requests if (m, p) == (method, path)]

    def seen(self, method: str, path: str) -> bool:
        return bool(self.arrivals(method, path))

    # -- the handler ------------------------------------------------------

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length)) if length else None
        method, path = handler.command, url.path
        with self._lock:
            self.requests.append((time.monotonic(), method, path))
        watch = query.get("watch") == ["true"]
        if watch or self.hold(method, path):
            while (watch or self.hold(method, path)) and not self._released.wait(0.02):
                pass
            if self._released.is_set():
                return  # closed unanswered
        status, answer = self._answer(method, path, body)
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()
        if path.startswith("/apis/coordination.k8s.io/") and method in ("POST", "PUT") and status < 300:
            with self._lock:
                self.lease_writes.append(time.monotonic())

    def _answer(self, method: str, path: str, body: Obj | None) -> tuple[int, Obj]:
        with self._lock:
            if method == "GET" and path in self.lists:
                return 200, {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                             "items": self.lists[path]}
            if path.startswith("/apis/coordination.k8s.io/") and body is not None and method in ("POST", "PUT"):
                meta = body.setdefault("metadata", {})
                name = meta.get("name") or path.rsplit("/", 1)[1]
                where = path if method == "PUT" else f"{path}/{name}"
                self._version += 1
                meta.update(name=name, namespace=where.split("/")[5], resourceVersion=str(self._version))
                self.leases[where] = {**body, "apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
                return (200 if method == "PUT" else 201), self.leases[where]
            if method == "GET" and path in self.leases:
                return 200, self.leases[path]
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                     "code": 404, "message": f"{path} not found"}
