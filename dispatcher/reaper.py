"""Sandbox reaping: delete the sandbox pods a dead driver orphaned.

A driver killed by SIGKILL never runs its own cleanup, and its sandbox pods
have no ownerReference to be garbage-collected by, so they would hold their
requests on the node until someone deletes them. When a driver Job fails (or
is deleted before it finished) the dispatcher deletes that run's sandbox
pods in its own namespace and in the sandbox namespace (TCAB_K8S_NAMESPACE).

The selector needs BOTH labels: the job-id label alone also matches the
driver's own pod, whose log the death report reads. `is_sandbox` checks the
same again on each listed pod, plus that the pod is not one of the driver
Job's own, so a mislabelled pod cannot make us delete the driver.

Independent of the report (it needs no token and no backend); a failed reap
raises, and the main loop tries again on a later tick.
"""

from __future__ import annotations

from typing import Any

from dispatcher import jobspec, kube, names

Obj = dict[str, Any]


def selector(job_id: str) -> str:
    return f"{names.JOB_ID_LABEL}={jobspec.job_id_label(job_id)},{names.MANAGED_BY_LABEL}={names.DRIVER_MANAGED_BY}"


def is_sandbox(pod: Obj, *, job_id: str, driver_job: str) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(names.MANAGED_BY_LABEL) != names.DRIVER_MANAGED_BY:
        return False
    if labels.get(names.JOB_ID_LABEL) != jobspec.job_id_label(job_id):
        return False
    if labels.get(names.JOB_NAME_LABEL) == driver_job or labels.get("job-name") == driver_job:
        return False
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "Job" and owner.get("name") == driver_job:
            return False
    return True


def reap(client: kube.Kube, *, namespaces: tuple[str, ...], job_id: str, driver_job: str) -> list[str]:
    """Delete the run's sandbox pods; returns `namespace/name` of each deleted. Raises on API errors."""
    deleted: list[str] = []
    for namespace in namespaces:
        for pod in client.list_pods(namespace, selector=selector(job_id)):
            if is_sandbox(pod, job_id=job_id, driver_job=driver_job):
                name = pod["metadata"]["name"]
                client.delete_pod(namespace, name)
                deleted.append(f"{namespace}/{name}")
    return deleted
