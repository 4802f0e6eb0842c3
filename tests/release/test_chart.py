"""The release's Helm chart (release/chart.py) with the real helm, built from its Go module by
devcluster/build-controllers.sh (`tools`; `make test` builds it first, and a helm that cannot be
built fails these tests, never skips them).

The bundle is written as the release writes it (`bundle.write`: the manifests rendered by the real
`kubectl kustomize`, the chart beside them) for four images named by digest; no image is built,
since what is under test is what the chart renders, not the images. `helm template` with the
defaults must give the objects of the release's controller.yaml, and with the optional parts on,
those of sidecar-rbac.yaml in each listed namespace, dispatcher.yaml and deployments/monitoring:
compared as parsed objects, Helm's two labels (managed-by, helm.sh/chart) left out. Then the chart
is installed with `helm install` on a control plane of its own (with the Trainer, JobSet and Kueue
CRDs), and `helm uninstall` (its guard hook left out: no node runs its Job here) leaves nothing of it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pathlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster import harness, local
from devcluster import stack as stack_mod
from release import bundle, chart, images, version

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
REGISTRY = "registry.test:5000/team"
VERSION = "0.1.0+gtest"
TAG = "0.1.0-gtest"
TRAINING = ("training", "team-b")
OURS = "app.kubernetes.io/part-of=dispatch-k8s"
Objects = dict[tuple[str, str, str], dict[str, Any]]


class Helm:
    def __init__(self, binary: pathlib.Path, home: pathlib.Path) -> None:
        self.binary = binary
        # Helm's cache, configuration and data in the test's own directory, never the user's.
        self.env = {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=120,
                              check=False)


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = stack_mod.build_binaries("tools") / "helm"  # builds it when missing; a failed build raises
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary}: no helm after devcluster/build-controllers.sh tools (run `make controllers`)")
    return Helm(binary, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, pathlib.Path], dict[str, str]]:
    build = version.describe(REPO, version=VERSION)
    references = {name: f"{REGISTRY}/{images.repository(name)}:{TAG}@sha256:{hashlib.sha256(name.encode()).hexdigest()}"
                  for name in images.NAMES}
    files = bundle.write(tmp_path_factory.mktemp("release"), build=build, registry=REGISTRY, references=references,
                         kustomize=local.kustomize())
    return files, references


@pytest.fixture(scope="module")
def tgz(released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> str:
    return str(released[0][chart.filename(VERSION)])


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def keyed(docs: list[dict[str, Any]]) -> Objects:
    out: Objects = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert key not in out, f"{key} twice"
        out[key] = doc
    return out


def rendered(helm: Helm, tgz: str, *args: str, hooks: bool = False) -> Objects:
    """`helm template` of the chart, Helm's own labels left out; only its hooks with HOOKS, else
    only what is not a hook."""
    done = helm("template", "dispatch-k8s", tgz, *args)
    assert done.returncode == 0, done.stderr
    docs = [d for d in documents(done.stdout)
            if ("helm.sh/hook" in (d["metadata"].get("annotations") or {})) == hooks]
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels.pop("app.kubernetes.io/managed-by") == "Helm"
        assert labels.pop("helm.sh/chart") == "dispatch-k8s-" + VERSION.replace("+", "_")
    return keyed(docs)


def release_file(files: dict[str, pathlib.Path], name: str, *, namespace: str | None = None) -> Objects:
    docs = documents(files[name].read_text())
    if namespace is not None:
        for doc in docs:
            doc["metadata"]["namespace"] = namespace
    return keyed(docs)


def test_the_chart_source_carries_the_package_version() -> None:
    source = yaml.safe_load((chart.SOURCE / "Chart.yaml").read_text())
    assert source["version"] == source["appVersion"] == version.package_version(REPO)


def test_the_release_lists_and_sums_the_chart(released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    files, _ = released
    sums = files["SHA256SUMS"].read_text()
    assert f"  {chart.filename(VERSION)}\n" in sums
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=files["SHA256SUMS"].parent, capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 5, checked.stdout


@pytest.mark.parametrize("values", [[], ["--set", "dispatcher.enabled=true,monitoring.enabled=true,identityPolicy.enabled=false",
                                         "--set", "sidecar.namespaces={training}"]], ids=["defaults", "every-part"])
def test_helm_lint_passes(helm: Helm, tgz: str, values: list[str]) -> None:
    done = helm("lint", "--strict", tgz, *values)
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr


def test_the_defaults_render_the_release_s_controller_yaml(
        helm: Helm, tgz: str, released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    files, references = released
    got = rendered(helm, tgz)
    assert got == release_file(files, "controller.yaml")
    images_named = bundle._images_named(list(got.values()))
    assert images_named == [references["controller"]]


def test_the_optional_parts_render_their_release_files(
        helm: Helm, tgz: str, released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    files, _ = released
    got = rendered(helm, tgz, "--set", "dispatcher.enabled=true", "--set", f"sidecar.namespaces={{{','.join(TRAINING)}}}")
    want = {**release_file(files, "controller.yaml"), **release_file(files, "dispatcher.yaml")}
    for namespace in TRAINING:
        want |= release_file(files, "sidecar-rbac.yaml", namespace=namespace)
    assert got == want


def test_the_sidecar_s_rights_go_to_the_service_accounts_listed(helm: Helm, tgz: str) -> None:
    """By default the accounts the release binds (the pods' own `default`, and `dispatch-sidecar`);
    sidecar.serviceAccounts names others (a runtime's own account, holding a cloud binding)."""
    def subjects(*values: str) -> list[dict[str, str]]:
        got = rendered(helm, tgz, "--set", "sidecar.namespaces={training}", *values)
        return list(got[("RoleBinding", "training", "dispatch-sidecar")]["subjects"])
    assert subjects() == [{"kind": "ServiceAccount", "name": "default"},
                          {"kind": "ServiceAccount", "name": "dispatch-sidecar"}]
    assert subjects("--set", "sidecar.serviceAccounts={trainer-cloud,default}") == [
        {"kind": "ServiceAccount", "name": "trainer-cloud"}, {"kind": "ServiceAccount", "name": "default"}]


def test_the_identity_policy_is_left_out_when_off(
        helm: Helm, tgz: str, released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    files, _ = released
    got = rendered(helm, tgz, "--set", "identityPolicy.enabled=false")
    released_keys = set(release_file(files, "controller.yaml"))
    assert set(got) < released_keys
    assert {(kind, name) for kind, _, name in released_keys - set(got)} == {
        ("MutatingAdmissionPolicy", "dispatch-identity"), ("MutatingAdmissionPolicyBinding", "dispatch-identity"),
        ("ConfigMap", "dispatch-identity")}


def test_monitoring_renders_deployments_monitoring(
        helm: Helm, tgz: str, released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    files, _ = released
    got = rendered(helm, tgz, "--set", "monitoring.enabled=true,monitoring.ruleNamespace=prometheus")
    extra = {key: doc for key, doc in got.items() if key not in release_file(files, "controller.yaml")}
    want = {}
    for doc in bundle.monitoring_objects(version.describe(REPO, version=VERSION)):
        if doc["kind"] == "PrometheusRule":
            doc["metadata"]["namespace"] = "prometheus"
        want[(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])] = doc
    assert extra == want
    # Prometheus's own templates pass through Helm as written.
    rule = extra[("PrometheusRule", "prometheus", "dispatch-controller")]
    assert "{{ $labels.namespace }}" in json.dumps(rule)


def test_changed_values_show_in_the_output(
        helm: Helm, tgz: str, released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    _, references = released
    got = rendered(helm, tgz, "--set", "controller.replicas=3,images.registry=mirror.test/dispatch-mirror",
                   "--set", "images.testDriver.registry=drivers.test,images.testDriver.digest=",
                   "--set", "controller.resources.requests.cpu=250m",
                   "--set", "namespace=team-dispatch,dispatcher.enabled=true,dispatcher.namespace=team-runs",
                   "--set", "dispatcher.backendSecret=runs-backend,monitoring.enabled=true")
    deployment = got[("Deployment", "team-dispatch", "dispatch-controller")]
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "250m", "memory": "160Mi"}
    digest = references["controller"].partition("@")[2]
    assert container["image"] == f"mirror.test/dispatch-mirror/dispatch/controller:{TAG}@{digest}"
    dispatcher = got[("Deployment", "team-runs", "tcab-dispatcher")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in dispatcher["env"]}
    assert env["TCAB_DISPATCHER_DRIVER_IMAGE"]["value"] == f"drivers.test/dispatch/test-driver:{TAG}"
    assert env["TCAB_BACKEND_URL"]["valueFrom"]["secretKeyRef"]["name"] == "runs-backend"
    assert dispatcher["image"].startswith("mirror.test/dispatch-mirror/dispatch/dispatcher:")
    # Every reference to a namespace follows it: objects, subjects, the policy's parameter, the scrape.
    text = json.dumps(list(got.values()))
    assert '"dispatch-system"' not in text and '"tcab-dispatch"' not in text
    (binding,) = [d for (kind, _, _), d in got.items() if kind == "MutatingAdmissionPolicyBinding"]
    assert binding["spec"]["paramRef"]["namespace"] == "team-dispatch"
    subjects = got[("ClusterRoleBinding", "", "dispatch-controller")]["subjects"]
    assert [s["namespace"] for s in subjects] == ["team-dispatch"]
    assert ("Namespace", "", "team-dispatch") in got and ("Namespace", "", "team-runs") in got


def test_the_uninstall_guard_is_a_pre_delete_hook_of_the_controller_image_that_only_reads(
        helm: Helm, tgz: str, released: tuple[dict[str, pathlib.Path], dict[str, str]]) -> None:
    files, references = released
    got = rendered(helm, tgz, "--set", "namespace=team-dispatch", hooks=True)
    assert set(got) == {("ServiceAccount", "team-dispatch", "dispatch-uninstall-guard"),
                        ("ClusterRole", "", "dispatch-uninstall-guard"),
                        ("ClusterRoleBinding", "", "dispatch-uninstall-guard"),
                        ("Job", "team-dispatch", "dispatch-uninstall-guard")}
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in got.values()} == {"pre-delete"}
    (rule,) = got[("ClusterRole", "", "dispatch-uninstall-guard")]["rules"]
    assert rule["verbs"] == ["get", "list"] and rule["apiGroups"] == ["kueue.x-k8s.io"]
    job = got[("Job", "team-dispatch", "dispatch-uninstall-guard")]
    assert int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) > max(
        int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, d in got.items() if k[0] != "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == references["controller"]
    assert container["command"][-2:] == ["-m", "controller.uninstall_guard"]
    # As restricted a pod as the controller's own (the namespace enforces Pod Security restricted).
    deployment = release_file(files, "controller.yaml")[("Deployment", "dispatch-system", "dispatch-controller")]
    assert pod["securityContext"] == deployment["spec"]["template"]["spec"]["securityContext"]
    (controller,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"] == controller["securityContext"]
    assert got[("ClusterRoleBinding", "", "dispatch-uninstall-guard")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "dispatch-uninstall-guard", "namespace": "team-dispatch"}]


def test_the_metrics_port_admits_the_scrapers_listed(helm: Helm, tgz: str, tmp_path: pathlib.Path) -> None:
    """By default Prometheus's pods in `monitoring` (the release's NetworkPolicy); controller.metricsFrom
    names a team's own scraper, and the rule keeps its port."""
    def rule(*values: str) -> dict[str, Any]:
        policy = rendered(helm, tgz, *values)[("NetworkPolicy", "dispatch-system", "dispatch-controller")]
        (only,) = policy["spec"]["ingress"]
        return dict(only)
    assert rule()["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                 "podSelector": {"matchLabels": {"app": "vmagent"}}}, {"ipBlock": {"cidr": "10.8.0.0/16"}}]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"controller": {"metricsFrom": scrapers}}))
    assert rule("-f", str(values)) == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": scrapers}


@pytest.mark.parametrize(("values", "refusal"), [
    (["--set", "controler.replicas=3"], "controler"),
    (["--set", "sidecar.namespaces={Training}"], "Training"),
    (["--set", "images.controller.tag=,images.controller.digest="], "/images/controller"),
    (["--set", "sidecar.serviceAccounts={Trainer_Cloud}"], "/sidecar/serviceAccounts/0"),
    (["--set", "sidecar.serviceAccounts=null"], "serviceAccounts"),
    (["--set", "controller.metricsFrom=null"], "metricsFrom"),
    (["--set-json", "controller.metricsFrom=[]"], "/controller/metricsFrom"),
    (["--set-json", 'controller.metricsFrom=[{"namespaceSelectr":{}}]'], "namespaceSelectr"),
], ids=["misspelt-key", "not-a-namespace-name", "no-tag-nor-digest", "not-an-account-name", "no-account",
        "no-scraper", "every-source", "misspelt-peer"])
def test_a_bad_value_is_refused(helm: Helm, tgz: str, values: list[str], refusal: str) -> None:
    done = helm("template", "dispatch-k8s", tgz, *values)
    assert done.returncode == 1 and refusal in done.stderr, done.stderr


def ours(kubectl: list[str]) -> set[str]:
    kinds = ("namespaces,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,deployments,services,"
             "poddisruptionbudgets,networkpolicies,priorityclasses,admissionchecks.kueue.x-k8s.io,configmaps,"
             "mutatingadmissionpolicies,mutatingadmissionpolicybindings")
    got = subprocess.run([*kubectl, "get", kinds, "-A", "-l", OURS, "-o", "json"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    return {f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
            for o in json.loads(got.stdout)["items"]}


@pytest.fixture
def plane() -> Iterator[harness.ControlPlane]:
    with harness.ControlPlane(scheduler=False) as started:
        yield started


def test_helm_install_makes_every_object_and_uninstall_removes_them(
        helm: Helm, tgz: str, plane: harness.ControlPlane) -> None:
    kubectl = [str(harness.binary(local.KUBECTL, plane.bin_dir)), "--kubeconfig", plane.kubeconfig]
    for namespace in TRAINING:
        subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True)
    values = ["--set", "dispatcher.enabled=true", "--set", f"sidecar.namespaces={{{','.join(TRAINING)}}}"]
    listed = subprocess.run([*kubectl, "api-resources", "--namespaced=false", "--no-headers"], capture_output=True,
                            text=True, check=True).stdout
    cluster_scoped = {line.split()[-1] for line in listed.splitlines()}
    # A cluster-scoped object's namespace (kustomize writes one on the admission policy's) is not kept.
    want = {f"{kind}/{'' if kind in cluster_scoped else ns}/{name}" for kind, ns, name in rendered(helm, tgz, *values)}
    k = ["--kubeconfig", plane.kubeconfig, "--namespace", "default"]
    installed = helm("install", "dispatch-k8s", tgz, *k, *values)
    assert installed.returncode == 0, installed.stderr
    assert "STATUS: deployed" in installed.stdout and "--sidecar-image registry.test:5000/team/dispatch/sidecar:" \
        in installed.stdout, installed.stdout
    assert ours(kubectl) == want
    record = [*kubectl, "get", "secrets", "-n", "default", "-l", "owner=helm,name=dispatch-k8s", "-o", "name"]
    assert subprocess.run(record, capture_output=True, text=True, check=False).stdout.strip()
    # Without its hooks: the uninstall guard is a Job, and this control plane has no node to run it
    # (tests/e2e/test_the_release_built_without_root.py uninstalls through it on the real node).
    uninstalled = helm("uninstall", "dispatch-k8s", *k, "--wait", "--no-hooks")
    assert uninstalled.returncode == 0, uninstalled.stderr
    deadline = time.monotonic() + 60
    while (left := ours(kubectl)) and time.monotonic() < deadline:
        time.sleep(1)  # a Namespace goes once the namespace controller has emptied it
    assert left == set()
    assert subprocess.run(record, capture_output=True, text=True, check=False).stdout.strip() == ""
    for namespace in TRAINING:  # made by the user, left to the user
        assert subprocess.run([*kubectl, "get", "namespace", namespace], capture_output=True, check=False).returncode == 0


def test_the_chart_s_files_are_its_source_and_the_templates_of_each_part() -> None:
    names = {str(p.relative_to(chart.SOURCE)) for p in chart.SOURCE.rglob("*") if p.is_file()}
    assert names == {"Chart.yaml", "README.md", "values.yaml", "values.schema.json", "templates/_helpers.tpl",
                     "templates/NOTES.txt"}, "a manifest in the chart's source would be a second copy"


def test_a_version_that_is_not_semver_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(bundle.ReleaseError, match=r"^version '0\.2\.0rc1': the chart's version, which must be SemVer 2"):
        bundle.build_release(registry=REGISTRY, version="0.2.0rc1", out_dir=tmp_path, push=lambda *a: "",
                             local_images={}, kustomize=pathlib.Path("/nonexistent/kustomize"))


def test_the_archive_is_the_same_bytes_for_the_same_files() -> None:
    files = {"Chart.yaml": "name: x\n", "templates/a.yaml": "{}\n"}
    assert chart.archive(files, mtime=1) == chart.archive(copy.deepcopy(files), mtime=1)
