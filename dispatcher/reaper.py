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

`reap_many` does the reaps that are due together: one list per namespace,
selected on the managed-by label and on `job-id in (...)` of those runs only
(at most `BATCH` of them), a page of `PAGE` pods at a time. So a reap costs a
fraction of a request, and the list never grows with the pods of other runs
or with finished pods: the apiserver returns only the pods of the runs asked
about.
"""

from __future__ import annotations

from typing import Any

from dispatcher import jobspec, names
from toolkit import kube, paths

Obj = dict[str, Any]

BATCH = 50  # runs per list: keeps the selector (and so the request line) a few KiB at most
PAGE = 100


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


def batch_selector(job_ids: list[str]) -> str:
    """The sandbox pods of any of these runs (a set-based selector on the job-id label)."""
    values = ",".join(sorted({jobspec.job_id_label(job_id) for job_id in job_ids}))
    return f"{names.JOB_ID_LABEL} in ({values}),{names.MANAGED_BY_LABEL}={names.DRIVER_MANAGED_BY}"


def reap_many(client: kube.Client, *, namespaces: tuple[str, ...], runs: dict[str, str]) -> dict[str, list[str]]:
    """Delete the sandbox pods of several runs ({job_id: driver Job name}, at most BATCH), one paged list per
    namespace; `namespace/name` of each pod deleted, by job id. Raises on API errors (nothing is then
    known to be done: the caller retries the whole batch, and a pod already deleted is a 404, done)."""
    by_label: dict[str, list[str]] = {}
    for job_id in runs:
        by_label.setdefault(jobspec.job_id_label(job_id), []).append(job_id)
    deleted: dict[str, list[str]] = {job_id: [] for job_id in runs}
    selector_all = batch_selector(list(runs))
    for namespace in namespaces:
        for pod in client.each(paths.POD, namespace=namespace, label_selector=selector_all, limit=PAGE):
            label = ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOB_ID_LABEL)
            for job_id in by_label.get(str(label), []):
                if is_sandbox(pod, job_id=job_id, driver_job=runs[job_id]):
                    name = pod["metadata"]["name"]
                    client.delete(paths.POD, name=name, namespace=namespace, missing_ok=True)
                    deleted[job_id].append(f"{namespace}/{name}")
                    break
    return deleted
