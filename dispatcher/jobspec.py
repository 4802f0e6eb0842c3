"""The driver Job and its token Secret for one claimed run (pure: dicts in, dicts out).

Invariants:
- The Job's name is a function of the run id alone, so a second create for
  the same run (a retry after a crash, a claim offered again) is an
  AlreadyExists, never a second Job.
- The environment is exactly the seed's: backend URL, job id, per-job token,
  the serialized launch request, TCAB_DRIVER_RUNTIME=kubernetes, the
  TCAB_K8S_* and TCAB_CONTAINER_* passthroughs, and the pod's own IP from the
  Downward API. The token is never a literal in the Job: it comes through a
  secretKeyRef to a Secret the Job owns (garbage-collected with it), so read
  access to Jobs does not reveal it.
- The Job is created first (the Secret's ownerReference needs its uid), then
  the Secret. A Job left without its Secret by a dispatcher that died between
  the two gets a `tombstone` instead: a Secret without the token key, so no
  kubelet can ever start its container, after which deleting the Job cannot
  kill a driver that ran (see `app`).
- Least privilege: the driver container never gains privileges
  (allowPrivilegeEscalation false, every capability dropped, the runtime's
  default seccomp profile) and runs as non-root unless the settings say its
  image must run as root; the pod runs under the configured ServiceAccount.
- Requests from the settings, no limits (a memory limit would bring back the
  very SIGKILL the requests are there to avoid); backoffLimit 0 (a driver is
  never silently run twice); restartPolicy Never; ttlSecondsAfterFinished.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from dispatcher import backend, names, settings
from toolkit import formats

Obj = dict[str, Any]

NAME_PREFIX = "tcab-run-"
# A Job name becomes its pods' label value, so it must stay <= 63 (a DNS label's bound too).
_MAX_NAME = formats.LABEL_MAX


def _digest(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:12]


def job_name(job_id: str) -> str:
    """`tcab-run-<id>` when the id is already a clean DNS label, else a readable slug plus a digest."""
    if formats.dns_label(job_id) and formats.dns_label(NAME_PREFIX + job_id):
        return NAME_PREFIX + job_id
    slug = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-")
    room = _MAX_NAME - len(NAME_PREFIX) - 1 - 12
    slug = slug[:room].strip("-")
    return f"{NAME_PREFIX}{slug}-{_digest(job_id)}" if slug else f"{NAME_PREFIX}{_digest(job_id)}"


def job_id_label(job_id: str) -> str:
    """The job-id label value: the id itself when it is a valid label value, else its digest.

    The driver labels its sandbox pods with the same function of the id (the
    exact id is also in the `test-cabinet/job-id` annotation).
    """
    return job_id if job_id and formats.label_value(job_id) else "sha256-" + _digest(job_id)


def secret_name(job_id: str) -> str:
    return job_name(job_id)


def labels(job_id: str) -> dict[str, str]:
    return {names.JOB_ID_LABEL: job_id_label(job_id), names.MANAGED_BY_LABEL: names.DISPATCHER_MANAGED_BY}


def selector() -> str:
    """The label selector of every Job this dispatcher manages."""
    return f"{names.MANAGED_BY_LABEL}={names.DISPATCHER_MANAGED_BY}"


def driver_env(claim: backend.Claim, config: settings.Settings) -> list[Obj]:
    passthrough = dict(config.passthrough)
    # The reaper and the driver must agree on the sandbox namespace.
    passthrough[names.ENV_SANDBOX_NAMESPACE] = config.sandbox_namespace
    env: list[Obj] = [
        {"name": names.ENV_BACKEND_URL, "value": config.backend_url},
        {"name": names.ENV_JOB_ID, "value": claim.job_id},
        {"name": names.ENV_JOB_TOKEN, "valueFrom": {"secretKeyRef": {
            "name": secret_name(claim.job_id), "key": names.TOKEN_KEY}}},
        {"name": names.ENV_LAUNCH_REQUEST, "value": json.dumps(claim.launch_request, separators=(",", ":"),
                                                               sort_keys=True)},
        {"name": names.ENV_DRIVER_RUNTIME, "value": names.DRIVER_RUNTIME},
        {"name": names.ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    env.extend({"name": k, "value": v} for k, v in sorted(passthrough.items()))
    return env


def security_context(config: settings.Settings) -> Obj:
    """The driver container's securityContext."""
    context: Obj = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": config.driver_run_as_non_root,
    }
    if config.driver_run_as_user is not None:
        context["runAsUser"] = config.driver_run_as_user
    if config.driver_run_as_group is not None:
        context["runAsGroup"] = config.driver_run_as_group
    return context


def job(claim: backend.Claim, config: settings.Settings) -> Obj:
    meta_labels = labels(claim.job_id)
    annotations = {names.JOB_ID_ANNOTATION: claim.job_id}
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": names.DRIVER_CONTAINER,
            "image": config.driver_image,
            "env": driver_env(claim, config),
            "resources": {"requests": {"cpu": config.cpu_request, "memory": config.memory_request}},
            "securityContext": security_context(config),
        }],
    }
    if config.driver_service_account:
        pod_spec["serviceAccountName"] = config.driver_service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(claim.job_id), "namespace": config.namespace,
                     "labels": meta_labels, "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": config.job_ttl_seconds,
            "template": {"metadata": {"labels": meta_labels, "annotations": annotations}, "spec": pod_spec},
        },
    }


def _owned_secret(job_id: str, config: settings.Settings, job_uid: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(job_id), "namespace": config.namespace,
            "labels": labels(job_id), "annotations": {names.JOB_ID_ANNOTATION: job_id},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name(job_id),
                                 "uid": job_uid, "controller": False, "blockOwnerDeletion": False}],
        },
    }


def secret(claim: backend.Claim, config: settings.Settings, *, job_uid: str) -> Obj:
    """The token Secret, owned by the Job (uid from the create answer) so it goes with it."""
    return {**_owned_secret(claim.job_id, config, job_uid), "stringData": {names.TOKEN_KEY: claim.token}}


def tombstone(job_id: str, config: settings.Settings, *, job_uid: str) -> Obj:
    """The Secret written for a Job whose token nobody here knows: no token key, so the kubelet can
    never start a container whose secretKeyRef names it. Owned by that Job, it goes with it."""
    return {**_owned_secret(job_id, config, job_uid), "data": {}}


def has_token(secret_obj: Obj) -> bool:
    """False for a tombstone."""
    return names.TOKEN_KEY in (secret_obj.get("data") or {})


def serves(secret_obj: Obj, job_uid: str) -> bool:
    """True if this Secret gives the Job with `job_uid` its token and stays as long as the Job does.

    False for a tombstone (no token key) and for a Secret owned by another Job of the same name (an
    earlier Job of the run, deleted: the garbage collector is about to delete its Secret too).
    """
    if not has_token(secret_obj):
        return False
    owners = [o.get("uid") for o in (secret_obj.get("metadata") or {}).get("ownerReferences") or []]
    return not owners or job_uid in owners


def job_id_of(obj: Obj) -> str | None:
    meta = obj.get("metadata") or {}
    return (meta.get("annotations") or {}).get(names.JOB_ID_ANNOTATION)


def finished(obj: Obj) -> str | None:
    """'Complete' or 'Failed' when the Job has that condition True, else None."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def deletion(*, uid: str = "") -> Obj:
    """The DeleteOptions of a driver Job: its pods go too, in the background (its Secret goes with it,
    owned). With `uid`, only that Job: another of the same name answers 409 (a failed precondition)."""
    body: Obj = {"propagationPolicy": "Background"}
    if uid:
        body["preconditions"] = {"uid": uid}
    return body
