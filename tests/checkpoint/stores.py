"""Helpers of the object-store tests: a publisher process the test drives step
by step, and a root's state read with the fence's own store objects. The
servers are devcluster/objectstores.py.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Mapping

from devcluster import objectstores
from tests.checkpoint import kit

class Publisher:
    """`python -m dispatch_fence publish` as a process with the test hook: it stops at every step
    (objectstore.STEPS) until let go, and can be killed there."""

    def __init__(self, staging: pathlib.Path, root: str, *, epoch: int, attempt: str,
                 env: Mapping[str, str], keep: int | None = None, hooked: bool = True) -> None:
        self.epoch, self.attempt = epoch, attempt
        args = [sys.executable, "-m", "dispatch_fence", "publish", str(staging), root,
                "--epoch", str(epoch), "--attempt", attempt] + (["--keep", str(keep)] if keep else [])
        full = {**objectstores.clean_env(), **env}
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
        self.sock.settimeout(objectstores.WAIT * 2)
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
        self.proc.communicate(timeout=objectstores.WAIT)
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
        out, err = self.proc.communicate(timeout=objectstores.WAIT * 4)
        self.close()
        return self.proc.returncode, out.decode(), err.decode()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def open_store(server: objectstores.Server, root: str, extra: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
    """The fence's own store object for ROOT, configured from SERVER's environment only, and EXTRA
    (for reading a root's state in a test; it keeps its configuration once made)."""
    from dispatch_fence import objectstore

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({**objectstores.clean_env(), **server.env, **(extra or {})})
        return objectstore.open_root(root)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tree(server: objectstores.Server, root: str) -> dict[str, bytes]:
    """Every object under ROOT: key relative to ROOT -> content."""
    store = open_store(server, root)
    return {key: store.read(key) for key in sorted(store.list_keys(""))}


def latest(server: objectstores.Server, root: str):  # type: ignore[no-untyped-def]
    """checkpoint.latest(ROOT), read in this process with SERVER's configuration."""
    from dispatch_fence import checkpoint

    open_store(server, root)
    return checkpoint.latest(root)
