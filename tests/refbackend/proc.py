"""The reference backend as a real subprocess over real HTTP, for tests and the bench."""

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

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVICE_TOKEN = "svc-" + "0123456789abcdef"


class Backend:
    def __init__(self, *, lease: float = 300.0) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="refbackend-")
        env = {**os.environ, "TCAB_BACKEND_SERVICE_TOKEN": SERVICE_TOKEN}
        self.stderr_path = pathlib.Path(self.dir.name) / "stderr"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "refbackend", "--db", f"{self.dir.name}/runs.db", "--lease", str(lease)],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"refbackend did not start: {line!r}")
        self.url = line.removeprefix("listening on ")
        self.token = SERVICE_TOKEN

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
            return e.code, json.loads(raw) if raw else None

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

    def fault(self, **fault: Any) -> None:
        assert self.call("POST", "/_faults", fault)[0] == 200

    def faults(self) -> dict[str, Any]:
        """{"faults": [those left], "hits": {"next": N, "status": N}}."""
        code, body = self.call("GET", "/_faults")
        assert code == 200, (code, body)
        return dict(body)
