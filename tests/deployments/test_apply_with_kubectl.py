"""The shipped manifests on a cluster, each part applied on its own the way docs/install.md tells a
user to: `kubectl apply --server-side -k deployments/k8s/base/PART` (the sidecar's RBAC with `-n`
a training namespace), with the kubectl built beside the local cluster from the same Kubernetes
release, on a control plane of its own (with the Trainer, JobSet and Kueue CRDs the manifests
refer to). The release bundle (release/bundle.py) is these same renderings with the images pinned.

Each part lands in its own namespace and nothing in the current one; applying again changes nothing.
Then each ServiceAccount is checked by use, as the apiserver's authorizer decides for it (kubectl
`--as`, which the admin may impersonate): every verb its Role or ClusterRole grants is allowed
(`auth can-i`, one question per resource and verb, read from the manifests themselves), one real
request of each component's own succeeds, and requests outside its role are answered 403 Forbidden.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from devcluster import harness, local

pytestmark = pytest.mark.cluster

BASE = pathlib.Path(__file__).resolve().parents[2] / "deployments" / "k8s" / "base"
CONTROLLER_NS = "dispatch-system"
DISPATCHER_NS = "tcab-dispatch"
NAMESPACE = "training"  # a training namespace, where the sidecar's RBAC is applied (-n)
CURRENT = "default"  # the kubeconfig context's namespace: nothing of ours may land there
OURS = "app.kubernetes.io/part-of=dispatch-k8s"


class Kubectl:
    def __init__(self, plane: harness.ControlPlane) -> None:
        self.binary = str(harness.binary(local.KUBECTL, plane.bin_dir))
        self.kubeconfig = plane.kubeconfig

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, "--kubeconfig", self.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=60, check=False)


def apply_parts(k: Kubectl) -> None:
    for args in (["-k", str(BASE / "controller")], ["-k", str(BASE / "dispatcher")],
                 ["-k", str(BASE / "sidecar"), "-n", NAMESPACE]):
        applied = k("apply", "--server-side", *args)
        assert applied.returncode == 0, (args, applied.stderr)


@pytest.fixture(scope="module")
def kubectl() -> Iterator[Kubectl]:
    plane = harness.ControlPlane(scheduler=False)
    try:
        plane.start()
        k = Kubectl(plane)
        made = k("create", "namespace", NAMESPACE)
        assert made.returncode == 0, made.stderr
        apply_parts(k)
        yield k
    finally:
        plane.stop()


def identity(namespace: str, account: str) -> str:
    return f"--as=system:serviceaccount:{namespace}:{account}"


def grants() -> list[tuple[str, str, dict]]:
    """(namespace, ServiceAccount, rule) for every rule the manifests bind to a ServiceAccount."""
    homes = {"controller": CONTROLLER_NS, "dispatcher": DISPATCHER_NS, "sidecar": NAMESPACE}
    out = []
    for part, home in homes.items():
        docs = [d for f in sorted((BASE / part).glob("*.yaml")) if f.name != "kustomization.yaml"
                for d in yaml.safe_load_all(f.read_text()) if d]
        roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
        for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            ref = binding["roleRef"]
            role = roles[(ref["kind"], ref["name"])]
            for subject in binding["subjects"]:
                assert subject["kind"] == "ServiceAccount", binding
                ns = subject.get("namespace") or home
                out += [(ns, subject["name"], rule) for rule in role["rules"]]
    return out


def ours(k: Kubectl) -> dict[str, str]:
    """Every object of ours the apiserver holds (of the kinds we ship): kind/namespace/name -> resourceVersion."""
    kinds = ("namespaces,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,deployments,services,"
             "poddisruptionbudgets,networkpolicies,priorityclasses,admissionchecks.kueue.x-k8s.io,configmaps,"
             "mutatingadmissionpolicies,mutatingadmissionpolicybindings")
    got = k("get", kinds, "-A", "-l", OURS, "-o", "json")
    assert got.returncode == 0, got.stderr
    return {f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
            for o in json.loads(got.stdout)["items"]}


def test_each_part_lands_in_its_own_namespace_and_applies_again_unchanged(kubectl: Kubectl) -> None:
    before = ours(kubectl)
    shipped = [d for part in ("controller", "dispatcher", "sidecar") for f in sorted((BASE / part).glob("*.yaml"))
               if f.name != "kustomization.yaml" for d in yaml.safe_load_all(f.read_text()) if d]
    assert len(before) == len(shipped), sorted(before)
    apply_parts(kubectl)
    assert ours(kubectl) == before, "a second apply changed an object"
    for kind, name, ns in (("namespace", CONTROLLER_NS, None), ("deployment", "dispatch-controller", CONTROLLER_NS),
                           ("poddisruptionbudget", "dispatch-controller", CONTROLLER_NS),
                           ("service", "dispatch-controller-metrics", CONTROLLER_NS),
                           ("priorityclass", "dispatch-controller", None),
                           ("namespace", DISPATCHER_NS, None), ("deployment", "tcab-dispatcher", DISPATCHER_NS),
                           ("serviceaccount", "dispatch-sidecar", NAMESPACE),
                           ("admissioncheck.kueue.x-k8s.io", "dispatch-admission", None)):
        got = kubectl("get", kind, name, *(["-n", ns] if ns else []), "-o", "name")
        assert got.returncode == 0, (kind, name, got.stderr)
    assert not [key for key in before if f"/{CURRENT}/" in key], before
    for ns in (CONTROLLER_NS, DISPATCHER_NS):
        labels = json.loads(kubectl("get", "namespace", ns, "-o", "json").stdout)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels


def test_every_verb_each_role_grants_is_allowed_for_its_account(kubectl: Kubectl) -> None:
    asked = 0
    for ns, account, rule in grants():
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                base, _, sub = resource.partition("/")
                target = f"{base}.{group}" if group else base
                for name in rule.get("resourceNames") or [""]:
                    for verb in rule["verbs"]:
                        args = ["auth", "can-i", verb, f"{target}/{name}" if name else target, "-n", ns,
                                identity(ns, account), *([f"--subresource={sub}"] if sub else [])]
                        answer = kubectl(*args)
                        assert answer.stdout.strip() == "yes", (account, args, answer.stdout, answer.stderr)
                        asked += 1
    assert asked >= 30, asked  # the three components' rules were all read


@pytest.mark.parametrize(("account_ns", "account", "request_args"), [
    ("dispatch-system", "dispatch-controller", ["get", "secrets", "-A"]),
    ("dispatch-system", "dispatch-controller", ["delete", "pod", "trainer-0", "-n", NAMESPACE]),
    ("dispatch-system", "dispatch-controller", ["create", "namespace", "stolen"]),
    (DISPATCHER_NS, "tcab-dispatcher", ["get", "trainjobs.trainer.kubeflow.org", "-n", DISPATCHER_NS]),
    (DISPATCHER_NS, "tcab-dispatcher", ["create", "deployment", "x", "--image=x", "-n", DISPATCHER_NS]),
    (DISPATCHER_NS, "tcab-dispatcher", ["get", "jobs", "-n", "dispatch-system"]),
    (DISPATCHER_NS, "tcab-dispatcher", ["get", "secrets", "-n", NAMESPACE]),
    (NAMESPACE, "dispatch-sidecar", ["get", "secrets", "-n", NAMESPACE]),
    (NAMESPACE, "dispatch-sidecar", ["delete", "trainjobs.trainer.kubeflow.org", "llama", "-n", NAMESPACE]),
    (NAMESPACE, "dispatch-sidecar", ["get", "pods", "-n", NAMESPACE]),
])
def test_a_request_outside_the_role_is_forbidden(kubectl: Kubectl, account_ns: str, account: str,
                                                 request_args: list[str]) -> None:
    answer = kubectl(*request_args, identity(account_ns, account))
    # The authorizer answers before any lookup: 403 whether or not the object exists.
    assert answer.returncode == 1 and "forbidden" in answer.stderr.lower(), (answer.stdout, answer.stderr)


EVENT = """apiVersion: v1
kind: Event
metadata: {generateName: probe., namespace: training}
involvedObject: {apiVersion: trainer.kubeflow.org/v1alpha1, kind: TrainJob, name: probe, namespace: training}
reason: DispatchIdentityViolation
message: a probe of the sidecar's Role
type: Warning
"""


# What the controller asks about a /metrics caller: who the token is, and whether that user may get /metrics.
# (--validate=false: kubectl's schema check would list CRDs, which the account may not; the apiserver
# still authorizes the create itself.)
TOKEN_REVIEW = """apiVersion: authentication.k8s.io/v1
kind: TokenReview
spec: {token: not-a-token}
"""
ACCESS_REVIEW = """apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec: {user: someone, nonResourceAttributes: {path: /metrics, verb: get}}
"""


@pytest.mark.parametrize(("account_ns", "account", "request_args", "stdin"), [
    ("dispatch-system", "dispatch-controller", ["get", "workloads.kueue.x-k8s.io", "-A"], None),
    ("dispatch-system", "dispatch-controller", ["create", "--validate=false", "-f", "-"], TOKEN_REVIEW),
    ("dispatch-system", "dispatch-controller", ["create", "--validate=false", "-f", "-"], ACCESS_REVIEW),
    (DISPATCHER_NS, "tcab-dispatcher", ["create", "secret", "generic", "tcab-run-probe",
                                        "--from-literal=token=x", "-n", DISPATCHER_NS], None),
    (NAMESPACE, "dispatch-sidecar", ["create", "-f", "-"], EVENT),
])
def test_each_component_s_own_request_succeeds(kubectl: Kubectl, account_ns: str, account: str,
                                               request_args: list[str], stdin: str | None) -> None:
    answer = kubectl(*request_args, identity(account_ns, account), stdin=stdin)
    assert answer.returncode == 0, (answer.stdout, answer.stderr)


def test_the_metrics_reader_grants_get_on_metrics_and_nothing_else(kubectl: Kubectl) -> None:
    """dispatch-metrics-reader, bound as a user binds it to a scraper: get /metrics, nothing more."""
    bound = kubectl("create", "clusterrolebinding", "scraper-reads-metrics", "--clusterrole=dispatch-metrics-reader",
                    f"--serviceaccount={NAMESPACE}:scraper")
    assert bound.returncode == 0, bound.stderr
    scraper = identity(NAMESPACE, "scraper")
    assert kubectl("auth", "can-i", "get", "/metrics", scraper).stdout.strip() == "yes"
    for question in (["get", "/debug/pprof"], ["post", "/metrics"], ["list", "pods", "-A"],
                     ["get", "trainjobs.trainer.kubeflow.org", "-A"]):
        assert kubectl("auth", "can-i", *question, scraper).stdout.strip() == "no", question
    # The controller's own account may not read /metrics: a scraper's binding is a separate decision.
    assert kubectl("auth", "can-i", "get", "/metrics", identity("dispatch-system", "dispatch-controller")
                   ).stdout.strip() == "no"
