"""The reference backend as a real subprocess over real HTTP, for tests and the bench.

`Backend()` starts `python -m refbackend` with `--faults` (the fault hooks the
dispatcher's fault tests use); pass `faults=False` for a backend started as an
operator would start it. `db=` points a second server at the first one's
SQLite file (two processes, one table).
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import socket
import sqlite3
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVICE_TOKEN = "svc-" + "0123456789abcdef"


class Client:
    """Speaks to a running server (the helpers below need only its URL and the service token)."""

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

    def enqueue(self, harness: str = "h", launch_request: Any = None, **extra: Any) -> dict[str, str]:
        code, body = self.call("POST", "/jobs", {"harness": harness, "launch_request": launch_request or {}, **extra})
        assert code == 201, (code, body)
        return dict(body)

    def get(self, run_id: str) -> dict[str, Any]:
        code, body = self.call("GET", f"/jobs/{run_id}")
        assert code == 200, (code, body)
        return dict(body)

    def runs(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/jobs")[1])

    def report(self, run: dict[str, str], status: str) -> None:
        """Say what a driver says, with the run's own token."""
        code, body = self.call("POST", f"/jobs/{run['id']}/status", {"status": status}, token=run["token"])
        assert code == 200, (code, body)

    def fault(self, **fault: Any) -> None:
        assert self.call("POST", "/_faults", fault)[0] == 200

    def faults(self) -> dict[str, Any]:
        """{"faults": [those left], "hits": {"next": N, "status": N}}."""
        code, body = self.call("GET", "/_faults")
        assert code == 200, (code, body)
        return dict(body)


class Backend(Client):
    def __init__(self, *, lease: float = 300.0, faults: bool = True, db: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="refbackend-")
        env = {**os.environ, "TCAB_BACKEND_SERVICE_TOKEN": SERVICE_TOKEN}
        self.db_path = db or f"{self.dir.name}/runs.db"
        self.stderr_path = pathlib.Path(self.dir.name) / "stderr"
        args = [sys.executable, "-m", "refbackend", "--db", self.db_path, "--lease", str(lease), *extra_args]
        if faults:
            args.append("--faults")
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"refbackend did not start: {line!r}")
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
            print("refbackend stderr:\n" + errors[-4000:])  # shown by pytest when the test failed
        self.dir.cleanup()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def dump(self) -> list[str]:
        """Every table of the SQLite file, as SQL, read through a connection of our own."""
        db = sqlite3.connect(self.db_path, timeout=30)
        try:
            return list(db.iterdump())
        finally:
            db.close()
