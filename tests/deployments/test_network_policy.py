"""The controller's NetworkPolicy admits only what must reach each port: /metrics from Prometheus's
pods in the monitoring namespace the operating docs bind, the probes' port from no one but the pod's
own node (which NetworkPolicy always admits: the kubelet), nothing else. The local cluster's bridge
enforces no NetworkPolicy, so what is proven here is the policy's content, from the source and from
the part as the release renders it (kubectl's kustomize), never its enforcement."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest

from devcluster import local
from release import bundle
from tests.deployments.test_manifests import documents

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(found)


def _bound_scraper() -> tuple[str, str]:
    """(namespace, ServiceAccount) of the scraper docs/operating.md binds to dispatch-metrics-reader."""
    found = re.search(r"--clusterrole=dispatch-metrics-reader --serviceaccount=([a-z0-9-]+):([a-z0-9-]+)",
                      (ROOT / "docs" / "operating.md").read_text())
    assert found, "docs/operating.md binds no scraper to dispatch-metrics-reader"
    return found.group(1), found.group(2)


def test_the_policy_selects_the_controller_pods_and_only_their_ingress() -> None:
    docs = documents("controller")
    policy = _one(docs, "NetworkPolicy")
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["podSelector"].keys() == {"matchLabels"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: the apiserver is its peer


def test_metrics_are_admitted_from_the_monitoring_namespace_s_prometheus_pods_alone() -> None:
    docs = documents("controller")
    rules = _one(docs, "NetworkPolicy")["spec"]["ingress"]
    ports = {p["name"]: p["containerPort"] for p in _container(docs)["ports"]}
    service_port = _one(docs, "Service")["spec"]["ports"][0]["targetPort"]
    namespace, _ = _bound_scraper()
    (rule,) = [r for r in rules if any(p["port"] in ("metrics", ports["metrics"]) for p in r["ports"])]
    assert rule["ports"] == [{"port": service_port, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_no_rule_admits_everyone_or_a_port_the_probes_alone_use() -> None:
    docs = documents("controller")
    rules = _one(docs, "NetworkPolicy")["spec"]["ingress"]
    container = _container(docs)
    probed = {container[p]["httpGet"]["port"] for p in ("livenessProbe", "readinessProbe")}
    assert probed == {"health"}
    for rule in rules:
        assert rule.get("ports") and rule.get("from"), f"a rule without ports or sources admits too much: {rule}"
        assert all("ipBlock" not in source for source in rule["from"]), rule
        assert not {p["port"] for p in rule["ports"]} & (probed | {8080}), rule
    declared = {p["name"] for p in container["ports"]}
    assert declared == {"health", "metrics"}, "a new port needs its rule in networkpolicy.yaml"


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return bundle.kustomize_build("controller", kustomize=local.kustomize())


def test_the_release_carries_the_policy_into_the_controller_s_namespace(rendered: list[dict[str, Any]]) -> None:
    policy = _one(rendered, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == _one(rendered, "Deployment")["metadata"]["namespace"] == "dispatch-system"
    assert policy["spec"] == _one(documents("controller"), "NetworkPolicy")["spec"]
