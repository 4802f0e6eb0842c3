"""The release bundle (release/bundle.py), made by `build_release` with real images pushed by
podman and rendered by the real `kustomize build`, then applied with `kubectl apply --server-side
-f` on a control plane of its own (with the Trainer, JobSet and Kueue CRDs). The chart it writes
beside the manifests is tested with helm in test_chart.py.

The images are four small ones built here from the test driver's context, one per release image
name and each with its own OCI labels (so each has its own digest): what is under test is the
pinning, not the images' content (tests/controller/test_image.py and the others test that). They are
pushed to a `dir:` destination, where the manifest podman wrote is on disk: its sha256 must be the
digest in every reference, in image fields and env values alike. The references name the release's
registry, not where the push went, as a local cluster's push to its own endpoint needs.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml

from devcluster import harness, local
from release import bundle, images, version
from tests.release.conftest import REGISTRY, REPO, TAG, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.images]

# For a release refused before anything is rendered: no kustomize runs.
NO_KUSTOMIZE = pathlib.Path("/nonexistent/kustomize")


def documents(path: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_bundle_has_one_manifest_per_part_the_chart_and_its_sums(made: tuple[bundle.Release, pathlib.Path]) -> None:
    release, _ = made
    out = release.files["SHA256SUMS"].parent
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "SHA256SUMS", "controller.yaml", f"dispatch-k8s-{VERSION}.tgz", f"dispatch-k8s-images-{VERSION}.tar",
        "dispatcher.yaml", "release.json", "sidecar-rbac.yaml"]
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 6, checked.stdout
    meta = json.loads(release.files["release.json"].read_text())
    assert (meta["version"], meta["tag"], meta["registry"]) == (VERSION, TAG, REGISTRY)
    assert meta["images"] == release.references and set(meta["images"]) == set(images.NAMES)


def test_every_reference_is_the_registry_the_tag_and_the_digest_podman_pushed(
        made: tuple[bundle.Release, pathlib.Path]) -> None:
    release, pushed = made
    digests = set()
    for name, ref in release.references.items():
        manifest = pushed / "dispatch" / name / "manifest.json"
        digest = "sha256:" + hashlib.sha256(manifest.read_bytes()).hexdigest()
        assert ref == f"{REGISTRY}/dispatch/{name}:{TAG}@{digest}"
        digests.add(digest)
    assert len(digests) == len(images.NAMES), "each image has its own digest"
    named = {p: bundle._images_named(documents(release.files[p])) for p in ("controller.yaml", "dispatcher.yaml")}
    assert named["controller.yaml"] == [release.references["controller"]]
    assert named["dispatcher.yaml"] == [release.references["dispatcher"], release.references["test-driver"]]
    (deployment,) = [d for d in documents(release.files["dispatcher.yaml"]) if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TCAB_DISPATCHER_DRIVER_IMAGE"] == release.references["test-driver"]


def test_no_manifest_names_latest_localhost_or_an_unpinned_image(made: tuple[bundle.Release, pathlib.Path]) -> None:
    release, _ = made
    pinned = re.compile(re.escape(REGISTRY) + r"/dispatch/[a-z-]+:" + re.escape(TAG) + r"@sha256:[0-9a-f]{64}")
    for name in bundle.PARTS:
        text = release.files[name].read_text()
        assert ":latest" not in text and "localhost/" not in text and ":unreleased" not in text, name
        for image in bundle._images_named(documents(release.files[name])):
            assert pinned.fullmatch(image), (name, image)


def test_every_object_carries_the_version_and_standard_labels(made: tuple[bundle.Release, pathlib.Path]) -> None:
    release, _ = made
    for name in bundle.PARTS:
        for doc in documents(release.files[name]):
            labels = doc["metadata"]["labels"]
            assert labels[bundle.VERSION_LABEL] == TAG, (name, doc["kind"])
            assert labels["app.kubernetes.io/part-of"] == "dispatch-k8s" and labels["app.kubernetes.io/name"]
    sidecar = documents(release.files["sidecar-rbac.yaml"])
    assert {d["kind"] for d in sidecar} == {"ServiceAccount", "Role", "RoleBinding"}
    assert not [d for d in sidecar if "namespace" in d["metadata"]], "applied with -n, per training namespace"


def test_the_images_carry_the_oci_labels(local_images: dict[str, str]) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for name, image in local_images.items():
        got = images.inspect_labels(image)
        oci = {k.removeprefix("org.opencontainers.image."): v for k, v in got.items()
               if k.startswith("org.opencontainers.image.")}
        assert oci["version"] == VERSION and oci["revision"] == head and oci["licenses"] == "Apache-2.0"
        assert oci["source"].startswith("https://") and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", oci["created"])
        assert oci["title"] == f"dispatch-k8s {name}"


def test_the_bundle_applies_server_side_and_again_unchanged(made: tuple[bundle.Release, pathlib.Path]) -> None:
    release, _ = made
    with harness.ControlPlane(scheduler=False) as plane:
        kubectl = [str(harness.binary(local.KUBECTL, plane.bin_dir)), "--kubeconfig", plane.kubeconfig]

        def apply(*args: str) -> str:
            done = subprocess.run([*kubectl, "apply", "--server-side", *args], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, (args, done.stderr)
            return done.stdout

        subprocess.run([*kubectl, "create", "namespace", "training"], check=True, capture_output=True)
        for _ in range(2):
            apply("-f", str(release.files["controller.yaml"]))
            apply("-f", str(release.files["dispatcher.yaml"]))
            apply("-n", "training", "-f", str(release.files["sidecar-rbac.yaml"]))
        got = subprocess.run([*kubectl, "get", "deployment", "dispatch-controller", "-n", "dispatch-system", "-o",
                              "jsonpath={.spec.template.spec.containers[0].image}"], capture_output=True, text=True)
        assert got.stdout == release.references["controller"], got.stderr


def test_the_standalone_kustomize_renders_each_part_as_kubectl_kustomize_does() -> None:
    """The release renders with kustomize built from its module (no Kubernetes build); a user who
    applies deployments/k8s/base with `kubectl apply -k` gets the same objects."""
    kubectl = harness.binary(local.KUBECTL, harness.build_binaries())
    for part in bundle.PARTS.values():
        by_kubectl = subprocess.run([str(kubectl), "kustomize", str(bundle.BASE / part)], capture_output=True,
                                    text=True, timeout=120, check=True)
        by_kustomize = subprocess.run([str(local.kustomize()), "build", str(bundle.BASE / part)], capture_output=True,
                                      text=True, timeout=120, check=True)
        assert by_kustomize.stdout == by_kubectl.stdout, part


def test_a_bad_registry_version_or_kustomize_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    for registry in ("Registry.Test", "http://r.test", "r.test/", ""):
        with pytest.raises(bundle.ReleaseError, match=r"^registry .*: must be a host\[:port\]\[/path\]"):
            bundle.build_release(registry=registry, out_dir=tmp_path, push=lambda *a: "", local_images={},
                                 kustomize=NO_KUSTOMIZE)
    with pytest.raises(version.VersionError, match=r"^version '1\.0 beta': must match"):
        bundle.build_release(registry=REGISTRY, version="1.0 beta", out_dir=tmp_path, push=lambda *a: "",
                             local_images={}, kustomize=NO_KUSTOMIZE)
    for args, first in ((["--registry", "Bad"], "release: registry 'Bad'"),
                        (["--registry", REGISTRY], "release: --kustomize is required"),
                        (["--registry", REGISTRY, "--kustomize", str(NO_KUSTOMIZE)],
                         f"release: --kustomize {NO_KUSTOMIZE}: not an executable file")):
        done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "release", *args],
                              capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith(first), done.stderr


def test_a_push_that_answers_no_digest_fails_the_release(local_images: dict[str, str], tmp_path: pathlib.Path) -> None:
    with pytest.raises(bundle.ReleaseError, match=r"^push of controller: answered 'sha256:xyz', not a digest"):
        bundle.build_release(registry=REGISTRY, version=VERSION, out_dir=tmp_path, push=lambda *a: "sha256:xyz",
                             local_images=local_images, kustomize=NO_KUSTOMIZE)
