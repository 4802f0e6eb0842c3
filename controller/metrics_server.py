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
- 429 Too Many Requests: a token with no decision, over the review budget
  (no review asked for);
- 503: the apiserver could not be asked (never a 200 on no answer);
- 404 any other path.

A decision is kept for `CACHE_SECONDS` under a digest of the token (the
token itself is never kept or logged), so a scrape every 15 s costs the
apiserver two requests a minute per scraper. What random tokens can cost is
bounded (`controller.review_budget`): their 401s are kept apart from the
decisions on real credentials, at most `CACHE_SIZE` of each, and a token
with no decision is reviewed only within a budget of reviews a minute
(`Settings.token_reviews_per_minute`); a token once authenticated is
reviewed again outside it, so a scraper is never starved by a flood.
Connections are bounded as the probes' are (`controller.connlimit`): at
most `Settings.max_connections` at once, each at most
`Settings.connection_seconds`, the TLS handshake included.

The probes are not here: the kubelet sends no token, so /healthz and
/readyz stay on the health port (`controller.health`), plain HTTP.
The ClusterRole needs exactly `create` on tokenreviews and
subjectaccessreviews for this.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from controller import connlimit, review_budget, settings
from toolkit import kube

log = logging.getLogger("controller.metrics")

PATH = "/metrics"
CACHE_SECONDS = 30.0
CACHE_SIZE = 256
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Reviewer:
    """Asks the apiserver who a token is and whether it may get /metrics."""

    def __init__(self, client: kube.Client, *, reviews_per_minute: int = settings.Settings.token_reviews_per_minute,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.decisions = review_budget.Decisions(size=CACHE_SIZE, seconds=CACHE_SECONDS, clock=clock)
        self.budget = review_budget.Bucket(per_minute=reviews_per_minute, clock=clock)

    def decide(self, token: str) -> int:
        """200, 401, 403, 429 or 503 for a request bearing `token`."""
        key = hashlib.sha256(token.encode()).hexdigest()
        decision, known = self.decisions.get(key)
        if decision is not None:
            return decision
        if not known and not self.budget.take():
            return 429
        try:
            code = self._ask(token)
        except kube.ApiError as exc:
            log.warning("metrics: could not review a token", extra={"error": str(exc)})
            return 503
        self.decisions.put(key, code)
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


BODIES = {401: b"Unauthorized\n", 403: b"Forbidden\n", 429: b"Too Many Requests\n"}


class MetricsServer:
    def __init__(self, *, host: str, port: int, context: ssl.SSLContext, reviewer: Reviewer,
                 scrape: Callable[[], bytes], content_type: str,
                 max_connections: int = settings.Settings.max_connections,
                 connection_seconds: float = settings.Settings.connection_seconds) -> None:
        outer = self
        self.reviewer = reviewer

        class Handler(connlimit.Handler):
            def do_GET(self) -> None:  # the stdlib's name
                if self.path.split("?", 1)[0] != PATH:
                    self._reply(404, b"not found\n")
                    return
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                code = outer.reviewer.decide(token.strip()) if scheme.lower() == "bearer" and token.strip() else 401
                if code == 200:
                    self._reply(200, scrape(), content_type)
                else:
                    self._reply(code, BODIES.get(code, b"unavailable\n"))

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if code == 429:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(body)

        self.server = connlimit.Server((host, port), Handler, limit=max_connections, seconds=connection_seconds,
                                       name="metrics")
        # The handshake runs on the handler's thread (first read, under the connection's timeout),
        # not in accept: a slow or silent client cannot hold the listener.
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
