"""The release's Helm chart, `dispatch-k8s-VERSION.tgz` (docs/install.md, "With Helm"): it installs
exactly what the release's manifests install, with values for what a team changes.

There is one copy of the manifests, deployments/k8s/base. The chart's templates are written here, at
release time, from the very objects the release writes into controller.yaml, dispatcher.yaml and
sidecar-rbac.yaml (kustomized, pinned, the prologue written in, labelled; release/bundle.py), and
from those of deployments/monitoring, and the one hook the manifests have no counterpart of, the
uninstall guard (release/chart_hooks.py). The chart's source, deployments/chart/dispatch-k8s, repeats
no manifest: Chart.yaml, values.yaml (the defaults the release fills in written `${name}`),
values.schema.json, README.md, and templates/_helpers.tpl and NOTES.txt.

An object becomes a template by putting a template expression in place of each value a team may
change: exact strings wherever they stand (an image's reference, a part's namespace), and fields
(the controller's replicas, resources and metrics scrapers, the backend Secret's name in a secretKeyRef). Each
expression writes its value as JSON (`toJson`), which YAML reads as written, so no template
depends on indentation; any `{{` already in an object (the PrometheusRule's own templates) is
escaped and renders as it stands. The defaults in values.yaml are the replaced values themselves,
so with no value set every template renders the object it was made from; tests/release/test_chart.py
holds that with the real helm, against the release's own files.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import pathlib
import re
import string
import tarfile
from collections.abc import Mapping
from typing import Any

import yaml

from release import chart_hooks

SOURCE = pathlib.Path(__file__).resolve().parents[1] / "deployments" / "chart" / "dispatch-k8s"
NAME = "dispatch-k8s"
# SemVer 2 (semver.org), which a chart's version must be; a derived version (0.1.0+g<hex>[.dirty]) is.
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(-((0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
                    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?")
# An image's name in the release (release.images.NAMES) -> its key under .Values.images.
IMAGE_KEYS = {"controller": "controller", "dispatcher": "dispatcher", "sidecar": "sidecar", "test-driver": "testDriver"}
# Helm's labels on every object's own metadata (never on a selector or a pod template).
HELM_LABELS = {"app.kubernetes.io/managed-by": "$.Release.Service", "helm.sh/chart": 'include "dispatch-k8s.chart" $'}
# The name of the controller's metrics port, which its NetworkPolicy's rule names (controller.metricsFrom).
METRICS_PORT = "metrics"
IDENTITY_KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
# The chart as an OCI artifact (what `helm push` writes, `helm pull oci://` and `helm install oci://` read):
# its repository beside the images', and the media types of Helm's OCI charts.
REPOSITORY = f"dispatch/charts/{NAME}"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
CONTENT_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
HEAD = "# Written by release/chart.py from {source}; the chart's source is deployments/chart/dispatch-k8s.\n"


class ChartError(RuntimeError):
    """The objects do not have the shape the chart's values are made for; the message says which."""


def filename(version: str) -> str:
    return f"{NAME}-{version}.tgz"


def split_reference(reference: str, registry: str) -> dict[str, str]:
    """REGISTRY/REPOSITORY:TAG@DIGEST as the image's values."""
    rest, _, digest = reference.removeprefix(f"{registry}/").partition("@")
    repository, _, tag = rest.rpartition(":")
    if not reference.startswith(f"{registry}/") or not (repository and tag and digest):
        raise ChartError(f"image {reference!r}: not {registry}/REPOSITORY:TAG@DIGEST")
    return {"repository": repository, "tag": tag, "digest": digest}


class _Expressions:
    """Values replaced by tokens that a dumped object carries as plain scalars, and what each becomes."""

    def __init__(self) -> None:
        self.by_token: dict[str, str] = {}

    def token(self, expression: str) -> str:
        token = f"__chart_value_{len(self.by_token)}__"
        self.by_token[token] = expression
        return token

    def render(self, doc: dict[str, Any]) -> str:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1 << 30)
        text = text.replace("{{", '{{ "{{" }}')
        for token, expression in self.by_token.items():
            text = text.replace(token, "{{ " + expression + " | toJson }}")
        return text


def _only(found: list[Any], what: str) -> Any:
    if len(found) != 1:
        raise ChartError(f"{what}: found {len(found)}, the chart's values are made for exactly one")
    return found[0]


def _namespace_of(objects: list[dict[str, Any]], part: str) -> str:
    return str(_only([d["metadata"]["name"] for d in objects if d["kind"] == "Namespace"], f"{part}: a Namespace"))


def _secret_names(node: Any) -> list[str]:
    if isinstance(node, list):
        return [n for v in node for n in _secret_names(v)]
    if not isinstance(node, dict):
        return []
    here = [node["secretKeyRef"]["name"]] if isinstance(node.get("secretKeyRef"), dict) else []
    return here + [n for v in node.values() for n in _secret_names(v)]


def _controller_deployment(objects: list[dict[str, Any]], image: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The controller's Deployment and its container of IMAGE (the replicas and resources the values set)."""
    found = [(d, c) for d in objects if d["kind"] == "Deployment"
             for c in d["spec"]["template"]["spec"]["containers"] if c.get("image") == image]
    deployment, container = _only(found, "controller: a Deployment's container of the controller image")
    return deployment, container


def _sidecar_binding(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The sidecar's RoleBinding (its subjects: the ServiceAccounts the values bind)."""
    binding: dict[str, Any] = _only([d for d in objects if d["kind"] == "RoleBinding"], "sidecar: a RoleBinding")
    if any(subject.get("kind") != "ServiceAccount" for subject in binding.get("subjects") or []):
        raise ChartError("sidecar: the RoleBinding's subjects must all be ServiceAccounts")
    return binding


def _metrics_rule(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The controller's NetworkPolicy's ingress rule for its metrics port (its `from`: what the values set)."""
    rules = [rule for d in objects if d["kind"] == "NetworkPolicy" for rule in d["spec"].get("ingress") or []
             if any(port.get("port") == METRICS_PORT for port in rule.get("ports") or [])]
    rule: dict[str, Any] = _only(rules, f"controller: a NetworkPolicy rule for the port {METRICS_PORT!r}")
    if not rule.get("from"):
        raise ChartError(f"controller: the NetworkPolicy rule for the port {METRICS_PORT!r} admits every source")
    return rule


def defaults(parts: Mapping[str, list[dict[str, Any]]], *, registry: str,
             references: Mapping[str, str]) -> dict[str, Any]:
    """The values the release fills in (values.yaml's `${name}`), read from the objects and images."""
    deployment, container = _controller_deployment(parts["controller"], references["controller"])
    found: dict[str, Any] = {
        "registry": registry,
        "namespace": _namespace_of(parts["controller"], "controller"),
        "controller_replicas": deployment["spec"]["replicas"],
        "controller_resources": container["resources"],
        "controller_metrics_from": _metrics_rule(parts["controller"])["from"],
        "dispatcher_namespace": _namespace_of(parts["dispatcher"], "dispatcher"),
        "dispatcher_backend_secret": _only(sorted(set(_secret_names(parts["dispatcher"]))),
                                           "dispatcher: a Secret named in a secretKeyRef"),
        "sidecar_service_accounts": [subject["name"] for subject in _sidecar_binding(parts["sidecar"])["subjects"]],
    }
    for name, reference in references.items():
        for field, value in split_reference(reference, registry).items():
            found[f"{name.replace('-', '_')}_{field}"] = value
    return found


def _replace(node: Any, *, strings: Mapping[str, str], secret: str, exprs: _Expressions) -> Any:
    """NODE with every string in STRINGS, and the Secret a secretKeyRef names when it is SECRET, replaced
    by a token of its expression."""
    if isinstance(node, dict):
        node = {k: _replace(v, strings=strings, secret=secret, exprs=exprs) for k, v in node.items()}
        ref = node.get("secretKeyRef")
        if isinstance(ref, dict) and ref.get("name") == secret:
            ref["name"] = exprs.token("$.Values.dispatcher.backendSecret")
        return node
    if isinstance(node, list):
        return [_replace(v, strings=strings, secret=secret, exprs=exprs) for v in node]
    if isinstance(node, str) and node in strings:
        return exprs.token(strings[node])
    return node


def _template(doc: dict[str, Any], *, controller: tuple[str, str], strings: Mapping[str, str], secret: str,
              namespace: str | None = None, sidecar: bool = False) -> str:
    """DOC as a template: the controller Deployment's replicas and resources (CONTROLLER: its name and
    image), the sidecar's RoleBinding's subjects (SIDECAR: DOC is of the sidecar's part), the backend
    SECRET and the STRINGS replaced; NAMESPACE the expression of its namespace."""
    exprs = _Expressions()
    doc = copy.deepcopy(doc)
    if sidecar and doc["kind"] == "RoleBinding":
        doc["subjects"] = exprs.token('include "dispatch-k8s.sidecar-subjects" $ | fromJsonArray')
    if doc["kind"] == "NetworkPolicy" and not sidecar:
        _metrics_rule([doc])["from"] = exprs.token("$.Values.controller.metricsFrom")
    if (doc["kind"], doc["metadata"]["name"]) == ("Deployment", controller[0]):
        doc["spec"]["replicas"] = exprs.token("$.Values.controller.replicas")
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c.get("image") == controller[1]:
                c["resources"] = exprs.token("$.Values.controller.resources")
    doc = _replace(doc, strings=strings, secret=secret, exprs=exprs)
    meta = doc.setdefault("metadata", {})
    if namespace is not None:
        meta["namespace"] = exprs.token(namespace)
    labels = meta.setdefault("labels", {})
    for label, expression in HELM_LABELS.items():
        labels[label] = exprs.token(expression)
    return "---\n" + exprs.render(doc)


def _identity(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(kind, name) of the identity policy's objects: the policies, their bindings, the parameters these name."""
    found = {(d["kind"], d["metadata"]["name"]) for d in objects if d["kind"] in IDENTITY_KINDS}
    found |= {(d["spec"]["paramRef"].get("kind", "ConfigMap"), d["spec"]["paramRef"]["name"])
              for d in objects if d["kind"] == "MutatingAdmissionPolicyBinding" and d["spec"].get("paramRef")}
    return found


def templates(parts: Mapping[str, list[dict[str, Any]]], *, registry: str,
              references: Mapping[str, str]) -> dict[str, str]:
    """templates/FILE -> its text, made from PARTS (controller, dispatcher, sidecar, monitoring)."""
    values = defaults(parts, registry=registry, references=references)
    deployment, _ = _controller_deployment(parts["controller"], references["controller"])
    controller = (deployment["metadata"]["name"], references["controller"])
    strings = {ref: f'include "dispatch-k8s.image" (list $ {json.dumps(IMAGE_KEYS[name])})'
               for name, ref in references.items()}
    strings[values["namespace"]] = "$.Values.namespace"
    strings[values["dispatcher_namespace"]] = "$.Values.dispatcher.namespace"
    identity = _identity(parts["controller"])

    def docs(objects: list[dict[str, Any]], **kw: Any) -> str:
        return "".join(_template(d, controller=controller, strings=strings, secret=values["dispatcher_backend_secret"],
                                 **kw) for d in objects)

    core = [d for d in parts["controller"] if (d["kind"], d["metadata"]["name"]) not in identity]
    policy = [d for d in parts["controller"] if (d["kind"], d["metadata"]["name"]) in identity]
    if len(policy) != len(identity) or not policy:
        raise ChartError(f"controller: the identity policy's objects {sorted(identity)}: not all found")
    # Namespaced and without a namespace, the PrometheusRule goes where the rules are read from.
    unplaced = [d["kind"] for d in parts["monitoring"]
                if "namespace" not in d["metadata"] and d["kind"] not in ("ClusterRoleBinding", "PrometheusRule")]
    if unplaced:
        raise ChartError(f"monitoring: {unplaced} without a namespace (only the PrometheusRule takes ruleNamespace)")
    monitoring = "".join(docs([d], namespace="$.Values.monitoring.ruleNamespace" if d["kind"] == "PrometheusRule"
                              else None) for d in parts["monitoring"])
    guard = chart_hooks.uninstall_guard(*_controller_deployment(parts["controller"], references["controller"]))
    return {
        "controller.yaml": HEAD.format(source="the release's controller.yaml") + docs(core),
        "uninstall-guard.yaml": (HEAD.format(source="release/chart_hooks.py, beside the release's controller.yaml")
                                 + docs(guard)),
        "identity-policy.yaml": (HEAD.format(source="the identity policy's objects of the release's controller.yaml")
                                 + "{{- if $.Values.identityPolicy.enabled }}\n" + docs(policy) + "{{- end }}\n"),
        "dispatcher.yaml": (HEAD.format(source="the release's dispatcher.yaml")
                            + "{{- if $.Values.dispatcher.enabled }}\n" + docs(parts["dispatcher"]) + "{{- end }}\n"),
        "sidecar-rbac.yaml": (HEAD.format(source="the release's sidecar-rbac.yaml, once per training namespace")
                              + "{{- range $namespace := $.Values.sidecar.namespaces }}\n"
                              + docs(parts["sidecar"], namespace="$namespace", sidecar=True) + "{{- end }}\n"),
        "monitoring.yaml": (HEAD.format(source="deployments/monitoring")
                            + "{{- if $.Values.monitoring.enabled }}\n" + monitoring + "{{- end }}\n"),
    }


def values_yaml(found: Mapping[str, Any]) -> str:
    """The source's values.yaml with each `${name}` the value FOUND gives it, written as JSON."""
    source = string.Template((SOURCE / "values.yaml").read_text())
    wanted = set(source.get_identifiers())
    if wanted != set(found):
        raise ChartError(f"values.yaml: placeholders {sorted(wanted)} but values for {sorted(found)}")
    return source.substitute({k: json.dumps(v) for k, v in found.items()})


def chart_yaml(version: str) -> str:
    """The source's Chart.yaml with version and appVersion the release's."""
    text = (SOURCE / "Chart.yaml").read_text()
    for key in ("version", "appVersion"):
        text, n = re.subn(rf"^{key}: .*$", f"{key}: {json.dumps(version)}", text, flags=re.MULTILINE)
        if n != 1:
            raise ChartError(f"Chart.yaml: {n} lines `{key}:`, expected one")
    return text


def files(parts: Mapping[str, list[dict[str, Any]]], *, version: str, registry: str,
          references: Mapping[str, str]) -> dict[str, str]:
    """The chart's files (path inside the chart -> text): the source's, and the templates made here."""
    if not SEMVER.fullmatch(version):
        raise ChartError(f"version {version!r}: a chart's version is SemVer 2 ({SEMVER.pattern})")
    out = {str(p.relative_to(SOURCE)): p.read_text() for p in sorted(SOURCE.rglob("*")) if p.is_file()}
    out["Chart.yaml"] = chart_yaml(version)
    out["values.yaml"] = values_yaml(defaults(parts, registry=registry, references=references))
    for name, text in templates(parts, registry=registry, references=references).items():
        if f"templates/{name}" in out:
            raise ChartError(f"deployments/chart/dispatch-k8s/templates/{name}: the release writes that template")
        out[f"templates/{name}"] = text
    return out


def archive(chart_files: Mapping[str, str], *, mtime: int) -> bytes:
    """The chart as `helm package` lays it out (NAME/ at the top), the same bytes for the same files and MTIME."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for path, text in sorted(chart_files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{NAME}/{path}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def oci_tag(version: str) -> str:
    """The tag Helm reads VERSION's chart under in an OCI repository (a SemVer `+` is not a tag's character)."""
    return version.replace("+", "_")


def add_to_layout(layout: pathlib.Path, tgz: bytes, chart_files: Mapping[str, str]) -> str:
    """The chart TGZ (made of CHART_FILES) added to the OCI image layout at LAYOUT as Helm's OCI artifact,
    named REPOSITORY:oci_tag(version): its config the Chart.yaml's metadata as JSON, its one layer
    the archive. Answers its source for a push from the layout (`oci:LAYOUT:REPOSITORY:TAG`)."""
    metadata = yaml.safe_load(chart_files["Chart.yaml"])
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    config = blob(json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode(), CONFIG_MEDIA_TYPE)
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "config": config,
                "layers": [blob(tgz, CONTENT_MEDIA_TYPE)],
                "annotations": {"org.opencontainers.image.title": NAME,
                                "org.opencontainers.image.version": str(metadata["version"])}}
    ref_name = f"{REPOSITORY}:{oci_tag(str(metadata['version']))}"
    entry = {**blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode(), MANIFEST_MEDIA_TYPE),
             "annotations": {"org.opencontainers.image.ref.name": ref_name}}
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"schemaVersion": 2, "manifests": []}
    index["manifests"] = [m for m in index["manifests"]
                          if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") != ref_name]
    index["manifests"].append(entry)
    index_path.write_text(json.dumps(index, separators=(",", ":")))
    if not (layout / "oci-layout").exists():
        (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return f"oci:{layout}:{ref_name}"
