"""The sidecar's only contact with the apiserver: REST over sidecar.wire.

Why not the kubernetes client: importing it costs about 44 MB and 0.34 s per
process here, and the sidecar runs in every training pod; sidecar.wire (HTTP/1.1
on the C modules under ssl and socket) and json do the three calls it needs
(GET TrainJob, GET JobSet, POST Event). Why not http.client and ssl: see
wire. Why no kubeconfig: see settings.

One `Session` is one check: one TLS connection (keep-alive across the check's
requests), the bearer token read from its file when the session opens (a
projected service-account token rotates, so it is never cached across
checks). Every request is reported to `on_request` (the JSON request log line
with its running count), so request counts are observable from outside.

Errors: `Unavailable` for what a retry may cure (connection refused or reset,
timeout, TLS failure, 429, 5xx), carrying Retry-After when the server sent one;
`ApiError` for the rest (401, 403, 404, 422...), with the Status message.
`Stopping` when SIGTERM or SIGINT is pending before a request: the check is
abandoned so the process exits promptly. Nothing here retries; the loop does.

The paths come from toolkit.paths (every segment quoted: names come from
files in the pod, and must never add a path segment); Retry-After, seconds
or an HTTP date, is read by toolkit.backoff.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

from sidecar import settings, wire
from toolkit import backoff

USER_AGENT = "dispatch-sidecar/0.1"
RETRY_AFTER_LIMIT = 86400.0
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}

# on_request(method, path, status or None, milliseconds, error text or "")
RequestHook = Callable[[str, str, "int | None", float, str], None]


class ApiError(Exception):
    def __init__(self, status: int | None, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {message}" if status else message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


class Unavailable(ApiError):
    """Transient: the next attempt may succeed."""


class Stopping(Exception):
    """SIGTERM or SIGINT is pending: stop before the next request."""


def _retry_after(response: wire.Response) -> float | None:
    # The wait is capped by the loop's backoff ceiling; this limit only keeps the number sane.
    return backoff.retry_after(response.headers.get("retry-after"), limit=RETRY_AFTER_LIMIT)


def _status_message(body: bytes) -> str:
    try:
        status = json.loads(body)
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            return status["message"][:300]
    except ValueError:
        pass
    return body[:300].decode("utf-8", errors="replace")


class Session:
    def __init__(self, endpoint: settings.Endpoint, *, timeout: float, on_request: RequestHook) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._on_request = on_request
        self._conn: wire.Connection | None = None
        self._token = ""
        self.requests = 0
        self.api_seconds = 0.0

    def __enter__(self) -> Session:
        try:
            with open(self._endpoint.token_file, encoding="utf-8") as f:
                self._token = f.read().strip()
            context = wire.tls_context(self._endpoint.ca_file)
        except wire.TLSError as e:
            raise Unavailable(None, f"credentials: {self._endpoint.ca_file}: not a CA bundle ({e.reason})") from None
        except OSError as e:
            # Files a kubelet may still be writing, or a mount that comes late.
            raise Unavailable(None, f"credentials: {e.filename or self._endpoint.ca_file}: {e.strerror}") from None
        if not self._token:
            raise Unavailable(None, f"credentials: {self._endpoint.token_file} is empty")
        self._conn = wire.Connection(self._endpoint.host, self._endpoint.port, context=context,
                                     timeout=self._timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self, path: str) -> dict[str, object]:
        return self._request("GET", path, None)

    def post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        return self._request("POST", path, json.dumps(body).encode())

    def _request(self, method: str, path: str, body: bytes | None) -> dict[str, object]:
        assert self._conn is not None, "use the session as a context manager"
        if _STOP_SIGNALS & signal.sigpending():
            raise Stopping()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json",
                   "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.requests += 1
        started = time.monotonic()
        try:
            status, parsed = self._exchange(method, path, body, headers)
        except ApiError as e:
            self._done(method, path, e.status, started, e.message)
            raise
        self._done(method, path, status, started, "")
        return parsed

    def _exchange(self, method: str, path: str, body: bytes | None,
                  headers: dict[str, str]) -> tuple[int, dict[str, object]]:
        assert self._conn is not None
        try:
            response = self._conn.request(method, path, headers=headers, body=body)
        except (OSError, wire.ProtocolError) as e:
            # OSError covers refused, reset, timeout and TLS errors.
            raise Unavailable(None, f"{method} {path}: {type(e).__name__}: {e}") from None
        data = response.body
        status = response.status
        if status == 429 or status >= 500:
            raise Unavailable(status, f"{method} {path}: {_status_message(data)}",
                              retry_after=_retry_after(response))
        if status >= 300:
            raise ApiError(status, f"{method} {path}: {_status_message(data)}")
        try:
            parsed = json.loads(data)
        except ValueError:
            raise Unavailable(status, f"{method} {path}: the response is not JSON") from None
        if not isinstance(parsed, dict):
            raise Unavailable(status, f"{method} {path}: the response is not a JSON object")
        return status, parsed

    def _done(self, method: str, path: str, status: int | None, started: float, error: str) -> None:
        elapsed = time.monotonic() - started
        self.api_seconds += elapsed
        self._on_request(method, path, status, elapsed * 1000, error)
