"""End to end in plain mode, on the real Trainer and JobSet controllers and
kwok (tests/e2e/stack.py): the toolkit starts and opens a TrainJob, Trainer
builds the JobSet, JobSet the Jobs, the job controller the pods, the
scheduler places them on kwok's nodes and kwok runs them; the test then runs
each pod's real container with podman (tests/e2e/execute.py) and ends the pod
with that container's exit code.

What every scenario checks: each pod carries our admission annotation and
JobSet's restart-attempt label, and the sidecar; every execution printed a
DISPATCH_EPOCH and DISPATCH_ATTEMPT; across the scenario the epochs strictly
increase and the attempt tokens are distinct.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from tests.e2e import execute, stack as stack_mod
from toolkit import adapter, kube, names, render
from toolkit import request as request_mod

IMAGE = "localhost/dispatch-base/busybox:1.35-static"
JOB_ID = "e2e.job"  # JobIDs may hold dots: the token is parsed from the right
GENERATION, SUBMISSION, ATTEMPT = 3, 7, 1
WAIT_SECONDS = 90.0

# The user's command: print the identity; exit 3 on the JobSet's first attempt
# when FAIL_FIRST is set (J is the token's last field).
COMMAND = ["/bin/sh", "-c",
           'env; if [ -n "$FAIL_FIRST" ] && [ "${DISPATCH_ATTEMPT##*.}" = 0 ]; then exit 3; fi']


def _runtime(name: str, *, max_restarts: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {"spec": {
                "failurePolicy": {"maxRestarts": max_restarts},
                "replicatedJobs": [{
                    "name": names.TRAINER_REPLICATED_JOB,
                    "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"template": {"spec": {"containers": [{"name": "node", "image": IMAGE}]}}},
                    },
                }],
            }},
        },
    }


class Scenario:
    """One TrainJob's life, and every execution the test ran for its pods."""

    def __init__(self, stack: stack_mod.Stack, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.stack = stack
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.client = kube.from_api_client(api)
        self.namespace = namespace
        self.name = ""
        self.executions: list[execute.Execution] = []
        self.seen_pods: set[str] = set()
        # The sidecar's ServiceAccount (deployments/k8s/base/sidecar grants it its rights).
        self.core.create_namespaced_service_account(namespace, {"metadata": {"name": names.SIDECAR_SERVICE_ACCOUNT}})

    def create_runtime(self, doc: dict[str, Any], *, fit: bool = True) -> None:
        body = render.runtime(doc) if fit else doc
        self.custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", self.namespace,
                                                    "trainingruntimes", body)

    def start(self, runtime: str, *, env: dict[str, str] | None = None) -> None:
        req = request_mod.from_dict({
            "jobId": JOB_ID, "generation": GENERATION, "submission": SUBMISSION, "attempt": ATTEMPT,
            "command": COMMAND, "namespace": self.namespace,
            "runtimeRef": {"kind": "TrainingRuntime", "name": runtime},
            "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        })
        self.name = req.name
        started = adapter.start(self.client, trainjob=render.trainjob(req))
        assert started.created

    def pods(self) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_pod(self.namespace,
                                               label_selector=f"{names.JOBSET_NAME_LABEL}={self.name}")
        return [self.api.sanitize_for_serialization(p) for p in listed.items]

    def wait(self, what: str, predicate: Any, *, timeout: float = WAIT_SECONDS) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.stack.check_alive()
            value = predicate()
            if value:
                return value
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; pods: "
                             f"{[(p['metadata']['name'], p['status'].get('phase')) for p in self.pods()]}")

    def new_running_pods(self) -> list[dict[str, Any]]:
        """Wait for pods not seen before, all Running on kwok nodes."""
        def ready() -> list[dict[str, Any]] | None:
            fresh = [p for p in self.pods() if p["metadata"]["uid"] not in self.seen_pods
                     and not p["metadata"].get("deletionTimestamp")]
            if fresh and all(p["status"].get("phase") == "Running" for p in fresh):
                return fresh
            return None
        pods = self.wait("new Running pods", ready)
        for pod in pods:
            self.seen_pods.add(pod["metadata"]["uid"])
        return pods

    def run(self, pod: dict[str, Any]) -> execute.Execution:
        """Check the pod's identity inputs, run its container, end the pod with its exit code."""
        meta = pod["metadata"]
        assert names.ADMISSION_ANNOTATION in (meta.get("annotations") or {}), meta
        assert names.RESTART_LABEL in (meta.get("labels") or {}), meta
        init = [c["name"] for c in pod["spec"].get("initContainers") or []]
        assert names.SIDECAR_CONTAINER in init, init
        result = execute.run(pod, container_name="node")
        assert result.epoch is not None and result.attempt is not None, (result.stdout, result.stderr)
        a, j = meta["annotations"][names.ADMISSION_ANNOTATION], meta["labels"][names.RESTART_LABEL]
        assert result.attempt == f"{JOB_ID}.{SUBMISSION}.{ATTEMPT}.{a}.{j}"
        assert int(result.epoch) == GENERATION * 10**12 + SUBMISSION * 10**6 + int(a) + int(j)
        self.executions.append(result)
        return result

    def end(self, pod: dict[str, Any], exit_code: int) -> None:
        self.core.patch_namespaced_pod(pod["metadata"]["name"], self.namespace,
                                       {"metadata": {"annotations": {stack_mod.EXIT_CODE_ANNOTATION: str(exit_code)}}})

    def trainjob(self) -> dict[str, Any]:
        return self.client.get(kube.TRAINJOB, name=self.name, namespace=self.namespace)

    def jobset(self) -> dict[str, Any] | None:
        try:
            return self.client.get(kube.JOBSET, name=self.name, namespace=self.namespace)
        except kube.NotFound:
            return None

    def check_identities(self) -> None:
        epochs = [int(e.epoch or 0) for e in self.executions]
        assert epochs == sorted(set(epochs)), f"epochs not strictly increasing: {epochs}"
        tokens = [e.attempt for e in self.executions]
        assert len(set(tokens)) == len(tokens), f"attempt tokens repeat: {tokens}"


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[Scenario]:
    with stack.plane.api_client() as api:
        yield Scenario(stack, api, e2e_namespace)


def test_plain_mode_start_open_runs_pods_with_identity(scenario: Scenario) -> None:
    scenario.create_runtime(_runtime("plain"))
    scenario.start("plain")
    assert scenario.trainjob()["spec"]["suspend"] is True
    assert adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name).admission == 1

    pods = scenario.new_running_pods()
    for pod in pods:
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1"
        assert pod["metadata"]["labels"][names.RESTART_LABEL] == "0"
        assert pod["spec"]["nodeName"] in ("kwok-node-0", "kwok-node-1")
        result = scenario.run(pod)
        assert result.exit_code == 0, result.stderr
        assert result.epoch == str(GENERATION * 10**12 + SUBMISSION * 10**6 + 1)
        scenario.end(pod, result.exit_code)
    scenario.wait("the JobSet to complete", lambda: any(
        c["type"] == "Completed" and c["status"] == "True"
        for c in ((scenario.jobset() or {}).get("status") or {}).get("conditions") or []))
    scenario.check_identities()


def test_pod_failure_restarts_the_jobset_with_j_plus_one(scenario: Scenario) -> None:
    scenario.create_runtime(_runtime("restart"))
    scenario.start("restart", env={"FAIL_FIRST": "1"})
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)

    first = scenario.new_running_pods()
    for pod in first:
        result = scenario.run(pod)
        assert result.exit_code == 3  # the real container failed: J = 0
        scenario.end(pod, result.exit_code)
    scenario.wait("the JobSet restart", lambda: ((scenario.jobset() or {}).get("status") or {}).get("restarts") == 1)

    second = scenario.new_running_pods()
    for pod in second:
        assert pod["metadata"]["labels"][names.RESTART_LABEL] == "1"
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1"
        result = scenario.run(pod)
        assert result.exit_code == 0, result.stderr
        scenario.end(pod, result.exit_code)
    status = adapter.status(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert (status.admission, status.restarts, status.r) == (1, 1, 2)
    scenario.check_identities()


def test_hold_then_release_raises_admission(scenario: Scenario) -> None:
    scenario.create_runtime(_runtime("hold"))
    scenario.start("hold")
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)
    for pod in scenario.new_running_pods():
        scenario.run(pod)  # running; not ended: the hold stops it

    assert adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name) is True
    scenario.wait("the pods to go", lambda: not scenario.pods())
    assert adapter.release(scenario.client, namespace=scenario.namespace, name=scenario.name).admission == 2

    for pod in scenario.new_running_pods():
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "2"
        result = scenario.run(pod)
        assert result.exit_code == 0, result.stderr
        scenario.end(pod, 0)
    scenario.check_identities()


def test_runtime_that_breaks_the_requirements_is_refused_at_start(scenario: Scenario) -> None:
    bad = _runtime("bad")
    pod_spec = bad["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["restartPolicy"] = "OnFailure"
    scenario.create_runtime(bad, fit=False)
    with pytest.raises(adapter.AdapterError, match="restartPolicy") as refused:
        scenario.start("bad")
    assert "OnFailure" in str(refused.value)
    with pytest.raises(kube.NotFound):
        scenario.trainjob()
