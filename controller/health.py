"""The probes, /healthz, /readyz and /leaderz, on one small plain-HTTP server
of their own: the kubelet sends no token, so they cannot share the
authenticated metrics port (`controller.metrics_server`).

/healthz is 200 while the process's loops are alive (the wiring sets it).
/readyz is 200 while this replica does its part: standing by for the Lease,
or leading with its informers listed; 503 while a new leader lists, and once
it stops. A standby is ready: a Deployment's rolling update waits for its new
pods to be ready, and a PodDisruptionBudget counts only ready pods, so a
standby that said 503 would stall every upgrade and block every drain.
/leaderz is 200 only on the leader whose informers have listed (what a
person or a test asks to find the leader; the Lease says it too).

The port holds at most `Settings.max_connections` connections, each at most
`Settings.connection_seconds` (`controller.connlimit`): a connection that
says nothing is closed to make room for the next, which is how a probe gets
through while idle connections fill the port.
"""

from __future__ import annotations

import threading

from controller import connlimit, settings


class HealthServer:
    def __init__(self, *, host: str, port: int, max_connections: int = settings.Settings.max_connections,
                 connection_seconds: float = settings.Settings.connection_seconds) -> None:
        """Bind `host`:`port` (0 picks a port); the default address and bounds are
        the settings' (`Settings.health_host`, ...), not this class's."""
        self.live = threading.Event()
        self.ready = threading.Event()
        self.leading = threading.Event()
        outer = self

        class Handler(connlimit.Handler):
            def do_GET(self) -> None:  # the stdlib's name
                if self.path == "/healthz":
                    self._reply(200 if outer.live.is_set() else 503, b"ok\n" if outer.live.is_set() else b"down\n")
                elif self.path == "/readyz":
                    ok = outer.ready.is_set()
                    self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
                elif self.path == "/leaderz":
                    ok = outer.leading.is_set()
                    self._reply(200 if ok else 503, b"leading\n" if ok else b"not leading\n")
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = connlimit.Server((host, port), Handler, limit=max_connections, seconds=connection_seconds,
                                       name="health")
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
