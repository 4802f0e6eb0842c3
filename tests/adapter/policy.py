"""The admission policy `dispatch-identity` installed on a test's plane as the release renders it
(deployments/k8s/base/controller/identity-policy.yaml, the prologue written into its parameter by
release/bundle.py), and removed again: cluster-wide, but bound to opted-in namespaces only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kubernetes.client

from devcluster import harness, local, scenario
from release import bundle
from tests import waiting
from toolkit import kube, names, paths

POLICY = paths.Resource("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies",
                        "MutatingAdmissionPolicy", False)
BINDING = paths.Resource("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicybindings",
                         "MutatingAdmissionPolicyBinding", False)
NAMESPACE = paths.Resource("", "v1", "namespaces", "Namespace", False)
HOME = "dispatch-system"  # the binding's parameter lives in the controller's namespace
PROBE = "dispatch-identity-probe"
OPTED_IN = {names.IDENTITY_NAMESPACE_LABEL: names.IDENTITY_NAMESPACE_VALUE}


def rendered() -> dict[str, dict[str, Any]]:
    """Kind -> the policy, its binding and its parameter, from the controller's release manifest."""
    docs = bundle.kustomize_build("controller", kustomize=local.kustomize())
    found = {d["kind"]: bundle.with_prologue(d) for d in docs if d["metadata"]["name"] == "dispatch-identity"}
    assert set(found) == {"ConfigMap", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}, sorted(found)
    return found


def _body(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}


@contextlib.contextmanager
def installed(api: kubernetes.client.ApiClient) -> Iterator[kube.Client]:
    client = kube.from_api_client(api)
    if not any(ns["metadata"]["name"] == HOME for ns in client.list(NAMESPACE)[0]):
        harness.create_namespace(api, HOME)  # other suites on the same plane may have made it
    docs = rendered()
    client.create(paths.CONFIG_MAP, _body(docs["ConfigMap"]), namespace=HOME)
    client.create(POLICY, _body(docs["MutatingAdmissionPolicy"]))
    client.create(BINDING, _body(docs["MutatingAdmissionPolicyBinding"]))
    harness.create_namespace(api, PROBE, labels=OPTED_IN)
    # Where Trainer's webhooks run, a TrainJob names a runtime that exists.
    client.create(paths.TRAINING_RUNTIME, scenario.runtime("probe"), namespace=PROBE)
    try:
        # The apiserver applies a new policy once its own informers have it: a dry-run create (which
        # admission policies see as any create) says when.
        probe = {"apiVersion": paths.TRAINJOB.api_version, "kind": "TrainJob", "metadata": {"name": "probe"},
                 "spec": {"runtimeRef": {"name": "probe", "kind": "TrainingRuntime"},
                          "trainer": {"command": ["true"]}}}
        def in_effect() -> bool:
            try:
                made = client.request("POST", paths.TRAINJOB.path(namespace=PROBE), query={"dryRun": "All"},
                                      body=probe)
            except kube.ApiError:  # a plane just up may not serve the TrainJob CRD yet
                return False
            return names.DERIVED_ANNOTATION in (made["metadata"].get("annotations") or {})

        waiting.until("the policy in effect", in_effect, timeout=60)
        yield client
    finally:
        client.delete(BINDING, name="dispatch-identity", missing_ok=True)
        client.delete(POLICY, name="dispatch-identity", missing_ok=True)
        client.delete(paths.CONFIG_MAP, name="dispatch-identity", namespace=HOME, missing_ok=True)
        client.delete(NAMESPACE, name=PROBE, missing_ok=True)
