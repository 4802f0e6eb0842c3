"""The heartbeat the dispatcher's liveness probe reads (`dispatcher.alive`).

The loop calls `beat` once per turn; the file's mtime is set (one utime, or a create when the file
is missing: the first beat, or someone removed it) at most once per `EVERY` seconds, however fast
the loop turns. The loop never waits longer than a second for its inbox, so on a turning loop the
file is at most about EVERY + 1 seconds old; an age far past that means the loop has stopped, which
is what the probe's --max-age catches. A failed touch is logged once per run of failures and
otherwise ignored: the probe, seeing the file go stale, is what acts on it.
"""

from __future__ import annotations

import logging
import pathlib

from dispatcher import logs

log = logging.getLogger("dispatcher")

EVERY = 1.0  # seconds between touches at most


class Heartbeat:
    def __init__(self, path: str) -> None:
        self.path = pathlib.Path(path)
        self.last: float | None = None  # monotonic time of the last touch tried
        self.failing = False

    def beat(self, now: float) -> None:
        """Touch the file if EVERY seconds have passed since the last touch (NOW is monotonic)."""
        if self.last is not None and now - self.last < EVERY:
            return
        self.last = now
        try:
            self.path.touch()
        except OSError as e:
            if not self.failing:
                log.error("heartbeat not written", extra=logs.fields(path=str(self.path), error=e.strerror))
            self.failing = True
            return
        if self.failing:
            log.info("heartbeat written again", extra=logs.fields(path=str(self.path)))
        self.failing = False
