"""The shipped manifest sources (deployments/k8s/base) are well-formed: each part's kustomization
lists files that exist, every document parses and names its kind, every object carries the standard
`app.kubernetes.io/*` labels, each namespaced part makes its own Namespace under the restricted Pod
Security Standard, no image is `:latest` or `localhost/` (the sources name `dispatch/NAME:unreleased`,
which `make release` pins), and there is no top-level kustomization that would put the namespace-less
parts into whatever namespace is current. What each Role grants is proven on the real apiserver by
the component's own RBAC tests; that the parts render and apply, by test_apply_with_kubectl.py."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

BASE = pathlib.Path(__file__).resolve().parents[2] / "deployments" / "k8s" / "base"
PARTS = ("controller", "dispatcher", "sidecar")
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}


def documents(part: str) -> list[dict[str, Any]]:
    return [d for f in sorted((BASE / part).glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]


def images_named(node: Any) -> list[str]:
    """Every container image and every *_IMAGE env value under NODE."""
    if isinstance(node, list):
        return [i for v in node for i in images_named(v)]
    if not isinstance(node, dict):
        return []
    found = [node["image"]] if isinstance(node.get("image"), str) else []
    if str(node.get("name", "")).endswith("_IMAGE") and "value" in node:
        found.append(node["value"])
    return found + [i for v in node.values() for i in images_named(v)]


def test_the_parts_and_no_top_level_kustomization() -> None:
    assert {p.name for p in BASE.iterdir()} == set(PARTS)


def test_every_kustomization_lists_only_what_exists() -> None:
    for part in PARTS:
        k = BASE / part / "kustomization.yaml"
        doc = yaml.safe_load(k.read_text())
        assert doc["kind"] == "Kustomization", k
        listed = set(doc["resources"])
        on_disk = {f.name for f in (BASE / part).glob("*.yaml") if f.name != "kustomization.yaml"}
        assert listed == on_disk, (part, listed ^ on_disk)


def test_every_manifest_parses_names_its_kind_and_carries_the_standard_labels() -> None:
    for part in PARTS:
        docs = documents(part)
        assert docs, part
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind"), f"{part}: a document without apiVersion/kind"
            meta = doc.get("metadata", {})
            assert meta.get("name"), f"{part}: {doc['kind']} without a name"
            labels = meta.get("labels") or {}
            assert labels.get("app.kubernetes.io/part-of") == "dispatch-k8s", (part, doc["kind"], labels)
            assert labels.get("app.kubernetes.io/component") == ("controller" if part == "controller" else part), \
                (part, doc["kind"], labels)
            assert labels.get("app.kubernetes.io/name"), (part, doc["kind"])
            assert "namespace" not in meta, f"{part}: {doc['kind']} names its namespace; the kustomization sets it"


def test_each_namespaced_part_makes_its_namespace_under_the_restricted_standard() -> None:
    for part in ("controller", "dispatcher"):
        namespace = yaml.safe_load((BASE / part / "kustomization.yaml").read_text())["namespace"]
        (ns,) = [d for d in documents(part) if d["kind"] == "Namespace"]
        assert ns["metadata"]["name"] == namespace
        assert RESTRICTED.items() <= ns["metadata"]["labels"].items(), ns["metadata"]["labels"]
    assert "namespace" not in yaml.safe_load((BASE / "sidecar" / "kustomization.yaml").read_text()), \
        "the sidecar's RBAC goes into each training namespace (-n NS)"
    assert not [d for d in documents("sidecar") if d["kind"] == "Namespace"]


def test_the_controller_part_has_what_an_install_needs() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents("controller")}
    assert kinds >= {("Namespace", "dispatch-system"), ("ServiceAccount", "dispatch-controller"),
                     ("ClusterRole", "dispatch-controller"), ("Deployment", "dispatch-controller"),
                     ("PodDisruptionBudget", "dispatch-controller"), ("PriorityClass", "dispatch-controller"),
                     ("AdmissionCheck", "dispatch-admission"), ("Service", "dispatch-controller-metrics")}
    (deployment,) = [d for d in documents("controller") if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "dispatch-controller"


def test_every_pod_runs_restricted_with_a_read_only_root_and_sized_requests() -> None:
    for part in PARTS:
        for doc in (d for d in documents(part) if d["kind"] == "Deployment"):
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
                assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
                assert {"cpu", "memory"} <= c["resources"]["requests"].keys() and "memory" in c["resources"]["limits"]


def test_every_image_is_a_source_reference_the_release_pins() -> None:
    named = [i for part in PARTS for i in images_named(documents(part))]
    assert sorted(set(named)) == ["dispatch/controller:unreleased", "dispatch/dispatcher:unreleased",
                                  "dispatch/test-driver:unreleased"], named


def dispatcher_liveness() -> tuple[list[str], str, dict[str, Any]]:
    """The dispatcher's exec liveness command, its TCAB_DISPATCHER_HEARTBEAT_FILE, and its pod spec."""
    (deployment,) = [d for d in documents("dispatcher") if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return container["livenessProbe"]["exec"]["command"], env["TCAB_DISPATCHER_HEARTBEAT_FILE"], pod


def test_the_dispatcher_s_liveness_probe_reads_the_heartbeat_it_keeps_on_an_emptydir() -> None:
    """The probe runs dispatcher.alive as the image's entry point runs the dispatcher, on the very file
    the loop touches; that file is on a mounted emptyDir (the root filesystem stays read-only)."""
    command, heartbeat, pod = dispatcher_liveness()
    assert command[:6] == ["/usr/bin/python3.11", "-S", "-E", "-B", "-m", "dispatcher.alive"]
    assert command[6:] == ["--max-age", command[7], heartbeat] and float(command[7]) >= 10
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if heartbeat.startswith(m["mountPath"].rstrip("/") + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume and not mount.get("readOnly", False)
