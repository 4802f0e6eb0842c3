"""Helpers for the dispatcher's cluster tests: the shipped RBAC, the process, a stand-in kubelet."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client
import yaml

from tests.refbackend import proc

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deployments" / "k8s" / "base" / "dispatcher"
SA = "tcab-dispatcher"
IMAGE = "test-cabinet/driver:test"


def install_rbac(api: kubernetes.client.ApiClient, namespace: str) -> None:
    """The shipped ServiceAccount, Role and RoleBinding, unmodified, into `namespace`."""
    core = kubernetes.client.CoreV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    for name in ("serviceaccount.yaml", "role.yaml", "rolebinding.yaml"):
        doc = yaml.safe_load((MANIFESTS / name).read_text())
        kind = doc["kind"]
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(namespace, doc)
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        else:
            rbac.create_namespaced_role_binding(namespace, doc)


def wait(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class Dispatcher:
    """`python -m dispatcher` as a real subprocess; its JSON log lines in a file."""

    def __init__(self, *, kubeconfig: str, namespace: str, backend: proc.Backend, **env: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="dispatcher-", suffix=".log", delete=False)
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "KUBECONFIG": kubeconfig,
            "TCAB_BACKEND_URL": backend.url,
            "TCAB_BACKEND_SERVICE_TOKEN": backend.token,
            "TCAB_DISPATCHER_DRIVER_IMAGE": IMAGE,
            "TCAB_DISPATCHER_NAMESPACE": namespace,
            "TCAB_DISPATCHER_POLL_INTERVAL": "0.1",
            "TCAB_DISPATCHER_LOG_LEVEL": "debug",
            **env,
        }
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Dispatcher:
        self.popen = subprocess.Popen([sys.executable, "-m", "dispatcher"], cwd=REPO, env=self.env,
                                      stdout=subprocess.DEVNULL, stderr=self.log)
        return self

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout)

    def close(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.kill()
        print("dispatcher log tail:\n" + self.text()[-4000:])  # shown by pytest when the test failed
        self.log.close()
        os.unlink(self.log.name)

    def text(self) -> str:
        return pathlib.Path(self.log.name).read_text()

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"message": line, "unparsed": True})
        return out


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
