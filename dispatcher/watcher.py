"""List+watch of the dispatcher's Jobs, fed into the main loop's queue.

Why not `kubernetes.informer.SharedInformer` (which kubernetes==37.0.2 does
ship): it turns every object into a generated model (the CPU cost that
dominates at a thousand Jobs), reconnects a failed watch with no delay (a hot
loop while the apiserver is down), and its daemon thread has no bound a test
could drive. This module keeps the informer contract in ~100 lines over the
client's raw watch stream:

- list (paginated) then watch from the list's resourceVersion; the list is
  delivered whole as ("sync", items, list_started) so the ledger can diff it;
- a watch that ends (server timeout, dropped connection) is restarted from
  the last resourceVersion seen, bookmarks included;
- 410 Gone (as an HTTP status or as an ERROR event) relists;
- any other error backs off with jitter and relists.

`run(max_rounds=...)` bounds the loop for tests: each list or watch
connection is a round. The loop that runs in production is the one tested.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from dispatcher import kube, logs
from toolkit import backoff

log = logging.getLogger(__name__)

WATCH_SECONDS = 240


class Watcher:
    def __init__(self, client: kube.Kube, *, namespace: str, selector: str, out: queue.Queue[Any],
                 stop: threading.Event, watch_seconds: int = WATCH_SECONDS) -> None:
        self.client = client
        self.namespace = namespace
        self.selector = selector
        self.out = out
        self.stop = stop
        self.watch_seconds = watch_seconds
        self.backoff = backoff.Backoff(base=0.2, cap=10.0)
        self.lists = 0

    def _list(self) -> str:
        started = time.monotonic()
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            page = self.client.list_jobs(self.namespace, selector=self.selector, cont=cont)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                break
        self.lists += 1
        self.out.put(("sync", items, started))
        return str(meta.get("resourceVersion") or "")

    def _watch(self, resource_version: str) -> str | None:
        """Stream one watch connection; the last RV seen, or None to relist."""
        for event in self.client.watch_jobs(self.namespace, selector=self.selector,
                                            resource_version=resource_version,
                                            timeout_seconds=self.watch_seconds):
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = obj.get("code")
                log.info("watch error event; relisting", extra=logs.fields(code=code, reason=obj.get("reason")))
                return None
            resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.out.put(("event", kind, obj))
            if self.stop.is_set():
                break
        return resource_version

    def run(self, *, max_rounds: int | None = None) -> None:
        resource_version: str | None = None
        rounds = 0
        while not self.stop.is_set() and (max_rounds is None or rounds < max_rounds):
            rounds += 1
            try:
                if resource_version is None:
                    resource_version = self._list()
                else:
                    resource_version = self._watch(resource_version)
                self.backoff.reset()
            except kube.ApiError as e:
                if e.status == 410:
                    log.info("watch expired (410 Gone); relisting")
                    resource_version = None
                    continue
                self._pause(f"HTTP {e.status}: {e.reason}")
                resource_version = None
            except kube.Unavailable as e:
                self._pause(str(e))
                resource_version = None

    def _pause(self, why: str) -> None:
        delay = self.backoff.next_delay()
        log.warning("list/watch failed; retrying", extra=logs.fields(error=why, retry_in=round(delay, 2)))
        self.stop.wait(delay)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="watcher", daemon=True)
        thread.start()
        return thread
