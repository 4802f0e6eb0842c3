"""The HTTP face of the reference backend (stdlib ThreadingHTTPServer).

Endpoints (JSON bodies; `Authorization: Bearer <token>`):
- POST /jobs                 service token: enqueue {harness, launch_request, id?} -> 201 {id, token}
- POST /jobs/next            service token: claim -> 200 {id, token, launch_request, harness} | 204
- POST /jobs/{id}/status     per-job token: {status: running|succeeded|failed|cancelled, ...}
                             -> 200 | 400 | 401 | 404 unknown | 409 already terminal
- GET  /jobs/{id}            service token: the run and the reports it accepted
- GET  /jobs                 service token: every run
- PUT  /harnesses/{name}     service token: {max_parallel}

Test hooks (service token), for fault tests against a real server:
- POST /_faults {"status": 503, "count": N} answers the next N claims or
  status reports with that status; {"delay": S, "count": N} sleeps S seconds
  before answering them (then serves them: a client that timed out meanwhile
  finds the claim taken or the report recorded, as with a real slow backend);
  "on": "next" or "status" limits it to one endpoint; "retry_after": V adds
  the header `Retry-After: V` to the fault's answer. A malformed fault is 400.
- GET /_faults -> {"faults": [the ones left], "hits": {"next": N, "status": N}}:
  how many claims and status reports arrived (faulted or not).
"""

from __future__ import annotations

import http.server
import json
import secrets
import sys
import threading
import time
import urllib.parse
from typing import Any

from refbackend import store


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, db: store.Store, service_token: str) -> None:
        super().__init__(address, Handler)
        self.db = db
        self.service_token = service_token
        self.faults: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.requests = 0
        self.hits = {"next": 0, "status": 0}

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request (a SIGKILLed dispatcher) is routine: one line, no traceback.
        error = sys.exc_info()[1]
        if not isinstance(error, (ConnectionError, TimeoutError)):
            print(f"refbackend: request from {client_address[0]} failed: {type(error).__name__}: {error}",
                  file=sys.stderr)


def check_fault(body: Any) -> str | None:
    """Why a POST /_faults body is malformed, or None."""
    if not isinstance(body, dict):
        return "a fault is a JSON object"
    unknown = set(body) - {"status", "count", "delay", "on", "retry_after"}
    if unknown:
        return f"unknown fault fields: {', '.join(sorted(unknown))}"
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return "count must be an integer >= 1"
    status = body.get("status")
    if status is not None and (not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599):
        return "status must be an HTTP status (100..599)"
    delay = body.get("delay")
    if delay is not None and (not isinstance(delay, (int, float)) or isinstance(delay, bool) or not 0 <= delay <= 600):
        return "delay must be a number of seconds in 0..600"
    if body.get("on") not in (None, "next", "status"):
        return 'on must be "next" or "status"'
    if status is None and delay is None:
        return "a fault needs a status or a delay"
    retry_after = body.get("retry_after")
    if retry_after is not None and (not isinstance(retry_after, (str, int)) or "\n" in str(retry_after)):
        return "retry_after must be a string or an integer"
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    # Headers and body in one segment: with an unbuffered writer they go out as two, and the
    # client's delayed ACK then costs ~40 ms per request.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read stdout
        pass

    def _send(self, code: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def _token(self) -> str:
        auth = self.headers.get("Authorization") or ""
        return auth[7:] if auth.startswith("Bearer ") else ""

    def _service(self) -> bool:
        if secrets.compare_digest(self._token(), self.server.service_token):
            return True
        self._send(401, {"error": "service token required"})
        return False

    def _fault(self, endpoint: str) -> bool:
        with self.server.lock:
            self.server.requests += 1
            self.server.hits[endpoint] += 1
            fault = next((f for f in self.server.faults if f.get("on") in (None, endpoint)), None)
            if fault is not None:
                fault["count"] -= 1
                if fault["count"] <= 0:
                    self.server.faults.remove(fault)
        if fault is None:
            return False
        if fault.get("delay"):
            time.sleep(float(fault["delay"]))
        if fault.get("status"):
            headers = {"Retry-After": str(fault["retry_after"])} if fault.get("retry_after") is not None else None
            self._send(int(fault["status"]), {"error": "injected fault"}, headers)
            return True
        return False

    def _route(self, method: str) -> None:
        path = urllib.parse.urlsplit(self.path).path.rstrip("/")
        parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
        try:
            body = self._body() if method in ("POST", "PUT") else None
        except ValueError:
            self._send(400, {"error": "body is not JSON"})
            return
        if parts == ["_faults"] and method == "POST":
            if self._service():
                why = check_fault(body)
                if why is not None:
                    self._send(400, {"error": why})
                    return
                with self.server.lock:
                    self.server.faults.append({"count": 1, **body})
                self._send(200, {})
            return
        if parts == ["_faults"] and method == "GET":
            if self._service():
                with self.server.lock:
                    answer = {"faults": [dict(f) for f in self.server.faults], "hits": dict(self.server.hits)}
                self._send(200, answer)
            return
        endpoint = "next" if parts == ["jobs", "next"] else "status" if parts[-1:] == ["status"] else ""
        if method == "POST" and endpoint and self._fault(endpoint):
            return
        db = self.server.db
        if parts == ["jobs"] and method == "POST":
            if self._service():
                if not isinstance(body, dict) or not isinstance(body.get("harness"), str):
                    self._send(400, {"error": "harness (a string) is required"})
                    return
                self._send(201, db.enqueue(harness=body["harness"], launch_request=body.get("launch_request", {}),
                                           run_id=body.get("id")))
        elif parts == ["jobs"] and method == "GET":
            if self._service():
                self._send(200, db.runs())
        elif parts == ["jobs", "next"] and method == "POST":
            if self._service():
                run = db.claim()
                self._send(204) if run is None else self._send(200, run)
        elif len(parts) == 3 and parts[0] == "jobs" and parts[2] == "status" and method == "POST":
            state = body.get("status") if isinstance(body, dict) else None
            if state not in store.STATES:
                self._send(400, {"error": f"status must be one of {', '.join(store.STATES)}"})
                return
            code = db.report(parts[1], token=self._token(), state=state, body=body)
            self._send(code, {"error": {404: "unknown run", 401: "wrong job token",
                                        409: "run already terminal"}.get(code)} if code != 200 else {})
        elif len(parts) == 2 and parts[0] == "jobs" and method == "GET":
            if self._service():
                run = db.get(parts[1])
                self._send(404, {"error": "unknown run"}) if run is None else self._send(200, run)
        elif len(parts) == 2 and parts[0] == "harnesses" and method == "PUT":
            if self._service():
                limit = body.get("max_parallel") if isinstance(body, dict) else None
                if not isinstance(limit, int) or limit < 1:
                    self._send(400, {"error": "max_parallel must be an integer >= 1"})
                    return
                db.set_harness(parts[1], max_parallel=limit)
                self._send(200, {})
        else:
            self._send(404, {"error": "no such endpoint"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")
