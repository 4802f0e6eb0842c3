"""The dispatcher's liveness probe, `python -m dispatcher.alive --max-age SECONDS FILE`, run as the
kubelet runs it: a real process (the interpreter as the image starts it: -S -E -B), judged by its
exit code and its one line. The loop that keeps the file fresh is tested in test_loop.py."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-S", "-E", "-B", "-m", "dispatcher.alive", *args], cwd=REPO,
                          env={"PATH": "/usr/bin"}, capture_output=True, text=True, timeout=60, check=False)


def test_a_fresh_heartbeat_is_alive_silently(tmp_path: pathlib.Path) -> None:
    beat = tmp_path / "alive"
    beat.touch()
    done = probe("--max-age", "30", str(beat))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_stale_heartbeat_fails_in_one_line_with_its_age(tmp_path: pathlib.Path) -> None:
    beat = tmp_path / "alive"
    beat.touch()
    old = time.time() - 90
    os.utime(beat, (old, old))
    done = probe("--max-age", "60", str(beat))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"dispatcher.alive: heartbeat {beat} is 9")
    assert done.stderr.endswith("s old, more than --max-age 60s\n") and done.stderr.count("\n") == 1


def test_a_missing_heartbeat_fails_in_one_line(tmp_path: pathlib.Path) -> None:
    done = probe("--max-age", "60", str(tmp_path / "alive"))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"dispatcher.alive: heartbeat {tmp_path / 'alive'} does not exist\n"


@pytest.mark.parametrize("max_age", ["0", "-5", "ten", "nan", "inf", "86401"])
def test_a_bad_max_age_is_one_line_naming_the_option_and_its_bounds_and_exit_2(
        tmp_path: pathlib.Path, max_age: str) -> None:
    beat = tmp_path / "alive"
    beat.touch()
    done = probe("--max-age", max_age, str(beat))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"dispatcher.alive: --max-age={max_age!r} is not a number of seconds in 1..86400\n"


@pytest.mark.parametrize("args", [(), ("--max-age", "60"), ("60", "/tmp/alive"), ("--max-age", "60", "a", "b")])
def test_a_bad_command_line_is_the_usage_in_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = probe(*args)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "dispatcher.alive: usage: python -m dispatcher.alive --max-age SECONDS FILE\n"
