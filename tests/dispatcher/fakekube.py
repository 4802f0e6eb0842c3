"""An in-memory stand-in for the shared client's interface (`toolkit.kube.Client`), for fast unit
tests of the dispatcher's loop (`Dispatcher.run(max_ticks=...)`): its retry, abandon and tombstone
paths, driven in milliseconds. It keeps Jobs, Secrets and pods with uids and resourceVersions,
answers as the apiserver does on the paths the dispatcher takes (AlreadyExists, a uid precondition,
owned Secrets collected with their Job), serves a watch from its own event log, and fails a call on
demand (`fail`).

It is not the proof that the dispatcher works: tests/dispatcher/test_cluster.py and the others run
the release's dispatcher pod on the real control plane and node.
"""

from __future__ import annotations

import base64
import copy
import itertools
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from toolkit import kube, paths

Obj = dict[str, Any]


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    """Equality (`k=v`) and set (`k in (a,b)`) terms, comma-separated (outside parentheses)."""
    if not selector:
        return True
    terms, depth, term = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(term)
            term = ""
        else:
            term += ch
    terms.append(term)
    for t in terms:
        if " in (" in t:
            key, values = t.split(" in (", 1)
            if labels.get(key.strip()) not in values.rstrip(")").split(","):
                return False
        else:
            key, value = t.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


def _field(obj: Obj, selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        path, value = term.split("=", 1)
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


class FakeClient:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}  # (plural, namespace, name) -> object
        self.events: list[tuple[int, str, Obj]] = []  # Job events: (resourceVersion, type, object)
        self.calls: list[tuple[str, str, str]] = []  # (method, plural, name): what the dispatcher asked
        self.failures: dict[tuple[str, str], list[Exception]] = {}
        self.requests = 0
        self._rv = itertools.count(1)
        self._changed = threading.Condition()

    # -- test controls --------------------------------------------------------

    def fail(self, method: str, plural: str, *errors: Exception) -> None:
        """The next len(errors) `method` calls on `plural` raise these, in order."""
        self.failures.setdefault((method, plural), []).extend(errors)

    def put(self, res: paths.Resource, obj: Obj, *, namespace: str) -> Obj:
        """An object made by someone else (a dispatcher now gone)."""
        return self._store(res, copy.deepcopy(obj), namespace, "ADDED")

    def named(self, plural: str) -> list[str]:
        return sorted(name for (p, _, name) in self.objects if p == plural)

    # -- the interface --------------------------------------------------------

    def _enter(self, method: str, res: paths.Resource, name: str = "") -> None:
        self.requests += 1
        self.calls.append((method, res.plural, name))
        queued = self.failures.get((method, res.plural))
        if queued:
            raise queued.pop(0)

    def _store(self, res: paths.Resource, obj: Obj, namespace: str, kind: str) -> Obj:
        with self._changed:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                meta["name"] = meta.get("generateName", "x-") + uuid.uuid4().hex[:5]
            meta.update(namespace=namespace, resourceVersion=str(next(self._rv)),
                        creationTimestamp=meta.get("creationTimestamp") or "2030-01-01T00:00:00Z")
            meta.setdefault("uid", str(uuid.uuid4()))
            if res.plural == "secrets":  # as the apiserver does: stringData is written into data, base64
                for key, value in (obj.pop("stringData", None) or {}).items():
                    obj.setdefault("data", {})[key] = base64.b64encode(value.encode()).decode()
            self.objects[(res.plural, namespace, meta["name"])] = obj
            if res.plural == "jobs":
                self.events.append((int(meta["resourceVersion"]), kind, copy.deepcopy(obj)))
            self._changed.notify_all()
            return copy.deepcopy(obj)

    def create(self, res: paths.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        name = (obj.get("metadata") or {}).get("name", "")
        self._enter("create", res, name)
        if name and (res.plural, namespace or "", name) in self.objects:
            raise kube.AlreadyExists(409, "AlreadyExists", f"{res.plural} {name} already exists")
        return self._store(res, {"apiVersion": res.api_version, "kind": res.kind, **copy.deepcopy(obj)},
                           namespace or "", "ADDED")

    def get(self, res: paths.Resource, *, name: str, namespace: str | None = None) -> Obj:
        self._enter("get", res, name)
        found = self.objects.get((res.plural, namespace or "", name))
        if found is None:
            raise kube.NotFound(404, "NotFound", f"{res.plural} {name} not found")
        return copy.deepcopy(found)

    def delete(self, res: paths.Resource, *, name: str, namespace: str | None = None, body: Obj | None = None,
               missing_ok: bool = False) -> None:
        self._enter("delete", res, name)
        key = (res.plural, namespace or "", name)
        with self._changed:
            found = self.objects.get(key)
            if found is None:
                if missing_ok:
                    return
                raise kube.NotFound(404, "NotFound", f"{res.plural} {name} not found")
            want = ((body or {}).get("preconditions") or {}).get("uid")
            if want and want != found["metadata"]["uid"]:
                raise kube.Conflict(409, "Conflict", "Precondition failed: UID in precondition")
            del self.objects[key]
            if res.plural == "jobs":
                meta = found["metadata"]
                meta["resourceVersion"] = str(next(self._rv))
                self.events.append((int(meta["resourceVersion"]), "DELETED", copy.deepcopy(found)))
                for other, obj in list(self.objects.items()):  # the garbage collector: owned Secrets go too
                    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
                    if any(o.get("uid") == meta["uid"] for o in owners):
                        del self.objects[other]
            self._changed.notify_all()

    def each(self, res: paths.Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int = 500) -> Iterator[Obj]:
        self._enter("list", res)
        for (plural, ns, _), obj in list(self.objects.items()):
            if plural == res.plural and ns == (namespace or "") and _field(obj, field_selector) and _matches(
                    (obj.get("metadata") or {}).get("labels") or {}, label_selector):
                yield copy.deepcopy(obj)

    def list(self, res: paths.Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[Obj], str]:
        with self._changed:
            items = list(self.each(res, namespace=namespace, label_selector=label_selector,
                                   field_selector=field_selector))
            return items, str(self.events[-1][0] if self.events else 0)

    def watch(self, res: paths.Resource, *, resource_version: str, namespace: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int = 300) -> Iterator[tuple[str, Obj]]:
        """The Job events after `resource_version`; ends after 0.2 s without one."""
        self._enter("watch", res)
        seen = int(resource_version or 0)
        while True:
            with self._changed:
                fresh = [e for e in self.events if e[0] > seen]
                if not fresh and not self._changed.wait(0.2):
                    return
            for rv, kind, obj in fresh:
                seen = rv
                if (obj["metadata"].get("namespace") == namespace
                        and _matches(obj["metadata"].get("labels") or {}, label_selector)):
                    yield kind, copy.deepcopy(obj)

    def read_log(self, *, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        self._enter("get", paths.POD, pod)
        return ""

    def close(self) -> None:
        pass


def finish(fake: FakeClient, *, name: str, namespace: str, state: str) -> None:
    """The Job gains the condition `state` ("Complete" or "Failed") True, as the Job controller sets it."""
    job = fake.objects[("jobs", namespace, name)]
    job["status"] = {"conditions": [{"type": state, "status": "True", "reason": "BackoffLimitExceeded"}]}
    fake._store(paths.JOB, job, namespace, "MODIFIED")
