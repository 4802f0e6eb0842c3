"""A recorded process-group id is signalled only while it names the group recorded
(devcluster/procs.py): not once the kernel gave the number to another process, nor when it was
recorded in another boot; while the group's members outlive its leader, it still is ours.

Real processes in a PID namespace of their own (`unshare --pid --fork --mount-proc`), where
nothing else takes numbers: a number is handed out again for certain by setting the namespace's
`ns_last_pid`, as a busy host with `kernel.pid_max` 32768 does by itself within hours.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

INSIDE = r"""
import os, pathlib, signal, subprocess, sys, time
from devcluster import procs

def group(*argv):
    return subprocess.Popen(list(argv), start_new_session=True)

def gone(pid):
    deadline = time.monotonic() + 10
    while pathlib.Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

first = group("sleep", "300")
recorded = procs.identity(first.pid)
assert recorded and procs.is_ours(first.pid, recorded)
first.kill(); first.wait()
assert not procs.is_ours(first.pid, recorded)
time.sleep(0.05)  # start times count clock ticks (10 ms): the reuse below happens in a later one
assert not procs.signal_group(first.pid, recorded, signal.SIGKILL)

# The same number, given to a new group leader.
pathlib.Path("/proc/sys/kernel/ns_last_pid").write_text(str(first.pid - 1))
second = group("sleep", "300")
assert second.pid == first.pid, (second.pid, first.pid)
assert not procs.is_ours(second.pid, recorded)
assert not procs.signal_group(second.pid, recorded, signal.SIGKILL)
procs.stop_group(second.pid, recorded, grace=1.0)
assert second.poll() is None, "a reused number was signalled"
assert procs.is_ours(second.pid, procs.identity(second.pid))

# Recorded in another boot: never ours, whatever the start time.
other_boot = "00000000-0000-0000-0000-000000000000/" + recorded.split("/", 1)[1]
assert not procs.is_ours(second.pid, other_boot)
second.kill(); second.wait()

# The leader exits, a member lives on in its group: still the group recorded, and stopped.
leader = group("sh", "-c", "sleep 300 & exit 0")
recorded = procs.identity(leader.pid)
leader.wait()
assert procs.is_ours(leader.pid, recorded)
procs.stop_group(leader.pid, recorded, grace=5.0)
time.sleep(0.2)
assert not procs.is_ours(leader.pid, recorded)
print("ok")
"""


def test_a_reused_number_is_not_signalled_and_a_leaderless_group_is() -> None:
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INSIDE],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
