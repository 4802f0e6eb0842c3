"""Rendering (docs/toolkit.md, docs/sidecar.md): the TrainJob for a StartRequest, and
the runtime helper that makes a user's (Cluster)TrainingRuntime fit the runtime requirements
(`runtime_check`).

`trainjob(request)` is complete and final: spec.trainer is immutable after
creation, so everything run-time-dependent reaches the container through
the Downward API (A from the pod annotation our runtime patch sets, J from
JobSet's restart label) and the prologue. It is created suspended with A =
"0" in our runtime-patch entry; the adapter or the admission controller
raises A before anything runs (`raising`).

`runtime(doc)` adds what the adapter needs and a runtime patch cannot:
- `restartPolicy: Never` on the node pod template and `backoffLimit: 0` on
  the node Job (JobSet's defaults would restart in place);
- the sidecar verifier as a native sidecar (an initContainer with
  `restartPolicy: Always`; Trainer's patch can only amend containers that
  exist, so the sidecar must be in the runtime) and its Downward API volume;
- the pods keep their own ServiceAccount (the runtime's, else the
  namespace's `default`): it may be the one a cloud binding names (IRSA,
  Pod Identity, GKE Workload Identity). The sidecar's Role is bound to it
  (sidecar-rbac.yaml binds `default` and `dispatch-sidecar`); an explicit
  `service_account` names the account instead;
- the ServiceAccount token for the sidecar only: `automountServiceAccountToken:
  false` on the pod, and a projected volume (a bound, expiring token, the
  cluster's CA and the namespace, as the kubelet's own automount holds them)
  mounted read-only into the sidecar alone. The trainer's code cannot read
  the sidecar's token; training code that needs cloud credentials mounts a
  projected token of its own in the runtime (with its own audience), which
  render leaves as it is.
It is idempotent (rendering its output again changes nothing) and leaves
every other field, including failure policies the user chose, as it was:
deciding to allow rank restarts is the user's, and `runtime_check` reports
them.

Sidecar contract (the sidecar reads these; `sidecar_container` is the one
place that writes them): the Downward API volume `names.PODINFO_VOLUME` is
mounted read-only at `names.PODINFO_DIR` (/etc/dispatch/podinfo) with the
files `annotations`, `labels` (the kubelet's key="value" lines), `name` and
`namespace`; the env holds POD_NAME and POD_NAMESPACE as well.

Pure: dicts in, new dicts out; inputs are never modified.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from toolkit import formats, names, raising, releaseinfo, runtime_check, wrap
from toolkit import request as request_mod

Obj = dict[str, Any]


class RenderError(ValueError):
    """The input cannot be rendered; the message names the field."""


def trainjob(req: request_mod.StartRequest) -> Obj:
    """The complete TrainJob for a StartRequest (suspended, A = 0)."""
    trainer: Obj = {
        "command": wrap.command(),
        "args": list(req.command),
        "env": wrap.env(
            job=[(v.name, v.value) for v in req.env],
            epoch_prefix=req.epoch_prefix,
            token_prefix=req.token_prefix,
            workdir=req.workdir,
        ),
    }
    if req.num_nodes is not None:
        trainer["numNodes"] = req.num_nodes
    if req.resources_per_node is not None:
        trainer["resourcesPerNode"] = {part: dict(amounts) for part, amounts in req.resources_per_node.items()}
    metadata: Obj = {
        "name": req.name,
        "namespace": req.namespace,
        "annotations": {
            names.JOB_ID_ANNOTATION: req.job_id,
            names.GENERATION_ANNOTATION: str(req.generation),
            names.SUBMISSION_ANNOTATION: str(req.submission),
            names.ATTEMPT_ANNOTATION: str(req.attempt),
        },
    }
    if req.mode == "kueue":
        assert req.queue_name, "the request validates queueName in kueue mode"
        metadata["labels"] = {names.KUEUE_QUEUE_LABEL: req.queue_name}
    return {
        "apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {
            "runtimeRef": {
                "apiGroup": names.TRAINER_GROUP,
                "kind": req.runtime_ref.kind,
                "name": req.runtime_ref.name,
            },
            "suspend": True,
            "trainer": trainer,
            "runtimePatches": [raising.patch_entry(0)],
        },
    }


# The sidecar image's group (USER 65532:65532 in images/sidecar.Containerfile).
SIDECAR_GID = 65532


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def sidecar_container(*, image: str | None = None, env: Sequence[Obj] = ()) -> Obj:
    """The sidecar verifier as a native sidecar container (see the module docstring). IMAGE
    defaults to the sidecar of the release this installation records (toolkit.releaseinfo)."""
    image = image or releaseinfo.sidecar_image()
    if not image:
        raise RenderError("sidecar image: none given, and this installation records no release (`make release` "
                          "records one): pass --sidecar-image REGISTRY/dispatch/sidecar:TAG@sha256:DIGEST")
    return {
        "name": names.SIDECAR_CONTAINER,
        "image": image,
        "restartPolicy": "Always",
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            {"name": names.SIDECAR_STARTED_ENV, "value": names.SIDECAR_STARTED_FILE},
            *[dict(e) for e in env],
        ],
        "volumeMounts": [{"name": names.PODINFO_VOLUME, "mountPath": names.PODINFO_DIR, "readOnly": True},
                         {"name": names.SIDECAR_STATE_VOLUME, "mountPath": names.SIDECAR_STATE_DIR},
                         {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": names.SERVICE_ACCOUNT_DIR,
                          "readOnly": True}],
        # The kubelet starts the trainer once this succeeds: after the sidecar's first check has run
        # (whatever its verdict). A sidecar that never checks keeps the trainer from starting.
        "startupProbe": {"exec": {"command": ["python3", "-S", "-m", "sidecar", "--started"]},
                         "periodSeconds": 1, "timeoutSeconds": 5, "failureThreshold": 120},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        # Least privilege: the sidecar image runs as a numeric non-root user (images/sidecar.Containerfile),
        # so the kubelet can check runAsNonRoot before it starts it. The group is stated: the kubelet
        # passes the image's uid on to the runtime but not its gid, and the process would run in group 0.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsGroup": SIDECAR_GID,
            "seccompProfile": {"type": "RuntimeDefault"},
            "capabilities": {"drop": ["ALL"]},
        },
    }


def sidecar_token_volume() -> Obj:
    """The sidecar's credentials, as the kubelet's automount would give them (token, ca.crt,
    namespace), for the sidecar alone: an hour's token the kubelet rotates."""
    return {
        "name": names.SIDECAR_TOKEN_VOLUME,
        "projected": {"defaultMode": 0o444, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]},
    }


def sidecar_state_volume() -> Obj:
    """The sidecar's one writable place (its first-check mark): memory-backed, tiny."""
    return {"name": names.SIDECAR_STATE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}


def podinfo_volume() -> Obj:
    """The Downward API volume the sidecar reads (files named as in the docstring)."""
    items = [
        ("annotations", "metadata.annotations"),
        ("labels", "metadata.labels"),
        ("name", "metadata.name"),
        ("namespace", "metadata.namespace"),
    ]
    return {
        "name": names.PODINFO_VOLUME,
        "downwardAPI": {
            "items": [{"path": path, "fieldRef": {"apiVersion": "v1", "fieldPath": field}} for path, field in items]
        },
    }


def _upsert(items: list[Any], entry: Obj) -> None:
    """Replace the entry of the same name, or append: so a second render equals the first."""
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and item.get("name") == entry["name"]:
            items[i] = entry
            return
    items.append(entry)


def _dict_at(parent: Obj, key: str, path: str) -> Obj:
    value = parent.setdefault(key, {})
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise RenderError(f"{path}: must be a mapping, found {type(value).__name__}")
    return value


def _list_at(parent: Obj, key: str, path: str) -> list[Any]:
    value = parent.setdefault(key, [])
    if value is None:
        value = parent[key] = []
    if not isinstance(value, list):
        raise RenderError(f"{path}: must be a list, found {type(value).__name__}")
    return value


def runtime(
    doc: Mapping[str, Any],
    *,
    sidecar_image: str | None = None,
    service_account: str | None = None,
) -> Obj:
    """A copy of the runtime with the runtime requirements' fields and the sidecar added. The pods
    keep the ServiceAccount they have; SERVICE_ACCOUNT, when given, is set (and must not contradict
    one the runtime names)."""
    if not isinstance(doc, Mapping):
        raise RenderError(f"(document): must be a mapping, found {type(doc).__name__}")
    kind = doc.get("kind")
    if kind not in runtime_check.KINDS:
        raise RenderError(f"kind: must be ClusterTrainingRuntime or TrainingRuntime, found {kind!r}")
    out = copy.deepcopy(dict(doc))
    rjob = runtime_check.node_job(out)
    if rjob is None:
        raise RenderError(f"{runtime_check.NODE}: the trainer's replicated job must exist, found absent")
    steps = runtime_check.trainer_step(out)
    if steps:
        raise RenderError("; ".join(str(r) for r in steps))
    template = _dict_at(rjob, "template", f"{runtime_check.NODE}.template")
    job_spec = _dict_at(template, "spec", runtime_check.NODE_JOB_SPEC)
    pod_template = _dict_at(job_spec, "template", f"{runtime_check.NODE_JOB_SPEC}.template")
    pod_spec = _dict_at(pod_template, "spec", runtime_check.NODE_POD_SPEC)

    job_spec["backoffLimit"] = 0
    pod_spec["restartPolicy"] = "Never"
    account = pod_spec.get("serviceAccountName")
    if service_account is not None:
        if not formats.dns_subdomain(service_account):
            raise RenderError(f"service account: {service_account!r} is not a DNS-1123 subdomain (lowercase "
                              f"letters, digits, '-' and '.', at most {formats.SUBDOMAIN_MAX})")
        if account not in (None, "", service_account):
            raise RenderError(
                f"{runtime_check.NODE_POD_SPEC}.serviceAccountName: is {account!r}, but the service account "
                f"asked for is {service_account!r}; leave it out to keep {account!r}"
            )
        pod_spec["serviceAccountName"] = service_account
    pod_spec["automountServiceAccountToken"] = False  # the sidecar's token is mounted into it alone
    _upsert(_list_at(pod_spec, "initContainers", f"{runtime_check.NODE_POD_SPEC}.initContainers"),
            sidecar_container(image=sidecar_image))
    _upsert(_list_at(pod_spec, "volumes", f"{runtime_check.NODE_POD_SPEC}.volumes"), podinfo_volume())
    _upsert(_list_at(pod_spec, "volumes", f"{runtime_check.NODE_POD_SPEC}.volumes"), sidecar_state_volume())
    _upsert(_list_at(pod_spec, "volumes", f"{runtime_check.NODE_POD_SPEC}.volumes"), sidecar_token_volume())
    return out
