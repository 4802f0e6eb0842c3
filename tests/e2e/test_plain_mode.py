"""End to end in plain mode, on the real Trainer and JobSet controllers and
kwok (devcluster/stack.py): the toolkit starts and opens a TrainJob, Trainer
builds the JobSet, JobSet the Jobs, the job controller the pods, the
scheduler places them on kwok's nodes and kwok runs them; the test then runs
each pod's real container with podman (devcluster/execute.py) and ends the pod
with that container's exit code.

What every scenario checks: each pod carries our admission annotation and
JobSet's restart-attempt label, and the sidecar; every execution printed a
DISPATCH_EPOCH and DISPATCH_ATTEMPT; across the scenario the epochs strictly
increase and the attempt tokens are distinct.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import scenario as flow, stack as stack_mod
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
    scenario.create_runtime(flow.runtime("restart"))
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
    scenario.create_runtime(flow.runtime("hold"))
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
    bad = flow.runtime("bad")
    pod_spec = bad["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["restartPolicy"] = "OnFailure"
    scenario.create_runtime(bad, fit=False)
    with pytest.raises(adapter.AdapterError, match="restartPolicy") as refused:
        scenario.start("bad")
    assert "OnFailure" in str(refused.value)
    with pytest.raises(kube.NotFound):
        scenario.trainjob()
