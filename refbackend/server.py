"""The HTTP face of the reference backend (stdlib ThreadingHTTPServer).

Endpoints (JSON bodies; `Authorization: Bearer <token>`); refbackend/README.md has the full contract:
- POST /jobs                 service token: enqueue {harness, launch_request?, id?, jam?, model?}
                             -> 201 {id, token} | 400 | 409 the id exists
- POST /jobs/next            service token: claim -> 200 {id, token, launch_request, harness, claims, jam, model} | 204
- POST /jobs/{id}/status     per-job token (or the service token, which stands for any run's):
                             {status: running|succeeded|failed|cancelled, ...}
                             -> 200 | 400 | 401 | 404 unknown | 409 already terminal (or running while unclaimed)
- GET  /jobs/{id}            service token: the run and the reports it accepted
- GET  /jobs                 service token: every run
- PUT  /harnesses/{name}     service token: {max_parallel}

Every request is taken in this order, and the first refusal answers it:
route (404/405) -> token (401) -> Content-Length (411/400/413) -> body read
(408/400) -> JSON (400) -> fields (400) -> the store. So a stranger's body is
never read, a body is never read past MAX_BODY, and nothing reaches SQLite
that SQLite cannot hold (an integer past 64 bits, a lone surrogate). Every
answer, refusals included, is a JSON object; no input may cost a 5xx, a
dropped connection or a traceback.

Test hooks (only with `--faults`; otherwise they are 404), for fault tests
against a real server:
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

import http
import http.server
import json
import math
import re
import secrets
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any

from refbackend import store

MAX_BODY = 1024 * 1024  # bytes; a larger Content-Length is 413 before a byte of the body is read
MAX_DEPTH = 32  # nesting of arrays and objects in a body
MAX_NAME = 256  # characters in a harness, run id, jam or model
MAX_PARALLEL = 10_000_000
INT64 = (-(2**63), 2**63 - 1)  # what SQLite's INTEGER holds; every integer in a body must fit
DRAIN_SECONDS = 1.0  # after a refusal that left a body unread (see Server.shutdown_request)

CONTENT_LENGTH = re.compile(r"[0-9]+")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, db: store.Store, service_token: str,
                 faults: bool = False, timeout: float = 30.0) -> None:
        if not service_token:
            raise ValueError("the service token must not be empty (it would let anyone in)")
        super().__init__(address, Handler)
        self.db = db
        self.service_token = service_token
        self.faults_enabled = faults
        self.socket_timeout = timeout
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

    def shutdown_request(self, request: Any) -> None:
        # A lingering close: send our FIN first, then read and drop what the client still sends (a body
        # we refused unread) for a bounded time. Closing with unread bytes would make the kernel send an
        # RST, which can destroy our answer before the client has read it.
        try:
            request.shutdown(socket.SHUT_WR)
            request.settimeout(DRAIN_SECONDS / 4)
            deadline = time.monotonic() + DRAIN_SECONDS
            left = MAX_BODY + 65536
            while left > 0 and time.monotonic() < deadline:
                chunk = request.recv(65536)
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass
        self.close_request(request)


class Refusal(Exception):
    """A request refused: the status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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


# --- JSON, strictly ---------------------------------------------------------------------------------------

class _BadNumber:
    """A number the body may not hold, kept in place so that the check can name where it is."""

    def __init__(self, text: str, why: str) -> None:
        self.text, self.why = text, why


def _float(text: str) -> float | _BadNumber:
    value = float(text)
    return value if math.isfinite(value) else _BadNumber(text, "not a finite number")


def _int(text: str) -> int | _BadNumber:
    # Length first: int() of a 5000-digit string is refused by Python itself (and slow before that).
    if len(text.lstrip("-")) > 19 or not INT64[0] <= int(text) <= INT64[1]:
        return _BadNumber(text[:30] + ("..." if len(text) > 30 else ""),
                          "an integer outside -2^63..2^63-1 (SQLite's INTEGER)")
    return int(text)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise Refusal(400, f"body repeats the key {key!r}")
        out[key] = value
    return out


def _where(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (key if path == "body" else f"{path}.{key}")


def parse_json(raw: bytes) -> Any:
    """The body as JSON, or a Refusal naming what is wrong (and where)."""
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_float=_float, parse_int=_int, object_pairs_hook=_pairs,
                           parse_constant=lambda c: _BadNumber(c, "not a finite number"))
    except RecursionError:
        raise Refusal(400, f"body is nested deeper than {MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise Refusal(400, f"body is not JSON (UTF-8): {str(e)[:120]}") from None
    # One walk, without recursion: depth, numbers, strings SQLite can store.
    stack: list[tuple[Any, str, int]] = [(value, "body", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, _BadNumber):
            raise Refusal(400, f"{path} is {item.why} ({item.text})")
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise Refusal(400, f"{path} has a lone surrogate (not UTF-8)") from None
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise Refusal(400, f"body is nested deeper than {MAX_DEPTH} levels")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str):
                    stack.append((key, f"{_where(path, key)} (its key)", depth + 1))
                stack.append((child, _where(path, key), depth + 1))
    return value


def check_name(value: Any, field: str) -> str:
    if (not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME
            or any(ord(c) < 32 or ord(c) == 127 for c in value)):
        raise Refusal(400, f"{field} must be a non-empty string of at most {MAX_NAME} characters, "
                           "no control characters")
    return value


ENQUEUE_FIELDS = ("harness", "launch_request", "id", "jam", "model")


def check_enqueue(body: Any) -> dict[str, Any]:
    """The enqueue's arguments, or a Refusal naming the field."""
    if not isinstance(body, dict):
        raise Refusal(400, "body must be a JSON object")
    unknown = sorted(set(body) - set(ENQUEUE_FIELDS))
    if unknown:
        raise Refusal(400, f"unknown field {unknown[0]!r} (the fields are {', '.join(ENQUEUE_FIELDS)})")
    if "harness" not in body:
        raise Refusal(400, "harness (a string) is required")
    out = {"harness": check_name(body["harness"], "harness"), "launch_request": body.get("launch_request", {}),
           "run_id": None if body.get("id") is None else check_name(body["id"], "id")}
    jam, model = body.get("jam"), body.get("model")
    if jam is not None:
        check_name(jam, "jam")
    if model is not None:
        check_name(model, "model")
    if (jam is None) != (model is None):
        missing, given = ("model", "jam") if model is None else ("jam", "model")
        raise Refusal(400, f"{missing} is required with {given}: a game-jam run names both (or neither)")
    return {**out, "jam": jam, "model": model}


def check_max_parallel(body: Any) -> int:
    limit = body.get("max_parallel") if isinstance(body, dict) else None
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PARALLEL:
        raise Refusal(400, f"max_parallel must be an integer in 1..{MAX_PARALLEL}")
    return limit


# --- the handler -----------------------------------------------------------------------------------------

SERVICE, JOB = "service", "job"  # who may call an endpoint

# (method, path shape) -> (endpoint, who); "*" matches one path segment.
ROUTES = {
    ("POST", ("jobs",)): ("enqueue", SERVICE),
    ("GET", ("jobs",)): ("list", SERVICE),
    ("POST", ("jobs", "next")): ("next", SERVICE),
    ("POST", ("jobs", "*", "status")): ("status", JOB),
    ("GET", ("jobs", "*")): ("get", SERVICE),
    ("PUT", ("harnesses", "*")): ("harness", SERVICE),
    ("POST", ("_faults",)): ("add_fault", SERVICE),
    ("GET", ("_faults",)): ("faults", SERVICE),
}


def _shape(method: str, parts: list[str]) -> tuple[str, ...] | None:
    """The route shape these path parts take under this method, if any."""
    for (m, shape) in ROUTES:
        if m == method and len(shape) == len(parts) and all(s in ("*", p) for s, p in zip(shape, parts)):
            # A literal segment beats "*" (POST /jobs/next is the claim, not a run named next).
            literal = (m, tuple(parts))
            return tuple(parts) if literal in ROUTES else shape
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    # Headers and body in one segment: with an unbuffered writer they go out as two, and the
    # client's delayed ACK then costs ~40 ms per request.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    _close_after = False  # set per request by _route

    def setup(self) -> None:
        self.timeout = self.server.socket_timeout  # StreamRequestHandler sets it on the socket
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read stdout
        pass

    def _send(self, code: int, body: Any = None, headers: dict[str, str] | None = None, *,
              close: bool = False) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        if not self.request_version.startswith("HTTP/1."):
            # HTTP/0.9 has no status line; a refusal must still read as one.
            self.request_version, close = "HTTP/1.1", True
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close or self._close_after:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own refusals (request line, headers, method): JSON like ours, and a 4xx:
        # an unknown method is 405 here, not 501; an HTTP/2 request line is a bad request, not a 505.
        code = {501: 405, 505: 400}.get(int(code), int(code))
        reason = message or http.HTTPStatus(code).phrase
        self._send(code, {"error": reason}, close=True)

    def _token(self) -> str:
        """The bearer token; "" for none, or for one that is not printable ASCII (no token has such bytes)."""
        auth = self.headers.get("Authorization") or ""
        token = str(auth)[7:] if str(auth).startswith("Bearer ") else ""
        return token if token.isascii() and token.isprintable() and len(token) <= 1024 else ""

    def _authorize(self, who: str) -> None:
        token = self._token()
        service = secrets.compare_digest(token.encode(), self.server.service_token.encode())
        if who == SERVICE and not service:
            raise Refusal(401, "service token required")
        # A status report needs a credential before anything is said about the run: the service token
        # or some run's own token. A guess hears 401 whether the id exists or not.
        if who == JOB and not service and not (token and self.server.db.known_token(token)):
            raise Refusal(401, "a job token is required")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") is not None:
            raise Refusal(411, "Transfer-Encoding is not accepted: send the body with a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise Refusal(411, f"Content-Length is required on a {self.command}")
        if len(set(lengths)) > 1:
            raise Refusal(400, "Content-Length is given more than once")
        text = str(lengths[0]).strip()
        if not CONTENT_LENGTH.fullmatch(text):
            raise Refusal(400, f"Content-Length must be a decimal number of bytes, not {text[:30]!r}")
        if len(text) > 12 or int(text) > MAX_BODY:
            raise Refusal(413, f"body of {text[:30]} bytes is over the limit of {MAX_BODY} bytes")
        length = int(text)
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            raise Refusal(408, f"body not received within {self.server.socket_timeout:g} s") from None
        if len(raw) < length:
            raise Refusal(400, f"body ended after {len(raw)} of the {length} bytes its Content-Length announced")
        return raw

    def _route(self, method: str) -> None:
        body_read = False
        # A GET that came with a body: it is never read, so the connection cannot carry another request.
        self._close_after = method not in ("POST", "PUT") and (
            self.headers.get("Content-Length") not in (None, "0") or self.headers.get("Transfer-Encoding") is not None)
        try:
            path = urllib.parse.urlsplit(self.path).path.rstrip("/")
            parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
            shape = _shape(method, parts)
            if parts[:1] == ["_faults"] and not self.server.faults_enabled:
                raise Refusal(404, "the fault hooks are off (start the server with --faults)")
            if shape is None:
                allowed = [m for m in ("GET", "POST", "PUT") if _shape(m, parts)]
                if allowed:
                    raise Refusal(405, f"{method} is not allowed here (allowed: {', '.join(allowed)})")
                raise Refusal(404, "no such endpoint")
            endpoint, who = ROUTES[(method, shape)]
            self._authorize(who)
            body: Any = None
            if method in ("POST", "PUT"):
                raw = self._read_body()
                body_read = True
                body = parse_json(raw)
            self._serve(endpoint, parts, body)
        except Refusal as refusal:
            # A body left unread (or half read) would be taken for the next request: close instead.
            unread = not body_read and (self.headers.get("Content-Length") not in (None, "0")
                                        or self.headers.get("Transfer-Encoding") is not None)
            self._send(refusal.status, {"error": refusal.reason}, close=unread or refusal.status in (408, 413, 411))
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # a defect, not an input: one line, a JSON 500, never a dropped connection
            print(f"refbackend: {method} {self.path[:200]} failed: {type(e).__name__}: {e}", file=sys.stderr)
            self._send(500, {"error": "internal error"}, close=True)

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

    def _serve(self, endpoint: str, parts: list[str], body: Any) -> None:
        db = self.server.db
        if endpoint in ("next", "status") and self.server.faults_enabled and self._fault(endpoint):
            return
        if endpoint == "add_fault":
            why = check_fault(body)
            if why is not None:
                raise Refusal(400, why)
            with self.server.lock:
                self.server.faults.append({"count": 1, **body})
            self._send(200, {})
        elif endpoint == "faults":
            with self.server.lock:
                answer = {"faults": [dict(f) for f in self.server.faults], "hits": dict(self.server.hits)}
            self._send(200, answer)
        elif endpoint == "enqueue":
            args = check_enqueue(body)
            created = db.enqueue(**args)
            if created is None:
                raise Refusal(409, f"a run with id {args['run_id']!r} exists already")
            self._send(201, created)
        elif endpoint == "list":
            self._send(200, db.runs())
        elif endpoint == "next":
            run = db.claim()
            self._send(204) if run is None else self._send(200, run)
        elif endpoint == "status":
            state = body.get("status") if isinstance(body, dict) else None
            if not isinstance(state, str) or state not in store.STATES:
                raise Refusal(400, f"status must be one of {', '.join(store.STATES)}")
            token = self._token()
            service = secrets.compare_digest(token.encode(), self.server.service_token.encode())
            code, reason = db.report(parts[1], token=token, state=state, body=body, service=service)
            if code != 200:
                raise Refusal(code, reason or "refused")
            self._send(200, {})
        elif endpoint == "get":
            run = db.get(parts[1])
            if run is None:
                raise Refusal(404, "unknown run")
            self._send(200, run)
        elif endpoint == "harness":
            name = check_name(parts[1], "the harness name in the path")
            db.set_harness(name, max_parallel=check_max_parallel(body))
            self._send(200, {})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PATCH(self) -> None:
        self._route("PATCH")
