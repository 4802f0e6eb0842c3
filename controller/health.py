"""/healthz, /readyz and /metrics on one small HTTP server.

/healthz is 200 while the process's loops are alive (the wiring sets it);
/readyz is 200 once this replica leads and its informers have listed, so a
standby replica is live but not ready. /metrics is Prometheus text from
prometheus-client, on a registry of our own (no global state, so two
controllers in one test process do not collide).
"""

from __future__ import annotations

import http.server
import threading
from typing import Any

import prometheus_client


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.raises = prometheus_client.Counter(
            "dispatch_raises", "A raised on a TrainJob", registry=self.registry
        )
        self.conflicts = prometheus_client.Counter(
            "dispatch_conflicts_retried", "409s re-read and recomputed", registry=self.registry
        )
        self.foreign_flags = prometheus_client.Counter(
            "dispatch_foreign_flags", "TrainJobs flagged foreign, by rule", ["rule"], registry=self.registry
        )
        self.ready_latency = prometheus_client.Histogram(
            "dispatch_check_ready_seconds",
            "From the first sight of a Workload's reservation with our check Pending to the check Ready",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )

        self.awaiting_ready = prometheus_client.Gauge(
            "dispatch_workloads_awaiting_ready",
            "Workloads seen with quota reserved and our check Pending, not yet Ready",
            registry=self.registry,
        )
        self.api_requests = prometheus_client.Gauge(
            "dispatch_api_requests",
            "Kubernetes API requests sent by this process (each retry and each list or watch connection counted)",
            registry=self.registry,
        )
        self.sidecar_reports = prometheus_client.Counter(
            "dispatch_sidecar_reports",
            "Sidecar reports, by whether the controller's own re-read confirmed them",
            ["outcome"],
            registry=self.registry,
        )

    def foreign(self, rule: str) -> None:
        self.foreign_flags.labels(rule=rule).inc()

    def sidecar_report(self, outcome: str) -> None:
        self.sidecar_reports.labels(outcome=outcome).inc()


class HealthServer:
    def __init__(self, *, host: str, port: int, metrics: Metrics) -> None:
        """Bind `host`:`port` (0 picks a port); the default address is the
        settings' (`Settings.health_host`), not this class's."""
        self.live = threading.Event()
        self.ready = threading.Event()
        self.metrics = metrics
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path == "/healthz":
                    self._reply(200 if outer.live.is_set() else 503, b"ok\n" if outer.live.is_set() else b"down\n")
                elif self.path == "/readyz":
                    ok = outer.ready.is_set()
                    self._reply(200 if ok else 503, b"ok\n" if ok else b"not leading\n")
                elif self.path == "/metrics":
                    self._reply(200, prometheus_client.generate_latest(outer.metrics.registry),
                                prometheus_client.CONTENT_TYPE_LATEST)
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # probes are not news
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
