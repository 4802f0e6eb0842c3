"""/metrics, served as Kueue serves its secured metrics: over TLS, on a port
of its own, to a caller the apiserver has authenticated and authorized.

Each request's bearer token goes to the apiserver as a TokenReview; the
user it names (with its groups, uid and extra) is then asked about as a
SubjectAccessReview for `get` on the non-resource URL `/metrics`, which a
ClusterRole grants (the shipped `dispatch-metrics-reader`, bound to the
scraper's ServiceAccount). The answers:

- 401 Unauthorized: no bearer token, or one the apiserver does not authenticate;
- 403 Forbidden: authenticated, not allowed (the SubjectAccessReview's reason
  is logged, not sent);
- 200: the metrics (`controller.metrics`);
- 503: the apiserver could not be asked (never a 200 on no answer);
- 404 any other path.

A decision is cached for `CACHE_SECONDS` under a digest of the token (the
token itself is never kept or logged), at most `CACHE_SIZE` of them, so a
scrape every 15 s costs the apiserver two requests a minute per scraper.

The probes are not here: the kubelet sends no token, so /healthz and
/readyz stay on the health port (`controller.health`), plain HTTP.
The ClusterRole needs exactly `create` on tokenreviews and
subjectaccessreviews for this.
"""

from __future__ import annotations

import hashlib
import http.server
import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from toolkit import kube

log = logging.getLogger("controller.metrics")

PATH = "/metrics"
CACHE_SECONDS = 30.0
CACHE_SIZE = 256
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Reviewer:
    """Asks the apiserver who a token is and whether it may get /metrics."""

    def __init__(self, client: kube.Client, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self._cache: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def decide(self, token: str) -> int:
        """200, 401, 403 or 503 for a request bearing `token`."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return hit[1]
        try:
            code = self._ask(token)
        except kube.ApiError as exc:
            log.warning("metrics: could not review a token", extra={"error": str(exc)})
            return 503
        with self._lock:
            if len(self._cache) >= CACHE_SIZE:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= CACHE_SIZE:
                    self._cache.clear()
            self._cache[key] = (now + CACHE_SECONDS, code)
        return code

    def _ask(self, token: str) -> int:
        review = self.client.request("POST", TOKEN_REVIEWS, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401
        user = status.get("user") or {}
        spec: dict[str, Any] = {"user": user.get("username", ""), "groups": user.get("groups") or [],
                                "nonResourceAttributes": {"path": PATH, "verb": "get"}}
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = self.client.request("POST", ACCESS_REVIEWS, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
        allowed = bool((access.get("status") or {}).get("allowed"))
        if not allowed:
            log.info("metrics: forbidden", extra={"user": spec["user"],
                                                  "reason": (access.get("status") or {}).get("reason", "")})
        return 200 if allowed else 403


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that fails the TLS handshake (plain HTTP, a wrong CA) or hangs up: its own problem,
        # one debug line, not a traceback on stderr.
        log.debug("metrics: a connection failed", extra={"client": str(client_address)})


class MetricsServer:
    def __init__(self, *, host: str, port: int, context: ssl.SSLContext, reviewer: Reviewer,
                 scrape: Callable[[], bytes], content_type: str) -> None:
        outer = self
        self.reviewer = reviewer

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path.split("?", 1)[0] != PATH:
                    self._reply(404, b"not found\n")
                    return
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                code = outer.reviewer.decide(token.strip()) if scheme.lower() == "bearer" and token.strip() else 401
                if code == 200:
                    self._reply(200, scrape(), content_type)
                else:
                    self._reply(code, {401: b"Unauthorized\n", 403: b"Forbidden\n"}.get(code, b"unavailable\n"))

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes are not news
                pass

        self.server = _Server((host, port), Handler)
        # The handshake runs on the handler's thread (first read), not in accept: a slow or silent
        # client cannot hold the listener.
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
