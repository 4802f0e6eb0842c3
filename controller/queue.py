"""A keyed work queue: each key is processed by one worker at a time, and
a key added while it is being processed is processed again afterwards
(client-go's workqueue contract, in a few lines). The latest object for a
key wins, so a burst of watch events for one object is one reconcile."""

from __future__ import annotations

import threading
import time
from typing import Any, Hashable


class WorkQueue:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._order: list[Hashable] = []
        self._items: dict[Hashable, Any] = {}
        self._processing: set[Hashable] = set()
        self._dirty: dict[Hashable, Any] = {}
        self._closed = False

    def add(self, key: Hashable, item: Any = None) -> None:
        with self._cond:
            if key in self._processing:
                self._dirty[key] = item
                return
            if key not in self._items:
                self._order.append(key)
            self._items[key] = item
            self._cond.notify()

    def add_after(self, key: Hashable, item: Any, delay: float) -> None:
        timer = threading.Timer(delay, self.add, args=(key, item))
        timer.daemon = True
        timer.start()

    def get(self, timeout: float = 0.5) -> tuple[Hashable, Any] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._order:
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return None
                self._cond.wait(remaining)
            key = self._order.pop(0)
            item = self._items.pop(key)
            self._processing.add(key)
            return key, item

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                item = self._dirty.pop(key)
                if key not in self._items:
                    self._order.append(key)
                self._items[key] = item
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._order)
