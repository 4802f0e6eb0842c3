"""The shipped manifests (deployments/k8s/base) are well-formed: every
kustomization lists files or folders that exist, and every document parses
and names its kind. What each Role grants is proven on the real apiserver by
the component's own RBAC tests."""

from __future__ import annotations

import pathlib

import yaml

BASE = pathlib.Path(__file__).resolve().parents[2] / "deployments" / "k8s" / "base"


def kustomizations() -> list[pathlib.Path]:
    return sorted(BASE.rglob("kustomization.yaml"))


def test_every_kustomization_lists_only_what_exists() -> None:
    assert kustomizations(), "no kustomization under deployments/k8s/base"
    for k in kustomizations():
        doc = yaml.safe_load(k.read_text())
        assert doc["kind"] == "Kustomization", k
        for res in doc["resources"]:
            target = k.parent / res
            assert target.exists(), f"{k}: {res} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{k}: {res} has no kustomization.yaml"


def test_the_top_level_kustomization_includes_every_part() -> None:
    top = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    parts = {p.name for p in BASE.iterdir() if p.is_dir()}
    assert parts <= set(top["resources"]), parts - set(top["resources"])


def test_every_manifest_parses_and_names_its_kind() -> None:
    files = [f for f in BASE.rglob("*.yaml") if f.name != "kustomization.yaml"]
    assert files
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc is None:
                continue
            assert doc.get("apiVersion") and doc.get("kind"), f"{f}: a document without apiVersion/kind"
            assert doc.get("metadata", {}).get("name"), f"{f}: {doc['kind']} without a name"
