"""Helpers for the dispatcher's cluster tests: the shipped RBAC, the process, a stand-in kubelet."""

from __future__ import annotations

import base64
import pathlib
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client

from devcluster import runqueue

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = runqueue.DISPATCHER_MANIFESTS
SA = runqueue.DISPATCHER_SA
IMAGE = "test-cabinet/driver:test"


install_rbac = runqueue.install_rbac  # the shipped ServiceAccount, Role and RoleBinding, unmodified


def wait(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class Dispatcher(runqueue.Dispatcher):
    """`python -m dispatcher` as a real subprocess (devcluster/runqueue.py), with the test driver image."""

    def __init__(self, *, kubeconfig: str, namespace: str, backend: runqueue.Backend, **env: str) -> None:
        super().__init__(kubeconfig=kubeconfig, namespace=namespace, backend=backend, driver_image=IMAGE, **env)


def jobs(api: kubernetes.client.ApiClient, namespace: str) -> list[Any]:
    return list(kubernetes.client.BatchV1Api(api).list_namespaced_job(namespace).items)


def unfinished(job: Any) -> bool:
    return not any(c.type in ("Complete", "Failed") and c.status == "True" for c in (job.status.conditions or []))


def driver_pod(api: kubernetes.client.ApiClient, namespace: str, job_name: str) -> Any:
    pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}").items
    return pods[0] if pods else None


def terminate_pod(api: kubernetes.client.ApiClient, namespace: str, pod: str, *, exit_code: int,
                  reason: str) -> None:
    """What a kubelet writes when the driver container ends (there is no kubelet here)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [{
            "name": "driver", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}},
        }],
    }}
    kubernetes.client.CoreV1Api(api).patch_namespaced_pod_status(pod, namespace, status)


def hold_waiting(api: kubernetes.client.ApiClient, namespace: str, pod: str, *, reason: str, message: str) -> None:
    """What a kubelet writes while it cannot start the driver container (an image it cannot pull)."""
    status = {"status": {
        "phase": "Pending",
        "containerStatuses": [{
            "name": "driver", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}},
        }],
    }}
    kubernetes.client.CoreV1Api(api).patch_namespaced_pod_status(pod, namespace, status)



def job_token(api: kubernetes.client.ApiClient, namespace: str, job_name: str) -> str:
    secret = kubernetes.client.CoreV1Api(api).read_namespaced_secret(job_name, namespace)
    return base64.b64decode((secret.data or {})["token"]).decode()  # KeyError for a tombstone


def control_plane_client(api: kubernetes.client.ApiClient) -> kubernetes.client.ApiClient:
    """A second admin client on the same configuration (a watch holds its connection)."""
    return kubernetes.client.ApiClient(api.configuration)
