"""`install.ours_outside_pods`, what the demo checks before it says that only the kubelet's pods
run our controller and dispatcher: a process tree laid out as /proc lays it out (cmdline NUL
separated, one cgroup line per hierarchy), since making a real host process of ours outside a pod
and a real pod beside it is what the demo itself does."""

from __future__ import annotations

import pathlib

from devcluster import install, node

POD_CGROUP = f"/{node.CGROUP_ROOT}/kubepods/burstable/pod0123/c0ffee"


def _process(proc: pathlib.Path, pid: int, argv: list[str], cgroup: str) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (entry / "cgroup").write_text(f"9:name=systemd:{cgroup}\n8:pids:{cgroup}\n")


def test_only_processes_of_ours_outside_the_pods_are_named(tmp_path: pathlib.Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # not a process number: skipped
    _process(proc, 10, ["/usr/bin/python3.11", "-S", "-E", "-B", "-m", "controller"], POD_CGROUP)
    _process(proc, 11, ["/usr/bin/python3.11", "-S", "-E", "-B", "-m", "dispatcher"], POD_CGROUP)
    _process(proc, 12, ["/usr/bin/python3", "-m", "pytest", "tests/controller"], "/user.slice/session-1.scope")
    _process(proc, 13, ["vim", "controller/app.py"], "/user.slice/session-1.scope")
    assert install.ours_outside_pods(proc) == []
    _process(proc, 20, [".venv/bin/python", "-m", "controller", "--kubeconfig", "k"], "/user.slice/session-1.scope")
    _process(proc, 21, [".venv/bin/python", "-m", "dispatcher"], f"/{node.CGROUP_ROOT}/kubepodsish")
    assert sorted(install.ours_outside_pods(proc)) == [
        "20: .venv/bin/python -m controller --kubeconfig k", "21: .venv/bin/python -m dispatcher"]
