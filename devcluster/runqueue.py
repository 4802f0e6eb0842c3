"""The run queue beside the local cluster: the reference backend (refbackend/) as a real
process, as an operator runs it.

`Backend` starts `python -m refbackend` on a loopback port (or the node's address, where the
dispatcher's pod and the driver pods must reach it) with a SQLite file of its own and speaks its
HTTP API with the service token; it stops on `close()` and on leaving a `with` block. `make demo`
and the tests use it; nothing here is a stand-in. The dispatcher runs as the release's pod
(devcluster/dispatcher_pod.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
SERVICE_TOKEN = "svc-" + "0123456789abcdef"  # the local backend's service token: a local, throwaway secret


class Client:
    """The reference backend's HTTP API, with the service token (a run's own where a driver speaks)."""

    def __init__(self, url: str, token: str = SERVICE_TOKEN) -> None:
        self.url, self.token = url, token
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.address = (host, int(port))

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token if token is None else token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            e.close()
            return e.code, json.loads(raw) if raw else None

    def _ok(self, want: int, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        code, answer = self.call(method, path, body, token=token)
        if code != want:
            raise BackendError(f"refbackend {method} {path}: {code} {answer}")
        return answer

    def enqueue(self, harness: str = "h", launch_request: Any = None, **extra: Any) -> dict[str, str]:
        return dict(self._ok(201, "POST", "/jobs", {"harness": harness, "launch_request": launch_request or {},
                                                    **extra}))

    def get(self, run_id: str) -> dict[str, Any]:
        return dict(self._ok(200, "GET", f"/jobs/{run_id}"))

    def runs(self) -> list[dict[str, Any]]:
        return list(self._ok(200, "GET", "/jobs"))

    def report(self, run: dict[str, str], status: str) -> None:
        """Say what a driver says, with the run's own token."""
        self._ok(200, "POST", f"/jobs/{run['id']}/status", {"status": status}, token=run["token"])

    def limit(self, harness: str, max_parallel: int) -> None:
        """At most MAX_PARALLEL runs of HARNESS claimed at once."""
        self._ok(200, "PUT", f"/harnesses/{harness}", {"max_parallel": max_parallel})


class BackendError(AssertionError):
    """The backend did not answer as expected (an AssertionError, so a test reports it as a failure)."""


class Backend(Client):
    """`python -m refbackend` as a subprocess; FAULTS turns on its test-only fault hooks.

    HOST is the address it binds: loopback by default; the node's address (devcluster/node.py
    NODE_IP) when pods on the local node must reach it (a pod cannot reach the host's loopback)."""

    def __init__(self, *, lease: float = 300.0, faults: bool = False, db: str | None = None,
                 extra_args: tuple[str, ...] = (), host: str = "127.0.0.1") -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="refbackend-")
        env = {**os.environ, "TCAB_BACKEND_SERVICE_TOKEN": SERVICE_TOKEN}
        self.db_path = db or f"{self.dir.name}/runs.db"
        self.stderr_path = pathlib.Path(self.dir.name) / "stderr"
        args = [sys.executable, "-m", "refbackend", "--db", self.db_path, "--lease", str(lease),
                "--host", host, *extra_args]
        if faults:
            args.append("--faults")
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"refbackend did not start: {line!r}; stderr: {self.stderr()[-500:]}")
        super().__init__(line.removeprefix("listening on "))

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()
        errors = self.stderr()
        if errors:
            print("refbackend stderr:\n" + errors[-4000:])  # shown by pytest when a test failed
        self.dir.cleanup()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
