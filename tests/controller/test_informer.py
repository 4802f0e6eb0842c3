"""The informer's own loop (`Informer.run`, bounded by `max_rounds`: one
list or one watch connection per round) against the real apiserver: a 410
relists, a watch that ends is restarted from the last resourceVersion it
delivered, and an object deleted while nobody watched comes out of the
relist as DELETED.

PodTemplates are the resource: the harness runs the apiserver with no watch
cache for them, so a watch is served by etcd, and
`expired_resource_version` compacts etcd past every resourceVersion handed
out before it, the informer's included.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller import views
from toolkit import informer
from tests.controller.conftest import wait_until
from toolkit import kube, paths

pytestmark = pytest.mark.cluster

POD_TEMPLATE = paths.Resource("", "v1", "podtemplates", "PodTemplate")


class Recorder:
    """The informer's handler: every delivery, in order, with the watch
    connection (1, 2, ...; 0 before the first) it arrived during."""

    def __init__(self, client: WatchLog) -> None:
        self.client = client
        self.events: list[tuple[int, str, str]] = []

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((len(self.client.watches), kind, obj["metadata"]["name"]))

    def after(self, watch: int) -> list[tuple[str, str]]:
        return [(kind, name) for n, kind, name in self.events if n >= watch]


class WatchLog:
    """The real client, with each watch connection's starting
    resourceVersion and the resourceVersions it delivered written down."""

    def __init__(self, client: kube.Client) -> None:
        self._client = client
        self.watches: list[tuple[str, list[str]]] = []

    def list(self, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        return self._client.list(*args, **kwargs)

    def watch(self, *args: Any, resource_version: str, **kwargs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        delivered: list[str] = []
        self.watches.append((resource_version, delivered))
        for kind, obj in self._client.watch(*args, resource_version=resource_version, **kwargs):
            delivered.append(obj["metadata"]["resourceVersion"])
            yield kind, obj


def _template(client: kube.Client, namespace: str, name: str) -> dict[str, Any]:
    body = {"metadata": {"name": name}, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
    return client.create(POD_TEMPLATE, body, namespace=namespace)


def _informer(admin: kube.Client, namespace: str, **kw: Any) -> tuple[informer.Informer, Recorder, WatchLog]:
    log = WatchLog(admin)
    recorder = Recorder(log)
    inf = informer.Informer(log, POD_TEMPLATE, handler=recorder, namespace=namespace, **kw)  # type: ignore[arg-type]
    return inf, recorder, log


def test_a_410_relists_and_objects_made_in_the_gap_arrive_as_sync(control_plane, admin, namespace):
    _template(admin, namespace, "before")
    inf, rec, log = _informer(admin, namespace)
    inf.run(max_rounds=1)  # the list
    assert rec.events == [(0, "SYNC", "before")] and inf.relists == 0
    control_plane.expired_resource_version(namespace=namespace)  # three expire-* made, then compacted
    inf.run(max_rounds=2)  # the watch: 410; then the relist
    assert len(log.watches) == 1 and log.watches[0][1] == []  # nothing delivered by the failed watch
    assert inf.relists == 1
    relisted = rec.after(1)
    assert {kind for kind, _ in relisted} == {"SYNC"}
    names = sorted(name for _, name in relisted)
    assert names[0] == "before" and len(names) == 4
    assert all(name.startswith("expire-") for name in names[1:])
    assert sorted(o["metadata"]["name"] for o in inf.items()) == names


def test_an_object_deleted_during_the_gap_is_delivered_as_deleted_by_the_relist(control_plane, admin, namespace):
    _template(admin, namespace, "victim")
    _template(admin, namespace, "survivor")
    inf, rec, log = _informer(admin, namespace)
    inf.run(max_rounds=1)
    assert inf.get(f"{namespace}/victim") is not None
    admin.delete(POD_TEMPLATE, name="victim", namespace=namespace)
    control_plane.expired_resource_version(namespace=namespace)  # the deletion's event is compacted away
    inf.run(max_rounds=2)
    assert inf.relists == 1
    after = rec.after(1)
    # the relist announces what vanished before it re-syncs what is there
    assert after[0] == ("DELETED", "victim")
    assert ("SYNC", "survivor") in after and ("SYNC", "victim") not in after
    assert inf.get(f"{namespace}/victim") is None and inf.get(f"{namespace}/survivor") is not None


def test_a_watch_that_ends_is_restarted_from_the_last_resource_version_delivered(admin, namespace):
    inf, rec, log = _informer(admin, namespace, watch_timeout=2)
    thread = threading.Thread(target=inf.run, kwargs={"max_rounds": 3}, daemon=True)  # list, watch, watch
    thread.start()
    try:
        assert inf.synced.wait(15)
        first = _template(admin, namespace, "first")
        wait_until(lambda: ("ADDED", "first") in rec.after(1), what="first delivered")
        wait_until(lambda: len(log.watches) == 2, what="the first watch to end and the second to start")
        second = _template(admin, namespace, "second")
        wait_until(lambda: ("ADDED", "second") in rec.after(2), what="second delivered")
    finally:
        thread.join(10)
    assert not thread.is_alive()
    (start1, delivered1), (start2, _) = log.watches
    assert first["metadata"]["resourceVersion"] in delivered1, "the first object must arrive on the first watch"
    assert start2 == delivered1[-1] and start2 != start1
    # resumed, not restarted from the list: nothing delivered twice, nothing relisted
    assert rec.after(1) == [("ADDED", "first"), ("ADDED", "second")]
    assert inf.relists == 0
    assert second["metadata"]["resourceVersion"] == log.watches[1][1][0]


def test_the_transform_shapes_what_the_cache_and_the_handler_get_listed_and_watched(admin, namespace):
    """The controller's own transform (`views.slim`): no spec, no managedFields, the metadata and status kept."""
    seen: list[dict[str, Any]] = []
    _template(admin, namespace, "listed")
    inf = informer.Informer(admin, POD_TEMPLATE, handler=lambda kind, obj: seen.append(obj), namespace=namespace,
                            transform=views.slim, watch_timeout=2)
    thread = threading.Thread(target=inf.run, kwargs={"max_rounds": 2}, daemon=True)  # the list, one watch
    thread.start()
    try:
        assert inf.synced.wait(15)
        _template(admin, namespace, "watched")
        wait_until(lambda: len(seen) == 2, what="the watched object delivered")
    finally:
        thread.join(10)
    for obj in [*seen, *inf.items()]:
        assert "template" in obj and "spec" not in obj  # a PodTemplate has no spec of its own: its template stays
        assert obj["metadata"]["name"] in ("listed", "watched") and obj["metadata"]["resourceVersion"]
        assert "managedFields" not in obj["metadata"]
    assert views.slim({"metadata": {"name": "n", "managedFields": [{}]}, "spec": {"x": 1}, "status": {"y": 2}}) == {
        "metadata": {"name": "n"}, "status": {"y": 2}}


def test_a_compact_cache_answers_what_it_was_given_and_holds_json(admin, namespace):
    """`compact`: the cache holds each object as its JSON and answers get, items and a deletion
    with the object as delivered, each a copy of its own."""
    seen: list[tuple[str, dict[str, Any]]] = []
    _template(admin, namespace, "listed")
    inf = informer.Informer(admin, POD_TEMPLATE, handler=lambda kind, obj: seen.append((kind, obj)),
                            namespace=namespace, transform=views.metadata_only, compact=True, watch_timeout=2)
    thread = threading.Thread(target=inf.run, kwargs={"max_rounds": 2}, daemon=True)  # the list, one watch
    thread.start()
    try:
        assert inf.synced.wait(15)
        _template(admin, namespace, "watched")
        wait_until(lambda: len(seen) == 2, what="the watched object delivered")
        admin.delete(POD_TEMPLATE, name="listed", namespace=namespace)
        wait_until(lambda: len(seen) == 3, what="the deletion delivered")
    finally:
        thread.join(10)
    assert [kind for kind, _ in seen] == ["SYNC", "ADDED", "DELETED"]
    watched = inf.get(f"{namespace}/watched")
    assert watched == seen[1][1] and watched is not seen[1][1]
    assert [o["metadata"]["name"] for o in inf.items()] == ["watched"] and inf.get(f"{namespace}/listed") is None
    assert all(isinstance(held, bytes) for held in inf._cache.values())
    watched["metadata"]["name"] = "changed"
    assert inf.get(f"{namespace}/watched")["metadata"]["name"] == "watched"
