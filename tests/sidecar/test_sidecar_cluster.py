"""The real sidecar process against the real apiserver, with the shipped RBAC.

Each test starts `python -m sidecar` with a Downward API directory (the files
as the kubelet writes them) and the credentials of the `dispatch-sidecar`
ServiceAccount bound by the Role files in deployments/k8s/base/sidecar, and
reads its JSON log: one line per API request (with a running count), one
verdict line per check. The Events it created are then read back as admin.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.utils
import pytest
import yaml

from devcluster import harness
from toolkit import names

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
RBAC_DIR = REPO / "deployments/k8s/base/sidecar"
SA = "dispatch-sidecar"
TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
Plane = harness.ControlPlane | harness.ExistingCluster


def go_quote(value: str) -> str:
    # Values here are plain ASCII; the full format is tested against the kubelet's code.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_podinfo(directory: pathlib.Path, *, pod: str, namespace: str, labels: dict[str, str],
                  annotations: dict[str, str]) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "name").write_text(pod)
    (directory / "namespace").write_text(namespace)
    for file, values in (("labels", labels), ("annotations", annotations)):
        (directory / file).write_text("\n".join(f"{k}={go_quote(v)}" for k, v in sorted(values.items())))
    return directory


def trainjob(name: str, *, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(TRAINER), "kind": "TrainJob",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"suspend": True, "runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"command": ["/bin/sh", "-c", 'exec "$@"', "dispatch-prologue"], "args": ["true"]}},
    }


def jobset(name: str) -> dict[str, Any]:
    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "x"}]}}
    return {"apiVersion": "/".join(JOBSET), "kind": "JobSet", "metadata": {"name": name},
            "spec": {"suspend": True, "replicatedJobs": [
                {"name": "node", "replicas": 1, "template": {"spec": {"template": pod}}}]}}


class Sidecar:
    """A running `python -m sidecar`; its stderr parsed as JSON lines."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "sidecar"], cwd=REPO, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_for(self, msg: str, *, count: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
        """Read lines until `count` lines with this msg have been seen in all."""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while sum(1 for line in self.lines if line["message"] == msg) < count:
            assert time.monotonic() < deadline, f"no {count} x {msg!r} in {self.lines}"
            raw = self.proc.stderr.readline()
            assert raw, f"sidecar ended ({self.proc.wait()}) before {count} x {msg!r}: {self.lines}"
            self.lines.append(json.loads(raw))
        return [line for line in self.lines if line["message"] == msg]

    def finish(self, *, timeout: float = 10) -> int:
        assert self.proc.stderr is not None
        rc = self.proc.wait(timeout=timeout)
        self.lines += [json.loads(raw) for raw in self.proc.stderr.read().splitlines()]
        self.proc.stderr.close()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.proc.stderr.close()


class Setup:
    def __init__(self, plane: Plane, api: kubernetes.client.ApiClient, namespace: str, tmp: pathlib.Path) -> None:
        self.api = api
        self.namespace = namespace
        self.tmp = tmp
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.core = kubernetes.client.CoreV1Api(api)
        for path in sorted(RBAC_DIR.glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            doc = yaml.safe_load(path.read_text())
            kubernetes.utils.create_from_dict(api, doc, namespace=namespace)
        kubeconfig = yaml.safe_load(pathlib.Path(plane.mint_kubeconfig(namespace=namespace,
                                                                       service_account=SA)).read_text())
        cluster = kubeconfig["clusters"][0]["cluster"]
        self.token_file = tmp / "token"
        self.token_file.write_text(kubeconfig["users"][0]["user"]["token"])
        self.env = {
            "PATH": os.environ["PATH"],
            "DISPATCH_SIDECAR_API_SERVER": cluster["server"],
            "DISPATCH_SIDECAR_TOKEN_FILE": str(self.token_file),
            "DISPATCH_SIDECAR_CA_FILE": cluster["certificate-authority"],
            "DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS": "0.1",
            "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS": "0.5",
        }
        self._wait_for_rbac()

    def _wait_for_rbac(self) -> None:
        # The authorizer learns RBAC through an informer: wait until the Role works.
        self.custom.create_namespaced_custom_object(*TRAINER, self.namespace, "trainjobs",
                                                    trainjob("rbac-probe", annotations={}))
        deadline = time.monotonic() + 20
        while self.request("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{self.namespace}"
                                  "/trainjobs/rbac-probe")[0] == 403:
            assert time.monotonic() < deadline, "the sidecar Role never took effect"
            time.sleep(0.1)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
        """A raw request with the sidecar's token."""
        import http.client
        import ssl
        import urllib.parse
        url = urllib.parse.urlsplit(self.env["DISPATCH_SIDECAR_API_SERVER"])
        context = ssl.create_default_context(cafile=self.env["DISPATCH_SIDECAR_CA_FILE"])
        conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=context, timeout=10)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Authorization": f"Bearer {self.token_file.read_text()}",
                                  "Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def sidecar(self, podinfo: pathlib.Path, **env: str) -> Sidecar:
        return Sidecar({**self.env, "DISPATCH_SIDECAR_PODINFO_DIR": str(podinfo),
                        **{f"DISPATCH_SIDECAR_{k.upper()}": v for k, v in env.items()}})

    def events(self, trainjob_name: str) -> list[Any]:
        listed = self.core.list_namespaced_event(self.namespace,
                                                 field_selector=f"involvedObject.name={trainjob_name}")
        return [e for e in listed.items if e.reason == names.SIDECAR_VIOLATION_REASON]


@pytest.fixture
def setup(control_plane: Plane, api_client: kubernetes.client.ApiClient, namespace: str,
          tmp_path: pathlib.Path) -> Iterator[Setup]:
    yield Setup(control_plane, api_client, namespace, tmp_path)


RECORDED = "11111111-2222-3333-4444-555555555555"
OTHER = "99999999-8888-7777-6666-555555555555"

# name: (pod admission (None: absent), restart label, TrainJob floor, pod's jobset-uid label, expected rule)
CASES: dict[str, tuple[str | None, str, str | None, str | None, str | None]] = {
    "ok": ("3", "1", "3", RECORDED, None),
    "ok, no floor yet": ("1", "0", None, RECORDED, None),
    "ok, JobSet UID read from the JobSet": ("3", "0", "3", None, None),
    "missing-admission": (None, "0", "3", RECORDED, "missing-admission"),
    "below-floor": ("2", "0", "3", RECORDED, "below-floor"),
    "invalid-admission": ("03", "0", "3", RECORDED, "invalid-admission"),
    "invalid-restart": ("3", "1e3", "3", RECORDED, "invalid-restart"),
    "invalid-floor": ("3", "0", "three", RECORDED, "invalid-floor"),
    "jobset-uid from the pod label": ("3", "0", "3", OTHER, "jobset-uid"),
    "jobset-uid from the JobSet": ("3", "0", "3", None, "jobset-uid"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verdict_event_and_request_count(setup: Setup, tmp_path: pathlib.Path, case: str) -> None:
    admission, restart, floor, uid_label, rule = CASES[case]
    name = f"tj-{uuid.uuid4().hex[:6]}"
    js = setup.custom.create_namespaced_custom_object(*JOBSET, setup.namespace, "jobsets", jobset(name))
    recorded = RECORDED if uid_label is not None else js["metadata"]["uid"]
    if case == "jobset-uid from the JobSet":
        recorded = OTHER  # the JobSet that exists is not the one recorded
    tj_annotations = {names.JOBSET_UID_ANNOTATION: recorded}
    if floor is not None:
        tj_annotations[names.FLOOR_ANNOTATION] = floor
    tj = setup.custom.create_namespaced_custom_object(*TRAINER, setup.namespace, "trainjobs",
                                                      trainjob(name, annotations=tj_annotations))
    labels = {names.JOBSET_NAME_LABEL: name, names.RESTART_LABEL: restart}
    if uid_label is not None:
        labels[names.JOBSET_UID_LABEL] = uid_label
    pod = f"{name}-node-0-0-abcde"
    podinfo = write_podinfo(tmp_path / "podinfo", pod=pod, namespace=setup.namespace, labels=labels,
                            annotations={} if admission is None else {names.ADMISSION_ANNOTATION: admission})

    sidecar = setup.sidecar(podinfo, max_checks="2", interval_seconds="0.05")
    try:
        assert sidecar.finish(timeout=30) == 0
    finally:
        sidecar.kill()

    verdicts = [line for line in sidecar.lines if line["message"] == "verdict"]
    requests = [line for line in sidecar.lines if line["message"] == "request"]
    reads = 1 if uid_label is not None else 2
    assert [v["reads"] for v in verdicts] == [reads, reads]
    assert [v["verdict"] for v in verdicts] == ["ok" if rule is None else "violation"] * 2
    assert all(r["status"] in (200, 201) for r in requests), requests
    # Reported once, logged at every check: the second check only reads.
    assert [v["events"] for v in verdicts] == ([0, 0] if rule is None else [1, 0])
    assert [r["n"] for r in requests] == list(range(1, len(requests) + 1))
    # The budget: at most 2 reads per check, plus one Event POST per violation reported.
    for n in (1, 2):
        sent = [(r["method"], r["path"]) for r in requests if r["check"] == n]
        gets = [path for method, path in sent if method == "GET"]
        posts = [path for method, path in sent if method == "POST"]
        assert len(gets) == reads <= 2, sent
        assert gets[0].endswith(f"/namespaces/{setup.namespace}/trainjobs/{name}"), sent
        assert posts == ([f"/api/v1/namespaces/{setup.namespace}/events"] if rule is not None and n == 1 else []), sent
        assert len(sent) == len(gets) + len(posts), sent
    assert len([line for line in sidecar.lines if line["message"] == "violation"]) == (0 if rule is None else 2)

    events = setup.events(name)
    if rule is None:
        assert events == []
        return
    (event,) = events
    assert event.type == "Warning"
    assert (event.involved_object.kind, event.involved_object.name, event.involved_object.uid) == (
        "TrainJob", name, tj["metadata"]["uid"])
    assert event.message.startswith(f"{rule}: ")
    assert f"pod={pod}" in event.message
    assert f"restart-attempt={restart!r}" in event.message
    assert f"admission={admission!r}" in event.message if admission is not None else "admission=absent" in event.message
    if rule == "jobset-uid":
        seen_uid = uid_label or js["metadata"]["uid"]
        assert f"JobSet UID {seen_uid} is not the recorded {recorded}: J may have been reset" in event.message


def test_the_shipped_role_allows_nothing_else(setup: Setup) -> None:
    base = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{setup.namespace}/trainjobs/rbac-probe"
    status, body = setup.request("GET", base)
    assert status == 200  # a TrainJob no pod of this token belongs to: the get is namespace-wide (threat-model.md)
    probe = json.loads(body)
    probe["metadata"].setdefault("annotations", {})[names.FLOOR_ANNOTATION] = "0"
    forbidden = {
        "update a TrainJob": ("PUT", base, probe),
        "delete a TrainJob": ("DELETE", base, None),
        "list TrainJobs": ("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{setup.namespace}/trainjobs",
                           None),
        "read a Secret": ("GET", f"/api/v1/namespaces/{setup.namespace}/secrets/anything", None),
        "list Secrets": ("GET", f"/api/v1/namespaces/{setup.namespace}/secrets", None),
        "read another namespace's TrainJob": ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default"
                                                     "/trainjobs/rbac-probe", None),
    }
    for what, (method, path, body_) in forbidden.items():
        status, text = setup.request(method, path, body_)
        assert status == 403, (what, status, text)
        assert f"system:serviceaccount:{setup.namespace}:{SA}" in text, what


def test_survives_the_apiserver_going_away_and_coming_back(setup: Setup, control_plane: Plane,
                                                           tmp_path: pathlib.Path) -> None:
    if not isinstance(control_plane, harness.ControlPlane):
        # Honest, not silent: stopping the apiserver of a cluster we do not run is not ours to do.
        pytest.skip("stops and starts kube-apiserver: only the harness's own control plane, not TEST_KUBECONFIG's")
    name = "restarted"
    setup.custom.create_namespaced_custom_object(*TRAINER, setup.namespace, "trainjobs",
                                                 trainjob(name, annotations={names.FLOOR_ANNOTATION: "1"}))
    podinfo = write_podinfo(tmp_path / "podinfo", pod="p", namespace=setup.namespace,
                            labels={names.JOBSET_NAME_LABEL: name, names.RESTART_LABEL: "0",
                                    names.JOBSET_UID_LABEL: RECORDED},
                            annotations={names.ADMISSION_ANNOTATION: "1"})
    sidecar = setup.sidecar(podinfo, interval_seconds="0.2")
    try:
        sidecar.wait_for("verdict")
        control_plane.stop_apiserver()
        try:
            sidecar.wait_for("check failed", count=3)
        finally:
            control_plane.start_apiserver()
        checks = len(sidecar.wait_for("verdict"))
        sidecar.wait_for("verdict", count=checks + 1, timeout=30)
        assert sidecar.proc.poll() is None, "the sidecar must not exit while the apiserver is away"
        sidecar.proc.send_signal(signal.SIGTERM)
        assert sidecar.finish(timeout=60) == 0  # the bound is the wait: a loaded machine takes well under it
    finally:
        sidecar.kill()
    failed = [line for line in sidecar.lines if line["message"] == "check failed"]
    errors = {f["error"] for f in failed}
    # Also seen: 403 for a moment after the restart, until the new apiserver's
    # RBAC informer has synced; a 403 is retried like the rest, and recovers.
    assert any("Connection refused" in e for e in errors), errors
    assert [line["verdict"] for line in sidecar.lines if line["message"] == "verdict"][-1] == "ok"
    assert sidecar.lines[-1]["message"] == "stop"
    assert sidecar.lines[-1]["reason"] == "SIGTERM"


def test_the_test_kubeconfig_path_runs_the_sidecar(control_plane: Plane, namespace: str,
                                                   tmp_path: pathlib.Path) -> None:
    """What TEST_KUBECONFIG gives this suite, on a cluster at hand: an
    ExistingCluster over the plane's own kubeconfig sets up the shipped RBAC,
    mints the sidecar's token, and the sidecar reaches its verdict with it."""
    existing = harness.ExistingCluster(control_plane.kubeconfig, crds=False)
    try:
        with existing.api_client() as api:
            setup = Setup(existing, api, namespace, tmp_path)
            name = "existing"
            setup.custom.create_namespaced_custom_object(*TRAINER, namespace, "trainjobs", trainjob(
                name, annotations={names.FLOOR_ANNOTATION: "2", names.JOBSET_UID_ANNOTATION: RECORDED}))
            podinfo = write_podinfo(tmp_path / "podinfo", pod=f"{name}-node-0-0-x", namespace=namespace,
                                    labels={names.JOBSET_NAME_LABEL: name, names.RESTART_LABEL: "0",
                                            names.JOBSET_UID_LABEL: RECORDED},
                                    annotations={names.ADMISSION_ANNOTATION: "1"})
            sidecar = setup.sidecar(podinfo, max_checks="1")
            try:
                assert sidecar.finish(timeout=30) == 0
            finally:
                sidecar.kill()
            (verdict,) = [line for line in sidecar.lines if line["message"] == "verdict"]
            assert (verdict["verdict"], verdict["rules"], verdict["reads"], verdict["events"]) == (
                "violation", ["below-floor"], 1, 1)
            (event,) = setup.events(name)
            assert event.message.startswith("below-floor: ")
            assert pathlib.Path(setup.env["DISPATCH_SIDECAR_CA_FILE"]) == pathlib.Path(control_plane.ca_file)
    finally:
        existing.stop()
