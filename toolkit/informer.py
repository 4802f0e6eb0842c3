"""The one list+watch loop (an informer) over `kube.Client`, for the
controller and the dispatcher.

The client library ships `kubernetes.informer.SharedInformer`, but it
expects generated model objects (it reads `resp.items` as an attribute), so
it cannot serve custom resources returned as dicts; turning every Job into a
model is the CPU cost that dominates the dispatcher at a thousand Jobs; and
it reconnects a failed watch with no delay (a hot loop while the apiserver is
down). This one keeps the informer contract:

- list (paged), then watch from the list's resourceVersion;
- a watch that ends (server timeout, dropped connection) is restarted from
  the last resourceVersion seen (bookmarks included);
- a 410 Gone (an HTTP status or an ERROR event) relists;
- any other error backs off (toolkit.backoff: exponential, jittered, at
  most 10 s) and relists; handlers' exceptions are logged, never kill the
  loop.

Two ways to take a list. By default the informer keeps a cache keyed by
namespace/name (what the server last said), delivers each listed object as
SYNC, and objects that vanished between two lists as DELETED, so handlers
never miss a deletion (the controller). With `on_list`, the list is handed
over whole, with the monotonic time it started, and no cache is kept: the
caller holds the state and diffs (the dispatcher's ledger).

With `transform`, every object is passed through it as it arrives, before
the cache and the handler see it (client-go's SetTransform): a controller
that keeps thousands of objects drops the fields it never reads from them
(managedFields, a spec it reads fresh before acting) rather than hold them.

With `compact`, the cache holds each object as its compact JSON (bytes) and
answers `get` and `items` with a decoded copy: a Python dict of a small object
takes several times its JSON's size, and a cache that holds one per TrainJob
pays that for every TrainJob. The handler still gets the decoded object.

`run(max_rounds=...)` bounds the loop for tests (each list or watch
connection is a round): the loop that runs in production is the one tested.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from toolkit import backoff, kube, paths

Obj = dict[str, Any]
Handler = Callable[[str, Obj], None]
ListHandler = Callable[[list[Obj], float], None]

log = logging.getLogger(__name__)


def key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Informer:
    def __init__(
        self,
        client: kube.Client,
        resource: paths.Resource,
        *,
        handler: Handler,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: int = 240,
        stop: threading.Event | None = None,
        on_list: ListHandler | None = None,
        transform: Callable[[Obj], Obj] | None = None,
        compact: bool = False,
    ) -> None:
        self.client = client
        self.resource = resource
        self.handler = handler
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.stop = stop or threading.Event()
        self.on_list = on_list
        self.transform = transform or (lambda obj: obj)
        self._pack: Callable[[Obj], Any] = _packed if compact else (lambda obj: obj)
        self._unpack: Callable[[Any], Obj] = json.loads if compact else (lambda obj: obj)
        self.backoff = backoff.Backoff(base=0.2, cap=10.0)
        self.synced = threading.Event()
        self.relists = 0  # lists after the first (410s and errors), for tests and metrics
        self._cache: dict[str, Any] = {}  # key -> the object, or its compact JSON (`compact`)
        self._lock = threading.Lock()
        self._rv: str | None = None

    # -- the cache ----------------------------------------------------

    def get(self, cache_key: str) -> Obj | None:
        with self._lock:
            found = self._cache.get(cache_key)
        return None if found is None else self._unpack(found)

    def items(self) -> list[Obj]:
        with self._lock:
            held = list(self._cache.values())
        return [self._unpack(obj) for obj in held]

    # -- the loop -----------------------------------------------------

    def _deliver(self, kind: str, obj: Obj) -> None:
        try:
            self.handler(kind, obj)
        except Exception:
            log.exception("handler failed", extra={"resource": self.resource.plural, "event": kind})

    def _relist(self) -> None:
        started = time.monotonic()
        items, rv = self.client.list(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
        )
        items = [self.transform(o) for o in items]
        if self.on_list is not None:
            try:
                self.on_list(items, started)
            except Exception:
                log.exception("list handler failed", extra={"resource": self.resource.plural})
            self._rv = rv
            self.synced.set()
            return
        fresh = {key(o): self._pack(o) for o in items}
        with self._lock:
            gone = [o for k, o in self._cache.items() if k not in fresh]
            self._cache = fresh
        for obj in gone:
            self._deliver("DELETED", self._unpack(obj))
        for obj in items:
            self._deliver("SYNC", obj)
        self._rv = rv
        self.synced.set()

    def _watch(self) -> None:
        assert self._rv is not None
        for kind, obj in self.client.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version=self._rv,
            timeout_seconds=self.watch_timeout,
        ):
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self._rv = rv
            if kind == "BOOKMARK":
                continue
            obj = self.transform(obj)
            if self.on_list is None:
                with self._lock:
                    if kind == "DELETED":
                        self._cache.pop(key(obj), None)
                    else:
                        self._cache[key(obj)] = self._pack(obj)
            self._deliver(kind, obj)
            if self.stop.is_set():
                return

    def run(self, *, max_rounds: int | None = None) -> None:
        rounds = 0
        while not self.stop.is_set() and (max_rounds is None or rounds < max_rounds):
            rounds += 1
            try:
                if self._rv is None:
                    if self.synced.is_set():
                        self.relists += 1
                    self._relist()
                else:
                    self._watch()
                self.backoff.reset()
            except kube.Gone:
                log.info("watch expired, relisting", extra={"resource": self.resource.plural})
                self._rv = None
            except Exception as exc:  # the API is down or refused: back off, relist
                log.warning("list/watch failed: %s", exc, extra={"resource": self.resource.plural})
                self._rv = None
                self.stop.wait(self.backoff.next_delay())

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"informer-{self.resource.plural}", daemon=True)
        thread.start()
        return thread


def _packed(obj: Obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
