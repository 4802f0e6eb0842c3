"""The watcher's own loop (`Watcher.run`, bounded by `max_rounds`) over a scripted API.

A fake stands in for the apiserver here, deliberately: what is tested is the
loop's pure decision (relist or re-watch, from which resourceVersion); the
real stream against the real apiserver is in test_cluster.py.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher import kube, watcher
from toolkit import backoff


def job(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class ScriptedApi:
    """Lists answer resourceVersion 100, 200, ...; each watch plays the next step of the script."""

    def __init__(self, *steps: list[dict[str, Any]] | Exception) -> None:
        self.steps = list(steps)
        self.lists = 0
        self.watched_from: list[str] = []

    def list_jobs(self, namespace: str, *, selector: str, cont: str | None = None) -> dict[str, Any]:
        self.lists += 1
        return {"items": [job("a", "1")], "metadata": {"resourceVersion": str(100 * self.lists)}}

    def watch_jobs(self, namespace: str, *, selector: str, resource_version: str,
                   timeout_seconds: int) -> Iterator[dict[str, Any]]:
        self.watched_from.append(resource_version)
        step = self.steps.pop(0) if self.steps else []
        if isinstance(step, Exception):
            raise step
        yield from step


def run(api: ScriptedApi, rounds: int) -> list[tuple[Any, ...]]:
    out: queue.Queue[Any] = queue.Queue()
    w = watcher.Watcher(api, namespace="ns", selector="s", out=out, stop=threading.Event())  # type: ignore[arg-type]
    w.backoff = backoff.Backoff(base=0.001, cap=0.001)
    w.run(max_rounds=rounds)
    items = []
    while not out.empty():
        items.append(out.get_nowait())
    return items


@pytest.mark.parametrize("expiry", [
    kube.ApiError(410, "too old resource version"),
    [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
], ids=["410 status", "410 ERROR event"])
def test_410_gone_relists_and_watches_from_the_new_list(expiry: Any) -> None:
    api = ScriptedApi(expiry, [])
    items = run(api, rounds=4)  # list, watch (410), list, watch
    assert api.lists == 2
    assert api.watched_from == ["100", "200"]
    assert [i[0] for i in items] == ["sync", "sync"]


def test_a_watch_that_ends_is_restarted_from_the_last_resource_version_seen_bookmarks_included() -> None:
    api = ScriptedApi([{"type": "ADDED", "object": job("b", "101")}, {"type": "BOOKMARK", "object": job("", "150")}],
                      [{"type": "MODIFIED", "object": job("b", "160")}], [])
    items = run(api, rounds=4)  # list, watch (ends), watch (ends), watch
    assert api.lists == 1, "an ended watch must not relist"
    assert api.watched_from == ["100", "150", "160"]
    assert [(i[0], i[1]) for i in items[1:]] == [("event", "ADDED"), ("event", "MODIFIED")]


@pytest.mark.parametrize("error", [kube.ApiError(500, "etcd"), kube.Unavailable("connection refused")])
def test_any_other_error_backs_off_then_relists(error: Exception) -> None:
    api = ScriptedApi(error, [])
    assert [i[0] for i in run(api, rounds=4)] == ["sync", "sync"]
    assert (api.lists, api.watched_from) == (2, ["100", "200"])
