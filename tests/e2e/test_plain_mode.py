"""End to end in plain mode, on the real Trainer and JobSet controllers and
the real node (devcluster/local.py): the toolkit starts and opens a TrainJob,
Trainer builds the JobSet, JobSet the Jobs, the job controller the pods, the
scheduler places them on the node, and the kubelet runs them: the sidecar
verifier first (a native sidecar; the trainer starts once its first check has
run), then the trainer container through the prologue. The identity each
execution printed is read from its log, its exit code from the pod's status.

What every scenario checks: each pod carries our admission annotation and
JobSet's restart-attempt label, and the sidecar; every execution printed a
DISPATCH_EPOCH and DISPATCH_ATTEMPT; across the scenario the epochs strictly
increase and the attempt tokens are distinct.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from devcluster import node, scenario as flow, stack as stack_mod
from devcluster.scenario import GENERATION, SUBMISSION, Scenario
from toolkit import adapter, kube, names


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[Scenario]:
    with stack.plane.api_client() as api:
        yield Scenario(stack, api, e2e_namespace)


def test_plain_mode_start_open_runs_pods_with_identity(scenario: Scenario) -> None:
    scenario.create_runtime(flow.runtime("plain"))
    scenario.start("plain")
    assert scenario.trainjob()["spec"]["suspend"] is True
    assert adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name).admission == 1

    pods = scenario.new_pods()
    for pod in pods:
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1"
        assert pod["metadata"]["labels"][names.RESTART_LABEL] == "0"
        assert pod["spec"]["nodeName"] == node.NODE_NAME
        result = scenario.run(pod, until_exit=True)
        assert result.exit_code == 0, result.log
        assert result.epoch == str(GENERATION * 10**12 + SUBMISSION * 10**6 + 1)
    scenario.wait("the JobSet to complete", lambda: any(
        c["type"] == "Completed" and c["status"] == "True"
        for c in ((scenario.jobset() or {}).get("status") or {}).get("conditions") or []))
    scenario.check_identities()


def test_pod_failure_restarts_the_jobset_with_j_plus_one(scenario: Scenario, tmp_path: pathlib.Path) -> None:
    scenario.create_runtime(flow.runtime("restart", host_dirs={flow.MARKS: tmp_path}))
    scenario.start("restart", env={"FAIL_FIRST": f"{flow.MARKS}/failed"})
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)

    first = scenario.new_pods()
    for pod in first:
        result = scenario.run(pod, until_exit=True)
        assert result.exit_code == 3  # the real container failed: J = 0
    scenario.wait("the JobSet restart", lambda: adapter.restarts_of(scenario.jobset()) == 1)

    second = scenario.new_pods()
    for pod in second:
        assert pod["metadata"]["labels"][names.RESTART_LABEL] == "1"
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1"
        result = scenario.run(pod, until_exit=True)
        assert result.exit_code == 0, result.log
    status = adapter.status(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert (status.admission, status.restarts, status.r) == (1, 1, 2)
    scenario.check_identities()


def test_hold_then_release_raises_admission(scenario: Scenario) -> None:
    scenario.create_runtime(flow.runtime("hold"))
    scenario.start("hold", env={"STAY": "1"})
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)
    for pod in scenario.new_pods():
        assert scenario.run(pod).exit_code is None  # still running: the hold stops it

    assert adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name) is True
    scenario.wait("the pods to go", lambda: not scenario.pods())
    assert adapter.release(scenario.client, namespace=scenario.namespace, name=scenario.name).admission == 2

    for pod in scenario.new_pods():
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "2"
        scenario.run(pod)
    scenario.check_identities()


def test_runtime_that_breaks_the_requirements_is_refused_at_start(scenario: Scenario) -> None:
    bad = flow.runtime("bad")
    pod_spec = bad["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["restartPolicy"] = "OnFailure"
    scenario.create_runtime(bad, fit=False)
    with pytest.raises(adapter.AdapterError, match="restartPolicy") as refused:
        scenario.start("bad")
    assert "OnFailure" in str(refused.value)
    with pytest.raises(kube.NotFound):
        scenario.trainjob()
