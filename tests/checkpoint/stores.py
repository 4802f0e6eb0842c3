"""Real object-store servers for the fence's tests, and a publisher process the
test drives step by step.

The servers are built from their Go modules by scripts/build-object-stores.sh
(pinned, cached in the user cache; `make test` builds them first, and a fixture
runs the script too, which is quick once built). Each listens on 127.0.0.1 on an
ephemeral port, is started by a fixture and stopped after it:

- `S3Server`: versitygw over a temporary directory (a bucket is a directory);
  `versitygw` 1.8.0 honours If-None-Match: * and If-Match, `versitygw-1.0.14`
  ignores both.
- `GCSServer`: fake-gcs-server in memory; 1.56.1 honours ifGenerationMatch on
  its JSON API, `fake-gcs-server-1.17.0` ignores it.

Every client gets explicit local credentials and endpoints through the
environment (`Server.env`), the way a training pod gets them; the cloud metadata
addresses are pointed at a closed port of this machine, so nothing is ever sent
anywhere else.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping

from tests.checkpoint import kit

BUILD = kit.REPO / "scripts" / "build-object-stores.sh"
BUCKET = "ckpt"
WAIT = 30.0
# The metadata services' addresses, for any client that would look: a closed port on this machine.
NO_METADATA = {"GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
               "AWS_EC2_METADATA_DISABLED": "true", "AWS_METADATA_ENDPOINT": "http://127.0.0.1:9"}
CLIENT_VARS = ("AWS_", "GOOGLE_", "GCE_", "STORAGE_EMULATOR_HOST", "CLOUDSDK_")

_bin_dir: pathlib.Path | None = None


def bin_dir() -> pathlib.Path:
    """The servers' bin directory (builds what is missing; fails the test when it cannot)."""
    global _bin_dir
    if _bin_dir is None:
        out = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{BUILD.name} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        _bin_dir = pathlib.Path(out.stdout.splitlines()[-1])
    return _bin_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This process's environment without any object-store client's configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_VARS)}


class Server:
    """A server process on 127.0.0.1:port; `env` configures a client for it."""

    scheme = ""
    binary = ""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or self.binary
        self.work = pathlib.Path(tempfile.mkdtemp(prefix=f"fence-{self.binary}-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}

    def argv(self) -> list[str]:
        raise NotImplementedError

    def server_env(self) -> dict[str, str]:
        return {}

    def make_bucket(self) -> None:
        raise NotImplementedError

    def start(self) -> Server:
        path = bin_dir() / self.binary
        for _ in range(5):  # another process may take the port between probing and binding
            self.port = _free_port()
            log = open(self.work / "server.log", "ab")
            self.proc = subprocess.Popen([str(path), *self.argv()], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**clean_env(), **self.server_env()},
                                         start_new_session=True)
            log.close()
            if self._wait_listening():
                self.make_bucket()
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
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
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

    def argv(self) -> list[str]:
        return ["--port", f"127.0.0.1:{self.port}", "posix", str(self.work / "data")]

    def server_env(self) -> dict[str, str]:
        return {"ROOT_ACCESS_KEY": self.KEY, "ROOT_SECRET_KEY": self.SECRET}

    def make_bucket(self) -> None:
        (self.work / "data" / BUCKET).mkdir(parents=True, exist_ok=True)  # versitygw's posix backend: a directory
        self.env = {**NO_METADATA, "AWS_ACCESS_KEY_ID": self.KEY, "AWS_SECRET_ACCESS_KEY": self.SECRET,
                    "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
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

    def make_bucket(self) -> None:
        url = f"http://127.0.0.1:{self.port}"
        req = urllib.request.Request(f"{url}/storage/v1/b?project=fence-test", method="POST",
                                     data=json.dumps({"name": BUCKET}).encode(),
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
        self.env = {**NO_METADATA, "STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": "fence-test"}


SERVERS = {"s3": S3Server, "gcs": GCSServer}
WITHOUT_CONDITIONAL_WRITES = {"s3": "versitygw-1.0.14", "gcs": "fake-gcs-server-1.17.0"}


class Publisher:
    """`python -m dispatch_fence publish` as a process with the test hook: it stops at every step
    (objectstore.STEPS) until let go, and can be killed there."""

    def __init__(self, staging: pathlib.Path, root: str, *, epoch: int, attempt: str,
                 env: Mapping[str, str], keep: int | None = None, hooked: bool = True) -> None:
        self.epoch, self.attempt = epoch, attempt
        args = [sys.executable, "-m", "dispatch_fence", "publish", str(staging), root,
                "--epoch", str(epoch), "--attempt", attempt] + (["--keep", str(keep)] if keep else [])
        full = {**clean_env(), **env}
        self.sock: socket.socket | None = None
        fds: tuple[int, ...] = ()
        if hooked:
            self.sock, child = socket.socketpair()
            full["DISPATCH_CHECKPOINT_TEST_HOOK_FD"] = str(child.fileno())
            fds = (child.fileno(),)
        self.proc = subprocess.Popen(args, env=full, pass_fds=fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=kit.REPO)
        if hooked:
            child.close()
        self.step = ""
        self.steps: list[str] = []

    def next_step(self) -> str | None:
        """Wait for the next step the publisher announces (None: it exited)."""
        assert self.sock is not None
        self.sock.settimeout(WAIT * 2)
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.sock.recv(1)
            if not chunk:
                return None
            line += chunk
        self.step = line.decode().strip()
        self.steps.append(self.step)
        return self.step

    def go(self) -> None:
        assert self.sock is not None
        self.sock.sendall(b"g")

    def run_to(self, step: str) -> None:
        """Let it go until it stops at STEP."""
        while self.step != step:
            if self.step:
                self.go()
            if self.next_step() is None:
                raise AssertionError(f"the publisher exited before {step} (after {self.steps}): {self.finish()}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=WAIT)
        self.close()

    def finish(self) -> tuple[int, str, str]:
        """Let it run to the end; (exit status, stdout, stderr)."""
        if self.sock is not None:
            try:
                while True:
                    if self.step:
                        self.go()
                    if self.next_step() is None:
                        break
            except OSError:
                pass
        out, err = self.proc.communicate(timeout=WAIT * 4)
        self.close()
        return self.proc.returncode, out.decode(), err.decode()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def open_store(server: Server, root: str):  # type: ignore[no-untyped-def]
    """The fence's own store object for ROOT, configured from SERVER's environment only (for
    reading a root's state in a test; it keeps its configuration once made)."""
    from dispatch_fence import objectstore

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({**clean_env(), **server.env})
        return objectstore.open_root(root)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tree(server: Server, root: str) -> dict[str, bytes]:
    """Every object under ROOT: key relative to ROOT -> content."""
    store = open_store(server, root)
    return {key: store.read(key) for key in sorted(store.list_keys(""))}


def latest(server: Server, root: str):  # type: ignore[no-untyped-def]
    """checkpoint.latest(ROOT), read in this process with SERVER's configuration."""
    from dispatch_fence import checkpoint

    open_store(server, root)
    return checkpoint.latest(root)
