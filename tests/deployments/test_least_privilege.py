"""Every shipped Deployment runs its containers with least privilege: non-root, the runtime's default
seccomp profile, no privilege escalation, every capability dropped.

The judge is the apiserver: each Deployment's pod is admitted in a namespace that enforces the
restricted Pod Security Standard (tests/podsecurity.py), where the same pod with privilege escalation
allowed is refused. The reading of the manifests below only finds the Deployments."""

from __future__ import annotations

import pathlib
from typing import Any

import kubernetes.client
import pytest
import yaml

from tests import podsecurity

BASE = pathlib.Path(__file__).resolve().parents[2] / "deployments" / "k8s" / "base"


def shipped(kind: str) -> list[dict[str, Any]]:
    return [doc for path in sorted(BASE.rglob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == kind]


def deployments() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(BASE.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment":
                found.append((f"{path.relative_to(BASE)}:{doc['metadata']['name']}", doc))
    return found


def test_the_dispatcher_and_the_controller_are_both_shipped() -> None:
    assert {d["metadata"]["name"] for _, d in deployments()} >= {"tcab-dispatcher", "dispatch-controller"}


@pytest.mark.parametrize(("where", "doc"), deployments(), ids=[w for w, _ in deployments()])
def test_every_deployment_s_pod_is_admitted_under_the_restricted_pod_security_standard(
        api_client: kubernetes.client.ApiClient, namespace: str, where: str, doc: dict[str, Any]) -> None:
    pod = doc["spec"]["template"]["spec"]
    if "priorityClassName" in pod:  # the shipped PriorityClass, as the part installs it (cluster-scoped)
        (priority,) = [p for p in shipped("PriorityClass") if p["metadata"]["name"] == pod["priorityClassName"]]
        try:
            kubernetes.client.SchedulingV1Api(api_client).create_priority_class(priority)
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
    podsecurity.restricted(api_client, namespace, service_accounts=(pod["serviceAccountName"],))
    assert podsecurity.admit(api_client, namespace, pod) is None, where
    refusal = podsecurity.admit(api_client, namespace, podsecurity.loosened(pod))
    assert refusal is not None and "allowPrivilegeEscalation" in refusal, "the restricted level is enforced"
