"""The dispatcher's Role (deployments/k8s/base/dispatcher/role.yaml) is exactly what the dispatcher uses.

Three proofs, on the real apiserver for the last two:
- the Kubernetes calls the dispatcher's code makes (every `kube.Kube` method
  called outside kube.py, read from the source) are exactly the calls listed
  in `NEEDS`, and the Role's verbs are exactly what those calls need;
- under a ServiceAccount bound to the shipped Role, every one of those calls
  is allowed (the dispatcher itself runs under it in tests/dispatcher/);
- with any one verb removed from the Role (a Role of its own, bound to a
  ServiceAccount of its own, with a real token), the call that needs the verb
  gets a 403, and nothing else changes.
"""

from __future__ import annotations

import ast
import copy
import pathlib
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client
import pytest
import yaml

from dispatcher import kube

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLE = REPO / "deployments" / "k8s" / "base" / "dispatcher" / "role.yaml"

# Each Kube method the dispatcher calls, and the (resource, verb) it needs.
NEEDS: dict[str, tuple[str, str]] = {
    "create_job": ("jobs", "create"),
    "get_job": ("jobs", "get"),
    "list_jobs": ("jobs", "list"),
    "watch_jobs": ("jobs", "watch"),
    "delete_job": ("jobs", "delete"),
    "list_pods": ("pods", "list"),
    "iter_pods": ("pods", "list"),
    "delete_pod": ("pods", "delete"),
    "read_log": ("pods/log", "get"),
    "create_secret": ("secrets", "create"),
    "get_secret": ("secrets", "get"),
    "list_events": ("events", "list"),
}


def role() -> dict[str, Any]:
    return dict(yaml.safe_load(ROLE.read_text()))


def granted(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(res, verb) for rule in doc["rules"] for res in rule["resources"] for verb in rule["verbs"]}


def kube_calls() -> set[str]:
    """Names of the `kube.Kube` methods called in dispatcher/ outside kube.py (`<x>.kube.m(` or `client.m(`)."""
    methods = {n for n, v in vars(kube.Kube).items() if callable(v) and not n.startswith("_")}
    found = set()
    for path in sorted((REPO / "dispatcher").glob("*.py")):
        if path.name == "kube.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
                owner = node.func.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name in ("kube", "client"):
                    found.add(node.func.attr)
    return found - {"close"}


def test_the_role_grants_exactly_what_the_dispatcher_s_calls_need() -> None:
    assert kube_calls() == set(NEEDS), "a Kube call of the dispatcher is missing from NEEDS, or NEEDS has a stale one"
    assert granted(role()) == set(NEEDS.values())
    assert ("pods", "get") not in granted(role())


def _calls(namespace: str) -> dict[tuple[str, str], Callable[[kube.Kube], object]]:
    """One call per (resource, verb), made as the dispatcher makes it, on objects that exist."""
    selector = "app.kubernetes.io/managed-by=test-cabinet-dispatcher"
    return {
        ("jobs", "create"): lambda k: k.create_job(namespace, {
            "metadata": {"generateName": "rbac-", "labels": {"app.kubernetes.io/managed-by": "test-cabinet-dispatcher"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "driver", "image": "x"}]}}}}),
        ("jobs", "get"): lambda k: k.get_job(namespace, "present"),
        ("jobs", "list"): lambda k: k.list_jobs(namespace, selector=selector),
        ("jobs", "watch"): lambda k: next(iter(k.watch_jobs(namespace, selector=selector, resource_version="0",
                                                            timeout_seconds=1)), None),
        ("jobs", "delete"): lambda k: k.delete_job(namespace, "absent"),
        ("pods", "list"): lambda k: k.list_pods(namespace, selector=selector),
        ("pods", "delete"): lambda k: k.delete_pod(namespace, "absent"),
        ("pods/log", "get"): lambda k: k.read_log(namespace, "sandbox", container="c", tail_lines=1),
        ("secrets", "create"): lambda k: k.create_secret(namespace, {"metadata": {"generateName": "rbac-"}}),
        ("secrets", "get"): lambda k: k.get_secret(namespace, "present"),
        ("events", "list"): lambda k: k.list_events(namespace, field_selector="involvedObject.kind=Job"),
    }


def _status(call: Callable[[kube.Kube], object], client: kube.Kube) -> int:
    """0 when allowed; otherwise the API status. A 400 from pods/log (no kubelet here) is past authorization."""
    try:
        call(client)
    except kube.ApiError as e:
        return 0 if e.status in (400, 404) else e.status
    return 0


def _bind(api: kubernetes.client.ApiClient, namespace: str, name: str, doc: dict[str, Any]) -> None:
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name}
    kubernetes.client.RbacAuthorizationV1Api(api).create_namespaced_role(namespace, doc)
    kubernetes.client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    })


def _without(doc: dict[str, Any], resource: str, verb: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for rule in doc["rules"]:
        if resource in rule["resources"]:
            assert rule["resources"] == [resource], "one resource per rule, so one verb can be taken away"
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    doc["rules"] = [r for r in doc["rules"] if r["verbs"]]
    return doc


@pytest.mark.cluster
def test_the_shipped_role_allows_every_call_and_each_verb_removed_denies_exactly_its_call(
        control_plane: Any, namespace: str, api_client: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    kubernetes.client.BatchV1Api(api_client).create_namespaced_job(namespace, {
        "metadata": {"name": "present"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "driver", "image": "x"}]}}}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "present"}})
    core.create_namespaced_pod(namespace, {"metadata": {"name": "sandbox"},
                                           "spec": {"containers": [{"name": "c", "image": "x"}]}})
    shipped = role()
    verbs = sorted(granted(shipped))
    accounts = {"full": shipped, **{f"no-{i}": _without(shipped, *rv) for i, rv in enumerate(verbs)}}
    for name, doc in accounts.items():
        _bind(api_client, namespace, name, doc)
    clients = {name: kube.Kube(kubeconfig=control_plane.mint_kubeconfig(namespace=namespace, service_account=name))
               for name in accounts}
    calls = _calls(namespace)
    assert set(calls) == set(verbs)
    try:
        # The authorizer's cache sees a new binding within moments: wait until the full Role works.
        deadline = time.monotonic() + 30
        while (statuses := {rv: _status(call, clients["full"]) for rv, call in calls.items()}) != dict.fromkeys(
                calls, 0):
            assert time.monotonic() < deadline, statuses
            time.sleep(0.2)
        for i, removed in enumerate(verbs):
            client = clients[f"no-{i}"]
            expected = {rv: 403 if rv == removed else 0 for rv in calls}
            deadline = time.monotonic() + 30
            while (statuses := {rv: _status(call, client) for rv, call in calls.items()}) != expected:
                assert time.monotonic() < deadline, (removed, statuses)
                time.sleep(0.2)
    finally:
        for client in clients.values():
            client.close()
