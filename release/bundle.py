"""The release bundle: one install manifest per part, every image pinned by digest.

    build_release(registry=R, version=V, out_dir=D, push=P, kustomize=K)

builds the images (release.images: each an OCI image index of its amd64 and arm64 images), hands
each to PUSH, which pushes it wherever it must go and answers the digest it was pushed under (an
index's own), and writes into OUT_DIR:

    controller.yaml    the controller: its Namespace, RBAC, Deployment, PDB, PriorityClass,
                       the AdmissionCheck, the metrics Service, the admission policy
                       `dispatch-identity` with the prologue written into its parameter
    dispatcher.yaml    the dispatcher (optional), in its own Namespace
    sidecar-rbac.yaml  the sidecar's ServiceAccount, Role and RoleBinding, namespace-less:
                       `kubectl apply --server-side -n NS -f sidecar-rbac.yaml` per training namespace
    dispatch-k8s-VERSION.tgz
                       the Helm chart that installs what the three files above install, with values
                       for what a team changes; its templates are made from these same objects
                       (release/chart.py)
    release.json       version, tag, revision, created, registry, each image's reference and,
                       with the archive, the chart's (`chart`)
    dispatch-k8s-images-VERSION.tar
                       (with IMAGES_ARCHIVE, as `make release` asks) every image index, its images
                       and their layers, as one OCI image layout, each index named
                       `dispatch/NAME:TAG`, and the chart as Helm's OCI artifact named
                       `dispatch/charts/dispatch-k8s:CHART_TAG` (the version, `+` written `_` as
                       Helm reads it): what `toolkit mirror` copies into another registry,
                       digests kept (toolkit/mirror.py). PUSH is then handed each image and the
                       chart as `oci:LAYOUT:REF` and must copy it as it is
                       (`images.skopeo_push`), so the digest pinned is the one archived, and
                       `helm install oci://REGISTRY/dispatch/charts/dispatch-k8s --version VERSION`
                       installs the chart from the registry.
    SHA256SUMS         the sha256 of each file above (`sha256sum -c` in OUT_DIR)

Each manifest is `K build` of its part under deployments/k8s/base (K the kustomize the caller
names, built from its module: devcluster/build-controllers.sh tools), with every string that is exactly a source reference
(`dispatch/NAME:unreleased`, in an image field or an env value alike) replaced by
REGISTRY/dispatch/NAME:TAG@sha256:DIGEST, and `app.kubernetes.io/version: TAG` on every object.
The references are always written with REGISTRY, whatever PUSH pushed to (a local cluster pushes
to its own endpoint for the name its nodes resolve to REGISTRY). A source reference left over, or
a reference to an image the release does not build, fails the release.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import pathlib
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from release import chart, images
from release import version as versioning
from toolkit import mirror, prologue

REPO = pathlib.Path(__file__).resolve().parents[1]
BASE = REPO / "deployments" / "k8s" / "base"
# The Prometheus operator's objects, optional: not a manifest of the release, a part of its chart.
MONITORING = REPO / "deployments" / "monitoring"
# Output file -> the kustomize part it renders.
PARTS = {"controller.yaml": "controller", "dispatcher.yaml": "dispatcher", "sidecar-rbac.yaml": "sidecar"}
SOURCE_TAG = "unreleased"
REGISTRY = mirror.REGISTRY  # host[:port][/path], lower case
DIGEST = mirror.DIGEST
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
VERSION_LABEL = "app.kubernetes.io/version"

# push(local_image, name, tag) -> "sha256:<hex>": push LOCAL_IMAGE as the repository NAME
# (dispatch/controller ...) at TAG, wherever the caller's registry is; answer the manifest digest.
Push = Callable[[str, str, str], str]


class ReleaseError(RuntimeError):
    """A release that cannot be made as asked; the message says which input and why."""


@dataclasses.dataclass(frozen=True)
class Release:
    build: versioning.Build
    registry: str
    references: dict[str, str]   # image name (controller ...) -> REGISTRY/dispatch/NAME:TAG@sha256:...
    files: dict[str, pathlib.Path]  # output file name -> its path


def source_reference(name: str) -> str:
    """How the kustomize sources name image NAME (dispatch/NAME:unreleased)."""
    return f"{images.repository(name)}:{SOURCE_TAG}"


def pinned(registry: str, name: str, tag: str, digest: str) -> str:
    if not DIGEST.fullmatch(digest):
        raise ReleaseError(f"push of {name}: answered {digest!r}, not a digest sha256:<64 hex>")
    return f"{registry}/{images.repository(name)}:{tag}@{digest}"


def check_registry(registry: str) -> str:
    if not REGISTRY.fullmatch(registry):
        raise ReleaseError(f"registry {registry!r}: must be a host[:port][/path] in lower case ({REGISTRY.pattern})")
    return registry


def kustomize_build(part: str, *, kustomize: pathlib.Path) -> list[dict[str, Any]]:
    """The objects `kustomize build` (KUSTOMIZE) renders from deployments/k8s/base/PART."""
    done = subprocess.run([str(kustomize), "build", str(BASE / part)], capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"kustomize build {part}: {done.stderr.strip()}")
    return [_cluster_scoped(d) for d in yaml.safe_load_all(done.stdout) if d]


# Cluster-scoped kinds kustomize's namespace transformer does not know, so it gives them the part's
# namespace (the apiserver ignores it; a reader should not see one).
CLUSTER_SCOPED = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")


def _cluster_scoped(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("kind") in CLUSTER_SCOPED:
        doc.get("metadata", {}).pop("namespace", None)
    return doc


def _substitute(node: Any, references: Mapping[str, str]) -> Any:
    """NODE with every string equal to a source reference replaced by its pinned reference."""
    if isinstance(node, dict):
        return {k: _substitute(v, references) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, references) for v in node]
    if isinstance(node, str):
        return references.get(node, node)
    return node


def _images_named(node: Any) -> list[str]:
    """Every container image field and every *_IMAGE env value in NODE."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("image"), str):
            found.append(node["image"])
        if isinstance(node.get("name"), str) and node["name"].endswith("_IMAGE") and isinstance(node.get("value"), str):
            found.append(node["value"])
        for v in node.values():
            found += _images_named(v)
    elif isinstance(node, list):
        for v in node:
            found += _images_named(v)
    return found


# The admission policy's parameter (deployments/k8s/base/controller/identity-policy.yaml): the
# prologue it wraps a TrainJob's command in, byte for byte the one `toolkit wrap` prints.
IDENTITY_PARAMETER = ("ConfigMap", "dispatch-identity")


def with_prologue(doc: dict[str, Any]) -> dict[str, Any]:
    if (doc.get("kind"), (doc.get("metadata") or {}).get("name")) == IDENTITY_PARAMETER:
        doc = {**doc, "data": {**(doc.get("data") or {}), "prologue": prologue.text()}}
    return doc


def objects(part: str, *, build: versioning.Build, references: Mapping[str, str],
            kustomize: pathlib.Path) -> list[dict[str, Any]]:
    """PART's objects: kustomized, pinned, the prologue written in, labelled with the version."""
    sources = {source_reference(name): ref for name, ref in references.items()}
    docs = [with_prologue(_substitute(d, sources)) for d in kustomize_build(part, kustomize=kustomize)]
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("labels", {})[VERSION_LABEL] = build.tag
        for image in _images_named(doc):
            if image not in references.values():
                raise ReleaseError(f"{part}: {doc['kind']} {doc['metadata'].get('name')} names image {image!r}, "
                                   "which the release does not build (the sources name dispatch/NAME:unreleased)")
    return docs


def monitoring_objects(build: versioning.Build) -> list[dict[str, Any]]:
    """The objects of deployments/monitoring, labelled with the version as the manifests' are."""
    docs = [d for f in sorted(MONITORING.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("labels", {})[VERSION_LABEL] = build.tag
    return docs


def render(part: str, docs: list[dict[str, Any]], *, build: versioning.Build) -> str:
    """PART's install manifest: its objects (`objects`) as YAML documents under a head naming the build."""
    head = (f"# dispatch-k8s {build.version} ({build.revision}): {part}.\n"
            f"# kubectl apply --server-side -f <this file>" + (" -n NAMESPACE (each training namespace)\n"
                                                              if part == "sidecar" else "\n"))
    return head + yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)


def build_release(*, registry: str, out_dir: pathlib.Path, push: Push, kustomize: pathlib.Path,
                  version: str | None = None, local_images: Mapping[str, str] | None = None,
                  workdir: pathlib.Path | None = None, images_archive: bool = False) -> Release:
    """Build, push and render the release of this checkout's HEAD into OUT_DIR (see the module docstring).

    VERSION names it instead of the derived version. LOCAL_IMAGES (name -> a local image) skips
    the builds with images already built for this release. KUSTOMIZE renders the manifests; the
    caller names it (`make release` and the local cluster: the one built from its module,
    devcluster.local.kustomize)."""
    check_registry(registry)
    build = versioning.describe(REPO, version=version)
    if not LABEL_VALUE.fullmatch(build.tag) or len(build.tag) > 63:
        raise ReleaseError(f"tag {build.tag!r}: a release's tag is also a label value, at most 63 characters")
    if not chart.SEMVER.fullmatch(build.version):
        raise ReleaseError(f"version {build.version!r}: the chart's version, which must be SemVer 2")
    out_dir.mkdir(parents=True, exist_ok=True)
    if local_images is None:
        local_images = images.build_all(build, workdir=workdir or out_dir / ".build")
    missing = set(images.NAMES) - set(local_images)
    if missing:
        raise ReleaseError(f"local_images: no image for {', '.join(sorted(missing))}")
    extra = {}
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".layout-") as tmp:
        # With the archive, every push is from the layout, byte for byte: the digest pinned is the
        # digest archived, and `toolkit mirror` copies the same bytes on.
        layout = pathlib.Path(tmp)
        sources = save_layout(layout, local_images=local_images, tag=build.tag) if images_archive else local_images
        references = {name: pinned(registry, name, build.tag, push(sources[name], images.repository(name), build.tag))
                      for name in images.NAMES}
        parts = render_parts(build=build, references=references, kustomize=kustomize)
        chart_reference = None
        if images_archive:
            # The chart goes into the archive and the registry too, as Helm's OCI artifact.
            made = chart_files(parts, build=build, registry=registry, references=references)
            source = chart.add_to_layout(layout, chart.archive(made, mtime=_created(build)), made)
            chart_tag = chart.oci_tag(build.version)
            chart_reference = f"{registry}/{chart.REPOSITORY}:{chart_tag}@{push(source, chart.REPOSITORY, chart_tag)}"
            name = mirror.archive_name(build.version)
            extra[name] = tar_layout(layout, out_dir / name, mtime=_created(build))
    files = write(out_dir, build=build, registry=registry, references=references, kustomize=kustomize, extra=extra,
                  parts=parts, chart_reference=chart_reference)
    return Release(build=build, registry=registry, references=references, files=files)


def _created(build: versioning.Build) -> int:
    """The commit's time, as every file of the release is stamped with it."""
    return int(datetime.datetime.strptime(build.created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp())


def save_layout(layout: pathlib.Path, *, local_images: Mapping[str, str], tag: str) -> dict[str, str]:
    """LOCAL_IMAGES written into one OCI image layout at LAYOUT, each named dispatch/NAME:TAG;
    answers name -> its source for a push from the layout (`oci:LAYOUT:dispatch/NAME:TAG`)."""
    save = images.podman_push(f"oci:{layout}:{{name}}:{{tag}}")
    for name, local in sorted(local_images.items()):
        save(local, images.repository(name), tag)
    return {name: f"oci:{layout}:{images.repository(name)}:{tag}" for name in local_images}


def tar_layout(layout: pathlib.Path, path: pathlib.Path, *, mtime: int) -> pathlib.Path:
    """The layout at LAYOUT as the tar PATH: sorted, owned by root, every time MTIME."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in sorted(layout.rglob("*")):
            info = tar.gettarinfo(member, arcname=str(member.relative_to(layout)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = mtime
            info.mode = 0o755 if member.is_dir() else 0o644
            if member.is_file():
                with member.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return path


def render_parts(*, build: versioning.Build, references: Mapping[str, str],
                 kustomize: pathlib.Path) -> dict[str, list[dict[str, Any]]]:
    """Each part's objects (controller, dispatcher, sidecar) for images pushed as REFERENCES."""
    return {part: objects(part, build=build, references=references, kustomize=kustomize) for part in PARTS.values()}


def chart_files(parts: Mapping[str, list[dict[str, Any]]], *, build: versioning.Build, registry: str,
                references: Mapping[str, str]) -> dict[str, str]:
    """The chart's files, made from PARTS and deployments/monitoring."""
    try:
        return chart.files({**parts, "monitoring": monitoring_objects(build)}, version=build.version,
                           registry=registry, references=references)
    except chart.ChartError as exc:
        raise ReleaseError(f"the chart: {exc}") from exc


def write(out_dir: pathlib.Path, *, build: versioning.Build, registry: str, references: Mapping[str, str],
          kustomize: pathlib.Path, extra: Mapping[str, pathlib.Path] | None = None,
          parts: Mapping[str, list[dict[str, Any]]] | None = None,
          chart_reference: str | None = None) -> dict[str, pathlib.Path]:
    """The bundle's files for images pushed as REFERENCES (what `build_release` writes once they are):
    the manifests (PARTS, when already rendered), the chart, release.json (with CHART_REFERENCE, the
    chart's pinned reference in the registry, when it was pushed) and SHA256SUMS, which lists EXTRA's
    files too (already written into OUT_DIR). Output file name -> its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, pathlib.Path] = dict(extra or {})
    if parts is None:
        parts = render_parts(build=build, references=references, kustomize=kustomize)
    for filename, part in PARTS.items():
        files[filename] = out_dir / filename
        files[filename].write_text(render(part, parts[part], build=build))
    made = chart_files(parts, build=build, registry=registry, references=references)
    stamp = _created(build)
    files[chart.filename(build.version)] = out_dir / chart.filename(build.version)
    files[chart.filename(build.version)].write_bytes(chart.archive(made, mtime=stamp))
    meta: dict[str, Any] = {"version": build.version, "tag": build.tag, "revision": build.revision,
                            "created": build.created, "registry": registry, "images": references}
    if chart_reference is not None:
        meta["chart"] = chart_reference
    files["release.json"] = out_dir / "release.json"
    files["release.json"].write_text(json.dumps(meta, indent=2) + "\n")
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {n}\n" for n, p in sorted(files.items()))
    files["SHA256SUMS"] = out_dir / "SHA256SUMS"
    files["SHA256SUMS"].write_text(sums)
    return files
