"""The controller as a real process, under the shipped RBAC.

`controller_kubeconfig` binds the ClusterRole and Role of
deployments/k8s/base/controller/rbac.yaml to a fresh ServiceAccount in the
test's namespace and mints its token, so every controller test is also a
test that those rules are enough. `start_controller` runs
`python -m controller` as a subprocess and waits for its ready line; its
/metrics is read over HTTPS with a token bound to the shipped
dispatch-metrics-reader (`metrics_token`, devcluster/metrics.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster import metrics
from tests import waiting
from toolkit import kube

REPO = pathlib.Path(__file__).resolve().parents[2]
RBAC = REPO / "deployments" / "k8s" / "base" / "controller" / "rbac.yaml"


def _apply_rbac(client: kube.Client, *, namespace: str, service_account: str) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    suffix = uuid.uuid4().hex[:6]
    for doc in yaml.safe_load_all(RBAC.read_text()):
        kind = doc["kind"]
        doc = dict(doc)
        meta = dict(doc["metadata"])
        if kind == "ClusterRole":
            try:
                client.request("POST", f"{rbac}/clusterroles", body=doc)
            except kube.AlreadyExists:
                existing = client.request("GET", f"{rbac}/clusterroles/{meta['name']}")
                doc["metadata"] = {**meta, "resourceVersion": existing["metadata"]["resourceVersion"]}
                client.request("PUT", f"{rbac}/clusterroles/{meta['name']}", body=doc)
            continue
        if "subjects" in doc:
            doc["subjects"] = [{**s, "name": service_account, "namespace": namespace} for s in doc["subjects"]]
        if kind == "ClusterRoleBinding":
            meta["name"] = f"{meta['name']}-{namespace}-{suffix}"
            doc["metadata"] = meta
            client.request("POST", f"{rbac}/clusterrolebindings", body=doc)
        else:
            plural = {"Role": "roles", "RoleBinding": "rolebindings"}[kind]
            client.request("POST", f"{rbac}/namespaces/{namespace}/{plural}", body=doc)


@pytest.fixture
def admin(api_client) -> kube.Client:
    return kube.from_api_client(api_client)


@pytest.fixture
def controller_kubeconfig(control_plane, namespace, admin) -> str:
    _apply_rbac(admin, namespace=namespace, service_account="dispatch-controller")
    return control_plane.mint_kubeconfig(namespace=namespace, service_account="dispatch-controller")


@pytest.fixture
def metrics_token(admin, namespace) -> str:
    """A token allowed to read /metrics (a ServiceAccount bound to the shipped dispatch-metrics-reader)."""
    return metrics.reader_token(admin, namespace=namespace)


class ControllerProcess:
    def __init__(self, *, kubeconfig: str, namespace: str, leader_elect: bool, extra: list[str],
                 metrics_token: str | None = None) -> None:
        self.metrics_token = metrics_token
        argv = [
            sys.executable, "-m", "controller",
            "--kubeconfig", kubeconfig,
            "--namespace", namespace,
            "--lease-namespace", namespace,
            "--health-port", "0",
            "--metrics-host", "127.0.0.1",
            "--metrics-port", "0",
            "--lease-duration", "3",
            "--leader-elect" if leader_elect else "--no-leader-elect",
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        env["PYTHONPATH"] = str(REPO)
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        self.lines: list[dict[str, Any]] = []
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.ready = threading.Event()
        self.started = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"message": raw.rstrip(), "raw": True}
            self.lines.append(line)
            if line.get("message") == "starting":
                self.port = int(line["health_port"])
                self.metrics_port = int(line["metrics_port"])
                self.started.set()
            if line.get("message") == "ready":
                self.ready.set()

    def wait_ready(self, timeout: float = 20) -> None:
        if not self.ready.wait(timeout):
            raise AssertionError(f"controller not ready after {timeout}s:\n" + self.log_tail())

    def get(self, path: str) -> tuple[int, str]:
        """The probes from the health port; /metrics from the metrics port, with the reader's token."""
        assert self.started.wait(10)
        if path == "/metrics":
            assert self.metrics_port is not None and self.metrics_token is not None
            return metrics.scrape(self.metrics_port, token=self.metrics_token)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(json.dumps(line) for line in self.lines[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.reader.join(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()


@pytest.fixture
def start_controller(controller_kubeconfig, namespace, metrics_token) -> Iterator[Any]:
    procs: list[ControllerProcess] = []

    def start(*, leader_elect: bool = True, wait: bool = True, extra: list[str] | None = None) -> ControllerProcess:
        proc = ControllerProcess(kubeconfig=controller_kubeconfig, namespace=namespace, leader_elect=leader_elect,
                                 extra=extra or [], metrics_token=metrics_token)
        procs.append(proc)
        if wait:
            proc.wait_ready()
        return proc

    yield start
    for proc in procs:
        proc.stop()
    for proc in procs:
        errors = [line for line in proc.lines if line.get("level") == "error"]
        assert not errors, proc.log_tail()


def run_controller_once(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m controller ARGS` against a kubeconfig whose one context points at a closed port,
    with no DISPATCH_ setting from the environment, for at most 30 s: a controller that ignored
    what ARGS get wrong would run on, not refuse."""
    kubeconfig = tmp_path / "kc.yaml"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "a", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "a", "user": {"token": "x"}}],
        "contexts": [{"name": "a", "context": {"cluster": "a", "user": "a"}}],
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_") and k != "KUBECONFIG"}
    return subprocess.run([sys.executable, "-m", "controller", "--kubeconfig", str(kubeconfig), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=30)


def wait_until(fn: Any, *, timeout: float = 15, what: str = "condition") -> Any:
    return waiting.until(what, fn, timeout=timeout, interval=0.02)
