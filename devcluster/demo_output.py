"""What `make demo` prints and how it fails, shared by its stages (devcluster/demo.py and the modules
of single stages, such as devcluster/demo_dispatch.py).

`say` prints one line stamped with the seconds since the demo began; `expect` ends the demo with
`Failed` (one `demo: FAILED` line, exit 1) when an expected outcome was not observed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from devcluster import polling

_T0 = time.monotonic()


class Failed(Exception):
    """An expected outcome was not observed."""


def say(text: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {text}", flush=True)


def expect(ok: object, what: str) -> None:
    if not ok:
        raise Failed(what)


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 60) -> None:
    polling.until(what, predicate, timeout=timeout, error=Failed)
