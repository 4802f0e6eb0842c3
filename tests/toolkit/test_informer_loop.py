"""The informer's own loop (`Informer.run`, bounded by `max_rounds`) over a scripted client.

A fake stands in for the apiserver here, deliberately: what is tested is the
loop's pure decision (relist or re-watch, from which resourceVersion), in
the `on_list` form the dispatcher uses; the real stream against the real
apiserver is in tests/controller/test_informer.py and
tests/dispatcher/test_cluster.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from toolkit import backoff, informer, kube, paths


def job(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class ScriptedClient:
    """Lists answer resourceVersion 100, 200, ...; each watch plays the next step of the script."""

    def __init__(self, *steps: list[tuple[str, dict[str, Any]]] | Exception) -> None:
        self.steps = list(steps)
        self.lists = 0
        self.watched_from: list[str] = []

    def list(self, res: paths.Resource, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return [job("a", "1")], str(100 * self.lists)

    def watch(self, res: paths.Resource, *, resource_version: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        self.watched_from.append(resource_version)
        step = self.steps.pop(0) if self.steps else []
        if isinstance(step, Exception):
            raise step
        yield from step


def run(client: ScriptedClient, rounds: int) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    inf = informer.Informer(client, paths.JOB, stop=threading.Event(),  # type: ignore[arg-type]
                            handler=lambda kind, obj: out.append(("event", kind, obj)),
                            on_list=lambda items, started: out.append(("sync", items, started)))
    inf.backoff = backoff.Backoff(base=0.001, cap=0.001)
    inf.run(max_rounds=rounds)
    return out


def test_410_gone_relists_and_watches_from_the_new_list() -> None:
    client = ScriptedClient(kube.Gone(410, "Expired", "too old resource version"), [])
    items = run(client, rounds=4)  # list, watch (410), list, watch
    assert client.lists == 2
    assert client.watched_from == ["100", "200"]
    assert [i[0] for i in items] == ["sync", "sync"]


def test_a_watch_that_ends_is_restarted_from_the_last_resource_version_seen_bookmarks_included() -> None:
    client = ScriptedClient([("ADDED", job("b", "101")), ("BOOKMARK", job("", "150"))],
                            [("MODIFIED", job("b", "160"))], [])
    items = run(client, rounds=4)  # list, watch (ends), watch (ends), watch
    assert client.lists == 1, "an ended watch must not relist"
    assert client.watched_from == ["100", "150", "160"]
    assert [(i[0], i[1]) for i in items[1:]] == [("event", "ADDED"), ("event", "MODIFIED")]


@pytest.mark.parametrize("error", [kube.ApiError(500, "InternalError", "etcd"),
                                   kube.Unavailable("connection refused")])
def test_any_other_error_backs_off_then_relists(error: Exception) -> None:
    client = ScriptedClient(error, [])
    assert [i[0] for i in run(client, rounds=4)] == ["sync", "sync"]
    assert (client.lists, client.watched_from) == (2, ["100", "200"])


def test_with_on_list_the_list_is_delivered_whole_with_its_start_and_no_cache_is_kept() -> None:
    client = ScriptedClient([("ADDED", job("b", "101"))])
    items = run(client, rounds=2)
    assert items[0][0] == "sync" and items[0][1] == [job("a", "1")] and isinstance(items[0][2], float)
    assert items[1] == ("event", "ADDED", job("b", "101"))
