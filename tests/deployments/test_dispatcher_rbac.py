"""The dispatcher's Role (deployments/k8s/base/dispatcher/role.yaml) is exactly what the dispatcher uses.

Three proofs, on the real apiserver for the last two:
- the Kubernetes calls the dispatcher's code makes (every call of the shared
  client, `toolkit.kube.Client`, and every informer it starts, read from the
  source with the resource named at the call) need exactly the Role's verbs;
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

from dispatcher import jobspec
from toolkit import clusterconfig, informer, kube, paths

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLE = REPO / "deployments" / "k8s" / "base" / "dispatcher" / "role.yaml"

# The client's methods and the verb each needs on the resource it is called with.
VERBS: dict[str, tuple[str, ...]] = {
    "get": ("get",), "create": ("create",), "delete": ("delete",),
    "list": ("list",), "each": ("list",), "pages": ("list",), "watch": ("watch",),
}
INFORMER_VERBS = ("list", "watch")


def role() -> dict[str, Any]:
    return dict(yaml.safe_load(ROLE.read_text()))


def granted(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(res, verb) for rule in doc["rules"] for res in rule["resources"] for verb in rule["verbs"]}


def _resource(node: ast.expr) -> str:
    """`paths.X` as the plural it names; anything else fails the audit (a resource it cannot read)."""
    assert isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "paths", ast.unparse(node)
    return str(getattr(paths, node.attr).plural)


def kube_calls() -> set[tuple[str, str]]:
    """(resource, verb) of every client call and informer in dispatcher/ (`<x>.kube.m(paths.X` or `client.m(`)."""
    found = set()
    for path in sorted((REPO / "dispatcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if node.func.attr == "Informer" and name == "informer":
                found.update((_resource(node.args[1]), verb) for verb in INFORMER_VERBS)
            elif name in ("kube", "client") and node.func.attr == "read_log":
                found.add(("pods/log", "get"))
            elif name in ("kube", "client") and node.func.attr in VERBS:
                found.update((_resource(node.args[0]), verb) for verb in VERBS[node.func.attr])
    return found


def test_the_role_grants_exactly_what_the_dispatcher_s_calls_need() -> None:
    calls = kube_calls()
    assert ("jobs", "create") in calls and ("pods/log", "get") in calls, "the audit no longer reads the calls"
    assert calls == granted(role()), "a call of the dispatcher is not granted, or the Role grants an unused verb"
    assert ("pods", "get") not in granted(role())


def _calls(namespace: str) -> dict[tuple[str, str], Callable[[kube.Client], object]]:
    """One call per (resource, verb), made as the dispatcher makes it, on objects that exist."""
    selector = "app.kubernetes.io/managed-by=test-cabinet-dispatcher"
    job = {"metadata": {"generateName": "rbac-", "labels": {"app.kubernetes.io/managed-by": "test-cabinet-dispatcher"}},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "driver", "image": "x"}]}}}}
    return {
        ("jobs", "create"): lambda k: k.create(paths.JOB, job, namespace=namespace),
        ("jobs", "get"): lambda k: k.get(paths.JOB, name="present", namespace=namespace),
        ("jobs", "list"): lambda k: informer.Informer(k, paths.JOB, handler=print, namespace=namespace,
                                                      label_selector=selector)._relist(),
        ("jobs", "watch"): lambda k: next(iter(k.watch(paths.JOB, namespace=namespace, label_selector=selector,
                                                       resource_version="0", timeout_seconds=1)), None),
        ("jobs", "delete"): lambda k: k.delete(paths.JOB, name="absent", namespace=namespace,
                                               body=jobspec.deletion(), missing_ok=True),
        ("pods", "list"): lambda k: list(k.each(paths.POD, namespace=namespace, label_selector=selector)),
        ("pods", "delete"): lambda k: k.delete(paths.POD, name="absent", namespace=namespace, missing_ok=True),
        ("pods/log", "get"): lambda k: k.read_log(namespace=namespace, pod="sandbox", container="c", tail_lines=1),
        ("secrets", "create"): lambda k: k.create(paths.SECRET, {"metadata": {"generateName": "rbac-"}},
                                                  namespace=namespace),
        ("secrets", "get"): lambda k: k.get(paths.SECRET, name="present", namespace=namespace),
        ("events", "list"): lambda k: list(k.each(paths.EVENT, namespace=namespace,
                                                  field_selector="involvedObject.kind=Job")),
    }


def _status(call: Callable[[kube.Client], object], client: kube.Client) -> int:
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
    clients = {name: clusterconfig.load(kubeconfig=control_plane.mint_kubeconfig(namespace=namespace, service_account=name),
                               retries=0)
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
