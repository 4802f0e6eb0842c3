"""What the cluster tests need to play Trainer, JobSet and Kueue: the real
CRDs are installed but their controllers are not, so a test writes the
objects those controllers would (a JobSet owned by the TrainJob, its pods,
the Workload and its status) through the real apiserver.

The TrainJob is built with our own runtime-patch entry (raising.patch_entry)
so these tests do not depend on the renderer; start's own test uses the
renderer."""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

from toolkit import kube, names, paths, raising

Obj = dict[str, Any]
CHECK_CONTROLLER = "dispatch.phpboyscout.uk/admission-check"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def trainjob_body(name: str, *, suspend: bool = True, admission: int = 0) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "suspend": suspend,
            "trainer": {
                "image": "busybox",
                "command": ["/bin/sh", "-c", "true", "dispatch-prologue"],
                "args": ["train"],
                "env": [
                    {"name": names.ENV_EPOCH_PREFIX, "value": "1000002"},
                    {"name": names.ENV_TOKEN_PREFIX, "value": "job-1.2.0"},
                ],
            },
            "runtimePatches": [raising.patch_entry(admission)],
        },
    }


def create_trainjob(client: kube.Client, namespace: str, name: str | None = None, **kw: Any) -> Obj:
    name = name or f"tj-{uuid.uuid4().hex[:6]}"
    return client.create(paths.TRAINJOB, trainjob_body(name, **kw), namespace=namespace)


def set_suspend(client: kube.Client, namespace: str, name: str, suspend: bool) -> None:
    def compute(tj: Obj) -> tuple[Obj | None, None]:
        tj["spec"]["suspend"] = suspend
        return tj, None

    client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=compute)


def owner(obj: Obj) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def create_jobset(client: kube.Client, trainjob: Obj) -> Obj:
    """As Trainer does: one JobSet named like the TrainJob, owned by it."""
    meta = trainjob["metadata"]
    body = {
        "metadata": {"name": meta["name"], "ownerReferences": [owner(trainjob)]},
        "spec": {
            "replicatedJobs": [
                {
                    "name": names.TRAINER_REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "node", "image": "busybox"}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    }
    return client.create(paths.JOBSET, body, namespace=meta["namespace"])


def set_restarts(client: kube.Client, jobset: Obj, restarts: int) -> Obj:
    meta = jobset["metadata"]
    return client.merge_patch(
        paths.JOBSET, {"status": {"restarts": restarts}}, name=meta["name"], namespace=meta["namespace"], subresource="status"
    )


def create_pod(
    client: kube.Client,
    *,
    namespace: str,
    trainjob: str,
    admission: str | None,
    restart: str = "0",
    replicated_job: str = names.TRAINER_REPLICATED_JOB,
) -> Obj:
    """A pod as JobSet would create it from the patched template."""
    annotations = {} if admission is None else {names.ADMISSION_ANNOTATION: admission}
    body = {
        "metadata": {
            "name": f"{trainjob}-{replicated_job}-0-0-{uuid.uuid4().hex[:5]}",
            "labels": {
                names.JOBSET_NAME_LABEL: trainjob,
                names.RESTART_LABEL: restart,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
            },
            "annotations": annotations,
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]},
    }
    return client.create(paths.POD, body, namespace=namespace)


def create_admission_check(client: kube.Client, name: str) -> Obj:
    return client.create(paths.ADMISSION_CHECK, {"metadata": {"name": name}, "spec": {"controllerName": CHECK_CONTROLLER}})


def create_workload(client: kube.Client, trainjob: Obj) -> Obj:
    meta = trainjob["metadata"]
    body = {
        "metadata": {"name": f"trainjob-{meta['name']}-{uuid.uuid4().hex[:5]}", "ownerReferences": [owner(trainjob)]},
        "spec": {
            "queueName": "lq",
            "podSets": [
                {"name": "node", "count": 1, "template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}
            ],
        },
    }
    return client.create(paths.WORKLOAD, body, namespace=meta["namespace"])


def _condition(kind: str, status: bool, reason: str) -> Obj:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": reason, "lastTransitionTime": now()}


def kueue_reserve(client: kube.Client, *, namespace: str, name: str, check: str) -> Obj:
    """As Kueue does on quota reservation: QuotaReserved true, our check Pending."""

    def compute(wl: Obj) -> tuple[Obj | None, Obj]:
        status = wl.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c["type"] not in ("QuotaReserved", "Evicted", "Admitted")]
        conds.append(_condition("QuotaReserved", True, "QuotaReserved"))
        status["conditions"] = conds
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [{"name": "node", "count": 1}]}
        status["admissionChecks"] = [{"name": check, "state": "Pending", "message": "", "lastTransitionTime": now()}]
        return wl, wl

    _, _ = client.read_modify_write(paths.WORKLOAD, name=name, namespace=namespace, compute=compute, subresource="status")
    return client.get(paths.WORKLOAD, name=name, namespace=namespace)


def kueue_evict(client: kube.Client, *, namespace: str, name: str, check: str, keep_quota: bool = False) -> None:
    """As Kueue does on preemption: Evicted, quota released, checks back to
    Pending. keep_quota: Kueue's first step, before the job is suspended,
    when the quota is still reserved."""

    def compute(wl: Obj) -> tuple[Obj | None, None]:
        status = wl.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c["type"] not in ("QuotaReserved", "Evicted", "Admitted")]
        conds += [_condition("QuotaReserved", keep_quota, "QuotaReserved" if keep_quota else "Pending"),
                  _condition("Evicted", True, "Preempted")]
        status["conditions"] = conds
        if not keep_quota:
            status.pop("admission", None)
        status["admissionChecks"] = [{"name": check, "state": "Pending", "message": "evicted", "lastTransitionTime": now()}]
        return wl, None

    client.read_modify_write(paths.WORKLOAD, name=name, namespace=namespace, compute=compute, subresource="status")


def check_entry(client: kube.Client, *, namespace: str, name: str, check: str) -> Obj:
    wl = client.get(paths.WORKLOAD, name=name, namespace=namespace)
    for entry in (wl.get("status") or {}).get("admissionChecks") or []:
        if entry["name"] == check:
            return entry
    return {}


def wait_for(fn: Any, *, timeout: float = 15.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def annotations(client: kube.Client, namespace: str, name: str) -> dict[str, str]:
    return client.get(paths.TRAINJOB, name=name, namespace=namespace)["metadata"].get("annotations") or {}
