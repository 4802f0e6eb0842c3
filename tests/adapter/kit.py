"""What the cluster tests need to play Trainer, JobSet and Kueue: the real
CRDs are installed but their controllers are not, so a test writes the
objects those controllers would (a JobSet owned by the TrainJob, its pods,
the Workload and its status) through the real apiserver.

The TrainJob is built with our own runtime-patch entry (raising.patch_entry)
so these tests do not depend on the renderer; start's own test uses the
renderer.

The TrainJob, the Workload and Kueue's status writes live in
devcluster/objects.py, which bench/controller uses too (with the compliant
TrainingRuntime each TrainJob names, in its own namespace: a test that edits
it edits only its own); they are named here as well so that a test reads
every helper from one place."""

from __future__ import annotations

import uuid
from typing import Any

from devcluster import objects
from tests import waiting
from toolkit import kube, names, paths, wrap

Obj = objects.Obj
CHECK_CONTROLLER = objects.CHECK_CONTROLLER
now = objects.now
RUNTIME = objects.RUNTIME
trainjob_body = objects.trainjob_body
runtime_body = objects.runtime_body
ensure_runtime = objects.ensure_runtime
create_trainjob = objects.create_trainjob
owner = objects.owner
create_admission_check = objects.create_admission_check
create_workload = objects.create_workload
_condition = objects.condition
kueue_reserve = objects.kueue_reserve
kueue_evict = objects.kueue_evict


def set_suspend(client: kube.Client, namespace: str, name: str, suspend: bool) -> None:
    def compute(tj: Obj) -> tuple[Obj | None, None]:
        tj["spec"]["suspend"] = suspend
        return tj, None

    client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=compute)


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
    jobset_uid: str | None = None,
    prologue: bool = True,
) -> Obj:
    """A pod as JobSet would create it from the patched template (PROLOGUE false: from a runtime
    that gives the TrainJob's spec.trainer to another replicated job, so without its env)."""
    annotations = {} if admission is None else {names.ADMISSION_ANNOTATION: admission}
    extra = {} if jobset_uid is None else {names.JOBSET_UID_LABEL: jobset_uid}
    body = {
        "metadata": {
            "name": f"{trainjob}-{replicated_job}-0-0-{uuid.uuid4().hex[:5]}",
            "labels": {
                names.JOBSET_NAME_LABEL: trainjob,
                names.RESTART_LABEL: restart,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                **extra,
            },
            "annotations": annotations,
        },
        # The trainer container as Trainer gives it the TrainJob's spec.trainer: the prologue's inputs.
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": names.TRAINER_CONTAINER, "image": "busybox",
            "env": wrap.dispatch_env(epoch_prefix="1000002", token_prefix="job-1.2.0") if prologue else []}]},
    }
    return client.create(paths.POD, body, namespace=namespace)


def check_entry(client: kube.Client, *, namespace: str, name: str, check: str) -> Obj:
    wl = client.get(paths.WORKLOAD, name=name, namespace=namespace)
    for entry in (wl.get("status") or {}).get("admissionChecks") or []:
        if entry["name"] == check:
            return entry
    return {}


def wait_for(fn: Any, *, timeout: float = 15.0, interval: float = 0.02, what: str = "condition") -> Any:
    return waiting.until(what, fn, timeout=timeout, interval=interval)


def annotations(client: kube.Client, namespace: str, name: str) -> dict[str, str]:
    return client.get(paths.TRAINJOB, name=name, namespace=namespace)["metadata"].get("annotations") or {}


def set_phase(client: kube.Client, *, namespace: str, pod: str, phase: str) -> None:
    """As the kubelet reports a container's end."""
    client.merge_patch(paths.POD, {"status": {"phase": phase}}, name=pod, namespace=namespace, subresource="status")


def delete_pod(client: kube.Client, *, namespace: str, pod: str) -> None:
    """As the Job controller removes a held or restarted execution's pod (no kubelet: at once)."""
    client.delete(paths.POD, name=pod, namespace=namespace, body={"gracePeriodSeconds": 0}, missing_ok=True)
