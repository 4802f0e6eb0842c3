"""The dispatcher's liveness probe: `python -m dispatcher.alive --max-age SECONDS FILE`.

The dispatcher binds no socket, so the kubelet cannot ask it over HTTP; instead its loop
touches a heartbeat file (TCAB_DISPATCHER_HEARTBEAT_FILE, on an emptyDir: the root filesystem is
read-only) and the Deployment's exec livenessProbe runs this in the dispatcher's own image (which
has no shell). Exit 0 when the file was modified within SECONDS; 1 with one line when it is stale
or missing (the loop stopped turning); 2 with one line for a bad command line.

It runs every probe period, so it imports as little as it can: the standard library's os, sys and
time, and the settings' one parser of seconds (toolkit.envparse). Its cost is in docs/benchmarks.md.
"""

from __future__ import annotations

import os
import sys
import time

from toolkit import envparse

USAGE = "usage: python -m dispatcher.alive --max-age SECONDS FILE"
MAX_AGE_LOW = 1.0
MAX_AGE_HIGH = 86_400.0


def check(path: str, *, max_age: float, now: float) -> str | None:
    """None when PATH was modified within MAX_AGE seconds of NOW (wall clock), else why not."""
    try:
        modified = os.stat(path).st_mtime
    except FileNotFoundError:
        return f"heartbeat {path} does not exist"
    except OSError as e:
        return f"heartbeat {path} cannot be read: {e.strerror}"
    age = now - modified
    if age > max_age:
        return f"heartbeat {path} is {age:.1f}s old, more than --max-age {max_age:g}s"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "--max-age":
        print(f"dispatcher.alive: {USAGE}", file=sys.stderr)
        return 2
    try:
        max_age = envparse.seconds(argv[1], low=MAX_AGE_LOW, high=MAX_AGE_HIGH)
    except ValueError:  # Malformed or OutOfRange
        print(f"dispatcher.alive: --max-age={argv[1]!r} is not a number of seconds in "
              f"{MAX_AGE_LOW:g}..{MAX_AGE_HIGH:g}", file=sys.stderr)
        return 2
    problem = check(argv[2], max_age=max_age, now=time.time())
    if problem is not None:
        print(f"dispatcher.alive: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
