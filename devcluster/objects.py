"""The objects Trainer and Kueue would write, for a cluster whose Trainer and
Kueue controllers do not run: a TrainJob carrying our runtime-patch entry
(raising.patch_entry, not the renderer), a Workload owned by it, and the
Workload status writes Kueue makes on quota reservation and on eviction. All
go through the real apiserver. The adapter's cluster tests (tests/adapter/kit.py)
play Kueue with these; bench/controller raises on these TrainJobs.

The TrainJob names a TrainingRuntime in its own namespace (RUNTIME), made
compliant (the runtime requirements) by the renderer and created with it (`ensure_runtime`): open,
release and the admission check read the runtime again at each admission, and
refuse a TrainJob whose runtime is missing or unfit.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from devcluster import local
from toolkit import detect, kube, names, paths, raising, render, runtime_check

Obj = dict[str, Any]
CHECK_CONTROLLER = "dispatch.phpboyscout.uk/admission-check"
RUNTIME = "torch-distributed"


now = detect.now


def trainjob_body(name: str, *, suspend: bool = True, admission: int = 0) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"apiGroup": names.TRAINER_GROUP, "kind": "TrainingRuntime", "name": RUNTIME},
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


def runtime_body(name: str = RUNTIME) -> Obj:
    """A TrainingRuntime the runtime check accepts (the renderer's own fields)."""
    pod_spec: Obj = {"containers": [{"name": "node", "image": "busybox"}]}
    return render.runtime({
        "apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "replicas": 1, "template": {"metadata": {"labels": runtime_check.TRAINER_STEP_LABELS},
                                                         "spec": {"template": {"spec": pod_spec}}}}
        ]}}},
    }, sidecar_image=local.SIDECAR_IMAGE)


def ensure_runtime(client: kube.Client, namespace: str) -> Obj:
    try:
        return client.create(paths.TRAINING_RUNTIME, runtime_body(), namespace=namespace)
    except kube.AlreadyExists:
        return client.get(paths.TRAINING_RUNTIME, name=RUNTIME, namespace=namespace)


# What Trainer's and Kueue's TrainJob webhooks say of a runtime their caches have not seen yet, and
# how long `once_the_runtime_is_seen` asks again while they say it.
RUNTIME_NOT_SEEN = re.compile(r"specified trainingRuntime must be created before the TrainJob is created"
                              r"|runtime '[^']*' not found")
RUNTIME_SEEN_SECONDS = 90.0
T = TypeVar("T")


def once_the_runtime_is_seen(create: Callable[[], T]) -> T:
    """CREATE (a TrainJob's), asked again while Trainer's or Kueue's webhook refuses it for a runtime
    its cache has not seen yet (a runtime just created, or an apiserver just restarted; on a busy
    host that lasts longer): a moment later they take it. Any other refusal is raised at once."""
    deadline = time.monotonic() + RUNTIME_SEEN_SECONDS
    while True:
        try:
            return create()
        except kube.Forbidden as e:
            if time.monotonic() > deadline or not RUNTIME_NOT_SEEN.search(str(e)):
                raise
            time.sleep(0.5)


def create_trainjob(client: kube.Client, namespace: str, name: str | None = None, **kw: Any) -> Obj:
    name = name or f"tj-{uuid.uuid4().hex[:6]}"
    ensure_runtime(client, namespace)
    body = trainjob_body(name, **kw)
    return once_the_runtime_is_seen(lambda: client.create(paths.TRAINJOB, body, namespace=namespace))


def owner(obj: Obj) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


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


def condition(kind: str, status: bool, reason: str) -> Obj:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": reason, "lastTransitionTime": now()}


def kueue_reserve(client: kube.Client, *, namespace: str, name: str, check: str) -> Obj:
    """As Kueue does on quota reservation: QuotaReserved true, our check Pending."""

    def compute(wl: Obj) -> tuple[Obj | None, Obj]:
        status = wl.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c["type"] not in ("QuotaReserved", "Evicted", "Admitted")]
        conds.append(condition("QuotaReserved", True, "QuotaReserved"))
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
        conds += [condition("QuotaReserved", keep_quota, "QuotaReserved" if keep_quota else "Pending"),
                  condition("Evicted", True, "Preempted")]
        status["conditions"] = conds
        if not keep_quota:
            status.pop("admission", None)
        status["admissionChecks"] = [{"name": check, "state": "Pending", "message": "evicted", "lastTransitionTime": now()}]
        return wl, None

    client.read_modify_write(paths.WORKLOAD, name=name, namespace=namespace, compute=compute, subresource="status")
