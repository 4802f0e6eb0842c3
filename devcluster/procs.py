"""Which process a recorded process-group id still names: the identity check before a signal.

A process group id read back from a file (a cluster's `pids.json`, the node's host record) is only
a number: once the group is gone, the kernel may hand the same number to any new process (on a
host with `kernel.pid_max` 32768 that happens within hours). So a group is recorded together with
its leader's identity, `<boot id>/<start time>`: the kernel's boot id and the leader's start time
in clock ticks since boot (field 22 of /proc/PID/stat), which no two processes of one boot share
under one pid. The start time counts clock ticks (10 ms at the usual 100 Hz): a number freed and
given out again within one tick would pass for the same process. The kernel hands numbers out in
order, so a reuse needs `kernel.pid_max` numbers taken in between, which a host does not do in
10 ms.

Invariant: a group is signalled only when it is still the one recorded, that is when

- its leader lives with the recorded identity, or
- its leader is gone but members of the group live: the kernel does not hand out a number that is
  still some group's id, so those members are the recorded leader's.

Never: a signal to a group whose leader lives with another identity (a reused number), to a group
recorded in another boot, or to a number that names no group.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import NamedTuple


def _boot_id() -> str:
    return pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (after the command name, which may hold spaces), or None."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()


def identity(pid: int) -> str | None:
    """`<boot id>/<start time>` of the live process PID, or None if there is none."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return f"{_boot_id()}/{fields[19]}"  # field 22 (starttime); fields[0] is field 3 (state)


class Group(NamedTuple):
    """A process group as started: its id and its leader's identity (`identity`)."""

    pgid: int
    id: str


def record(pid: int) -> Group:
    """The group PID leads (a process started in a session of its own), as recorded at its start."""
    return Group(pid, identity(pid) or "")


def _members(pgid: int) -> list[int]:
    """Live processes whose process group is PGID."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[2] == str(pgid) and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def is_ours(pgid: int, recorded: str) -> bool:
    """Whether PGID still names the group whose leader had the identity RECORDED, with a live
    process in it (see the module's invariant)."""
    if not recorded.startswith(_boot_id() + "/"):
        return False  # recorded in another boot: every process of it is gone
    now = identity(pgid)
    if now is not None:
        return now == recorded and bool(_members(pgid))
    return bool(_members(pgid))


def signal_group(pgid: int, recorded: str, sig: int) -> bool:
    """Send SIG to the group if it is still the one recorded; whether it was sent."""
    if not is_ours(pgid, recorded):
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int, recorded: str, *, grace: float) -> None:
    """SIGTERM the group if it is still the one recorded, SIGKILL what is left of it after GRACE
    seconds (asked again before the SIGKILL: the number may have been given out meanwhile)."""
    if not signal_group(pgid, recorded, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_ours(pgid, recorded):
            return
        time.sleep(0.1)
    signal_group(pgid, recorded, signal.SIGKILL)
