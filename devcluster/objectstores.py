"""Real object-store servers on this machine, for the checkpoint fence's tests
and bench (tests/checkpoint/, bench/checkpoint-s3).

Built from their Go modules by devcluster/build-object-stores.sh (pinned,
cached in the user cache, quick once built):

- `S3Server`: versitygw over a temporary directory (a bucket is a directory);
  `versitygw` 1.8.0 honours If-None-Match: * and If-Match on PutObject,
  `versitygw-1.0.14` ignores both.
- `GCSServer`: fake-gcs-server in memory; 1.56.1 honours ifGenerationMatch on
  its JSON API, `fake-gcs-server-1.17.0` ignores it.

Each listens on 127.0.0.1 on an ephemeral port (an `S3Server` on another
address of this machine when given one: `make demo` serves the local cluster's
pods at the node's address) and runs in a session of its own until
`stop()`/`close()`. `env` is what configures a client for it, the
way a training pod's environment does: explicit local credentials and the
local endpoint, and the cloud metadata addresses pointed at a closed port of
this machine, so nothing is ever sent anywhere else.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

BUILD = pathlib.Path(__file__).resolve().parent / "build-object-stores.sh"
BUCKET = "ckpt"
WAIT = 30.0
# The metadata services' addresses, for any client that would look: a closed port on this machine.
NO_METADATA = {"GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
               "AWS_EC2_METADATA_DISABLED": "true", "AWS_METADATA_ENDPOINT": "http://127.0.0.1:9"}
CLIENT_VARS = ("AWS_", "GOOGLE_", "GCE_", "STORAGE_EMULATOR_HOST", "CLOUDSDK_")

_bin_dirs: dict[tuple[str, ...], pathlib.Path] = {}


def bin_dir(*names: str) -> pathlib.Path:
    """The servers' bin directory (builds what is missing of NAMES, or of every server; fails the
    test when it cannot)."""
    if names not in _bin_dirs:
        out = subprocess.run(["bash", str(BUILD), *names], capture_output=True, text=True, timeout=1800, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"devcluster/{BUILD.name} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        _bin_dirs[names] = pathlib.Path(out.stdout.splitlines()[-1])
    return _bin_dirs[names]


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This process's environment without any object-store client's configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_VARS)}


class Server:
    """A server process on 127.0.0.1:port; `env` configures a client for it."""

    scheme = ""
    binary = ""
    needs: tuple[str, ...] = ()  # what to build before it starts: every server (the suites use them all)

    def __init__(self, binary: str | None = None, *, host: str = "127.0.0.1") -> None:
        self.binary = binary or self.binary
        self.host = host
        self.work = pathlib.Path(tempfile.mkdtemp(prefix=f"fence-{self.binary}-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}

    def argv(self) -> list[str]:
        raise NotImplementedError

    def server_env(self) -> dict[str, str]:
        return {}

    def client_env(self) -> dict[str, str]:
        raise NotImplementedError

    def add_bucket(self, name: str) -> None:
        raise NotImplementedError

    def start(self) -> Server:
        path = bin_dir(*self.needs) / self.binary
        for _ in range(5):  # another process may take the port between probing and binding
            self.port = _free_port(self.host)
            log = open(self.work / "server.log", "ab")
            self.proc = subprocess.Popen([str(path), *self.argv()], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**clean_env(), **self.server_env()},
                                         start_new_session=True)
            log.close()
            if self._wait_listening():
                self.env = self.client_env()
                self.add_bucket(BUCKET)
                return self
            self.stop()
        raise RuntimeError(f"{self.binary} did not start: {(self.work / 'server.log').read_text()[-2000:]}")

    def _wait_listening(self) -> bool:
        deadline = time.monotonic() + WAIT
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        subprocess.run(["rm", "-rf", str(self.work)], check=False)

    def root(self, name: str | None = None) -> str:
        """A fresh root URL in the server's bucket."""
        return f"{self.scheme}://{BUCKET}/{name or 'run-' + uuid.uuid4().hex[:12]}"


class S3Server(Server):
    scheme = "s3"
    binary = "versitygw"
    KEY, SECRET = "fence-test", "fence-test-secret"

    def __init__(self, binary: str | None = None, *, host: str = "127.0.0.1", key: str | None = None,
                 secret: str | None = None) -> None:
        super().__init__(binary, host=host)
        self.KEY, self.SECRET = key or self.KEY, secret or self.SECRET

    def argv(self) -> list[str]:
        return ["--port", f"{self.host}:{self.port}", "posix", str(self.work / "data")]

    def server_env(self) -> dict[str, str]:
        return {"ROOT_ACCESS_KEY": self.KEY, "ROOT_SECRET_KEY": self.SECRET}

    def add_bucket(self, name: str) -> None:
        (self.work / "data" / name).mkdir(parents=True, exist_ok=True)  # versitygw's posix backend: a directory

    def client_env(self) -> dict[str, str]:
        return {**NO_METADATA, "AWS_ACCESS_KEY_ID": self.KEY, "AWS_SECRET_ACCESS_KEY": self.SECRET,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{self.host}:{self.port}",
                "AWS_ALLOW_HTTP": "true"}

    def start(self) -> Server:
        (self.work / "data").mkdir(exist_ok=True)
        return super().start()


class GCSServer(Server):
    scheme = "gs"
    binary = "fake-gcs-server"

    def argv(self) -> list[str]:
        url = f"http://127.0.0.1:{self.port}"
        return ["-backend", "memory", "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-public-host", f"127.0.0.1:{self.port}", "-external-url", url]

    def add_bucket(self, name: str) -> None:
        url = f"http://127.0.0.1:{self.port}"
        req = urllib.request.Request(f"{url}/storage/v1/b?project=fence-test", method="POST",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + WAIT
        while True:
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    r.read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def client_env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}"
        return {**NO_METADATA, "STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": "fence-test"}


SERVERS = {"s3": S3Server, "gcs": GCSServer}
WITHOUT_CONDITIONAL_WRITES = {"s3": "versitygw-1.0.14", "gcs": "fake-gcs-server-1.17.0"}
