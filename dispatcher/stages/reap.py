"""A dead run's sandbox pods, reaped in batches (`reaper.reap_many`).

A reap is queued when a driver Job failed or vanished. It waits
`REAP_GATHER_SECONDS` for others to go out with it: its pods are already
dead and hold nothing a run waits for, and the batch costs one label-scoped,
paged list per namespace instead of one per run. A failed batch is retried
whole after its backoff (a pod already deleted is a 404, done). A batch
has its `IO` (the Kubernetes client, the namespaces reaped in) on the pool;
its answer settles each reap through the loop's `settle`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from dispatcher import logs, reaper
from dispatcher.stages import task
from toolkit import kube

log = logging.getLogger("dispatcher")

REAP_GATHER_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class IO:
    """What a batch of reaps uses, on the pool."""

    kube: kube.Client
    namespaces: tuple[str, ...]  # the driver Jobs' and the sandbox's, each once


@dataclasses.dataclass(eq=False)
class Reap(task.Task[IO, None]):
    """The sandbox pods of one dead run; stepped in batches (`start_due`), never alone."""

    TABLE: ClassVar[str] = "reaps"


# The loop's settle of one task with its answer: done, or due again after its backoff.
Settle = Callable[[Reap, bool], None]


def start_due(reaps: dict[str, Reap], *, io: IO, submit: task.Submit, settle: Settle) -> None:
    """The reaps that are due, `reaper.BATCH` to a task: the first one due takes along every other
    queued within the gather window (not a retry waiting out its backoff)."""
    now = time.monotonic()
    idle = [r for r in reaps.values() if not r.busy]
    if not any(r.due <= now for r in idle):
        return
    due = [r for r in idle if r.due <= now + REAP_GATHER_SECONDS]
    for i in range(0, len(due), reaper.BATCH):
        batch = due[i:i + reaper.BATCH]
        for r in batch:
            r.busy = True
        submit(reap_batch, lambda future, b=batch: answered(future, batch=b, settle=settle), io, batch)


def reap_batch(io: IO, batch: list[Reap]) -> bool:
    runs = {r.job_id: r.name for r in batch}
    try:
        deleted = reaper.reap_many(io.kube, namespaces=io.namespaces, runs=runs)
    except kube.ApiError as e:
        log.warning("sandbox reap failed; retrying next tick", extra=logs.fields(jobs=sorted(runs.values()), error=str(e)))
        return False
    for job_id, pods in deleted.items():
        if pods:
            log.info("sandbox pods reaped", extra=logs.fields(job=runs[job_id], job_id=job_id, pods=pods))
    return True


def answered(future: concurrent.futures.Future[Any], *, batch: list[Reap], settle: Settle) -> None:
    try:
        ok = bool(future.result())
    except Exception as e:  # a bug in one reap must not stop the loop
        log.error("reap step crashed", extra=logs.fields(jobs=[r.name for r in batch], error=repr(e)))
        ok = False
    for r in batch:
        settle(r, ok)
