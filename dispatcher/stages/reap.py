"""A dead run's sandbox pods, reaped in batches (`reaper.reap_many`).

A reap is queued when a driver Job failed or vanished. It waits
`REAP_GATHER_SECONDS` for others to go out with it: its pods are already
dead and hold nothing a run waits for, and the batch costs one label-scoped,
paged list per namespace instead of one per run. A failed batch is retried
whole after its backoff (a pod already deleted is a 404, done).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar

from dispatcher import logs, reaper
from dispatcher.stages import task
from toolkit import kube

if TYPE_CHECKING:
    from dispatcher.app import Dispatcher

log = logging.getLogger("dispatcher")

REAP_GATHER_SECONDS = 0.5


@dataclasses.dataclass(eq=False)
class Reap(task.Task):
    """The sandbox pods of one dead run; stepped in batches (`start_due`), never alone."""

    TABLE: ClassVar[str] = "reaps"


def start_due(d: Dispatcher) -> None:
    """The reaps that are due, `reaper.BATCH` to a task: the first one due takes along every other
    queued within the gather window (not a retry waiting out its backoff)."""
    now = time.monotonic()
    idle = [r for r in d.reaps.values() if not r.busy]
    if not any(r.due <= now for r in idle):
        return
    due = [r for r in idle if r.due <= now + REAP_GATHER_SECONDS]
    for i in range(0, len(due), reaper.BATCH):
        batch = due[i:i + reaper.BATCH]
        for r in batch:
            r.busy = True
        d.submit(reap_batch, lambda future, b=batch: answered(d, future, b), d, batch)


def reap_batch(d: Dispatcher, batch: list[Reap]) -> bool:
    runs = {r.job_id: r.name for r in batch}
    namespaces = tuple(dict.fromkeys((d.config.namespace, d.config.sandbox_namespace)))
    try:
        deleted = reaper.reap_many(d.kube, namespaces=namespaces, runs=runs)
    except kube.ApiError as e:
        log.warning("sandbox reap failed; retrying next tick", extra=logs.fields(jobs=sorted(runs.values()), error=str(e)))
        return False
    for job_id, pods in deleted.items():
        if pods:
            log.info("sandbox pods reaped", extra=logs.fields(job=runs[job_id], job_id=job_id, pods=pods))
    return True


def answered(d: Dispatcher, future: concurrent.futures.Future[Any], batch: list[Reap]) -> None:
    try:
        ok = bool(future.result())
    except Exception as e:  # a bug in one reap must not stop the loop
        log.error("reap step crashed", extra=logs.fields(jobs=[r.name for r in batch], error=repr(e)))
        ok = False
    for r in batch:
        d.settle(r, ok=ok)
