"""Property: any interleaving of publishes from several executions, with random
epochs and some publishers killed (SIGKILL) at random points, ends with LATEST
naming the highest epoch that committed; LATEST is never torn; a checkpoint
is never replaced, never half there, and never removed except by retention
(with at least `keep` newer ones present); a refused publish touches nothing.

Every publish is a real process, `python -m dispatch_fence publish`, run
with the module's test hook (TEST_HOOK_FD): at each named step it writes the
step's name to a socket and waits for one byte. The test is the scheduler:
hypothesis chooses, at every turn, which stopped publisher goes on and which
is killed (a stopped one, or one blocked in flock waiting for the lock), and
the root is checked after every turn. Who gets the lock after its holder
exits or dies is the kernel's choice; the scheduler waits for the one that
announces it holds it.

A SIGKILL is a process crash: the page cache survives it. Power loss is
argued, step by step, in docs/checkpoint.md (what each fsync is for).
"""

from __future__ import annotations

import os
import pathlib
import re
import select
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dispatch_fence import checkpoint
from tests.checkpoint import kit

WAIT = 20.0  # seconds for any one event; a hang fails the example instead of the suite's timeout
COMMITTED = {"replaced", "pruning", "done"}  # steps announced after LATEST was replaced


@dataclass
class Publisher:
    index: int
    epoch: int
    staging: pathlib.Path
    popen: subprocess.Popen[bytes]
    sock: socket.socket
    step: str = ""  # the last step announced
    state: str = "running"  # running | at (stopped at `step`) | blocked (in flock) | exited | killed
    returncode: int | None = None
    blocked: bool = False  # was in flock when killed
    stdout: str = ""
    stderr: str = ""
    original: dict[str, str | None] = field(default_factory=dict)

    @property
    def attempt(self) -> str:
        return token(self.index)

    @property
    def committed(self) -> bool:
        return self.returncode == 0 or self.step in COMMITTED


def token(i: int) -> str:
    return f"job.1.0.{i + 1}.0"


class Schedule:
    """The publishers of one example and the lock's holder, as the scheduler knows them."""

    def __init__(self, work: pathlib.Path, epochs: list[int], keep: int | None) -> None:
        self.root = work / "root"
        self.keep = keep
        self.holder: Publisher | None = None
        self.commits: list[Publisher] = []  # in commit order (commits are serialized by the lock)
        self.procs: list[Publisher] = []
        for i, epoch in enumerate(epochs):
            staging = kit.staging(work, token(i))
            ours, theirs = socket.socketpair()
            args = [sys.executable, "-m", "dispatch_fence", "publish", str(staging), str(self.root)]
            if keep is not None:
                args += ["--keep", str(keep)]
            env = {**os.environ, **kit.env(epoch, token(i)), checkpoint.TEST_HOOK_FD: str(theirs.fileno())}
            popen = subprocess.Popen(args, env=env, pass_fds=[theirs.fileno()], cwd=kit.REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            theirs.close()
            self.procs.append(Publisher(i, epoch, staging, popen, ours, original=kit.tree(staging)))

    # -- events ---------------------------------------------------------

    def _event(self, p: Publisher) -> None:
        """P's next event: a step announced (P stops there) or its end (EOF)."""
        ready, _, _ = select.select([p.sock], [], [], WAIT)
        assert ready, f"publisher {p.index} silent for {WAIT} s at {p.step or 'start'}"
        data = p.sock.recv(64)
        if not data:
            self._finish(p, killed=False)
            return
        step = data.decode().strip()
        assert step in checkpoint.STEPS and "\n" not in step, data
        p.step, p.state = step, "at"
        if step == "locked":
            assert self.holder is None or self.holder is p, "two publishers hold the lock"
            self.holder = p
        if step == "replaced":
            self.commits.append(p)

    def _finish(self, p: Publisher, *, killed: bool) -> None:
        if killed:
            p.popen.kill()
        out, err = p.popen.communicate(timeout=WAIT)
        p.returncode, p.stdout, p.stderr = p.popen.returncode, out.decode(), err.decode()
        p.state = "killed" if killed else "exited"
        p.sock.close()
        if p.returncode == 0 and p not in self.commits:
            self.commits.append(p)  # cannot happen: a publish exits 0 only after "replaced"
        if self.holder is p:
            self.holder = None
            self._hand_off()

    def _hand_off(self) -> None:
        """The lock is free: if anyone waits in flock, the one the kernel lets in announces `locked`."""
        waiting = [p for p in self.procs if p.state == "blocked"]
        if not waiting:
            return
        ready, _, _ = select.select([p.sock for p in waiting], [], [], WAIT)
        assert ready, "the lock was released but no waiter took it"
        winner = next(p for p in waiting if p.sock is ready[0])
        self._event(winner)
        assert winner.step == "locked" and self.holder is winner

    # -- actions --------------------------------------------------------

    def start(self) -> None:
        for p in self.procs:
            self._event(p)
            assert p.step == "staged", (p.step, p.stderr)

    def go(self, p: Publisher) -> None:
        assert p.state == "at"
        if p.step == "staged" and self.holder is not None:
            p.sock.sendall(b"g")
            p.state = "blocked"  # in flock until the holder is gone: the kernel must show it waiting
            self._wait_blocked(p)
            return
        p.sock.sendall(b"g")
        p.state = "running"
        self._event(p)

    def _wait_blocked(self, p: Publisher) -> None:
        """P waits in flock: /proc/locks lists it as a blocked waiter (`N: -> FLOCK ... PID ...`).
        A publisher that announces `locked` instead got a lock someone else holds."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([p.sock], [], [], 0.002)
            assert not ready, f"publisher {p.index} went past flock while {self.holder.index} holds the lock"  # type: ignore[union-attr]
            with open("/proc/locks") as f:
                if any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(p.popen.pid) for line in f):
                    return
        raise AssertionError(f"publisher {p.index} never blocked in flock")

    def kill(self, p: Publisher) -> None:
        assert p.state in ("at", "blocked")
        p.blocked = p.state == "blocked"
        self._finish(p, killed=True)

    def options(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for p in self.procs:
            if p.state == "at":
                out += [(p.index, "go")] * 8
            if p.state in ("at", "blocked"):
                out.append((p.index, "kill"))
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.state not in ("exited", "killed"):
                p.popen.kill()
                p.popen.communicate(timeout=WAIT)
                p.sock.close()


class Observer:
    """The root's state after each turn, checked against the one before it."""

    def __init__(self, root: pathlib.Path, keep: int | None) -> None:
        self.root, self.keep = root, keep
        self.seen: dict[str, str] = {}  # checkpoint name -> its model's content, once seen
        self.latest_epoch = 0

    def check(self) -> dict[str, str | None]:
        names = {}
        present = []
        if self.root.exists():
            for name in os.listdir(self.root):
                c = checkpoint.parse_name(str(self.root), name)
                if c is None:
                    assert name in (checkpoint.LATEST, checkpoint.LOCK) or name.startswith((".LATEST.", ".trash-")), name
                    continue
                d = self.root / name
                # Never half a checkpoint under a checkpoint's name.
                assert sorted(os.listdir(d)) == [checkpoint.MARKER, "model.bin", "shards"], name
                content = (d / "model.bin").read_text()
                assert content == c.attempt and (d / "shards" / "0.bin").read_text() == content * 3, name
                assert self.seen.setdefault(name, content) == content, f"{name} was replaced"
                names[name] = content
                present.append(c)
        for name in set(self.seen) - set(names):
            gone = checkpoint.parse_name(str(self.root), name)
            assert gone is not None and self.keep is not None, f"{name} was removed without retention"
            newer = [c for c in present if c.key > gone.key]
            assert len(newer) >= self.keep, f"{name} removed with only {len(newer)} newer ones"
        latest = self.root / checkpoint.LATEST
        if latest.exists():
            raw = latest.read_bytes()
            assert re.fullmatch(rb"ckpt-[0-9]{19}-[0-9]{6,}-[!-.0-~]+\n", raw), f"torn LATEST {raw!r}"
            name = raw.decode()[:-1]
            assert name in names, f"LATEST names {name}, which is not a whole checkpoint"
            c = checkpoint.parse_name(str(self.root), name)
            assert c is not None and c.epoch >= self.latest_epoch, "LATEST went back"
            self.latest_epoch = c.epoch
        return kit.tree(self.root)


@st.composite
def examples(draw: st.DrawFn) -> tuple[list[int], int | None]:
    n = draw(st.integers(min_value=2, max_value=5))
    epochs = draw(st.lists(st.integers(min_value=1, max_value=4), min_size=n, max_size=n))
    keep = draw(st.sampled_from([None, 1, 2, 3]))
    return epochs, keep


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(example=examples(), data=st.data())
def test_any_interleaving_with_crashes_ends_with_the_highest_committed_epoch(
    tmp_path: pathlib.Path, example: tuple[list[int], int | None], data: st.DataObject
) -> None:
    epochs, keep = example
    work = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    sched = Schedule(work, epochs, keep)
    observer = Observer(sched.root, keep)
    try:
        sched.start()
        observer.check()
        while options := sched.options():
            index, action = data.draw(st.sampled_from(options), label="turn")
            p = sched.procs[index]
            before = kit.tree(sched.root)
            was_holder = sched.holder is p
            if action == "go":
                sched.go(p)
            else:
                sched.kill(p)
            after = observer.check()
            if keep is not None and p.state == "at" and p.step == "done":
                # Its prune is over: no more than `keep` checkpoints (the rest were the oldest, as check() holds).
                assert len(checkpoint.checkpoints(str(sched.root))) <= keep
            if p.returncode == 1:
                assert was_holder, "refused without holding the lock"
                assert after == before, "a refused publish changed the root"
    finally:
        sched.close()

    for p in sched.procs:
        assert p.state in ("exited", "killed")
        if p.state == "exited":
            assert p.returncode in (0, 1), (p.returncode, p.stderr)
        if p.returncode == 1:
            line = p.stderr
            m = re.fullmatch(r"python -m dispatch_fence publish: epoch (\d+) is lower than epoch (\d+) \(\S+\) in \S+: .*\n", line)
            assert m and int(m.group(1)) == p.epoch and int(m.group(2)) > p.epoch, line
        if p.returncode == 0:
            assert p.stderr == "" and p.stdout.startswith(str(sched.root / "ckpt-"))
        # Nothing lost: a publisher stopped before its rename still has its staging, whole.
        moved = p.returncode == 0 or p.step in {"moved", "written"} | COMMITTED
        assert kit.tree(p.staging) == ({} if moved else p.original), (p.index, p.step, p.returncode)

    for p in sched.procs:
        event(f"outcome: {p.state} {p.returncode if p.state == 'exited' else 'at ' + p.step}"
              + (" (waiting for the lock)" if p.state == "killed" and p.step == "staged" and p.blocked else ""))
    latest = checkpoint.latest(str(sched.root))
    if not sched.commits:
        assert latest is None
    else:
        last = sched.commits[-1]
        assert latest is not None and latest.attempt == last.attempt
        assert latest.epoch == max(p.epoch for p in sched.commits)
    if keep is None:
        # No retention: every checkpoint that was ever renamed in is still there.
        assert set(observer.seen) == {c.name for c in checkpoint.checkpoints(str(sched.root))}
