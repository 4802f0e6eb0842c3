"""`toolkit start` against the real apiserver: the runtime is checked on the
cluster, the TrainJob is created suspended with A = 0, and a second start
changes nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

from toolkit import cli, kube, paths, raising, render, runtime_check

pytestmark = pytest.mark.cluster


def _runtime(name: str, *, restart_policy: str | None) -> dict:
    pod_spec: dict = {"containers": [{"name": "node", "image": "busybox"}]}
    doc = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "replicas": 1, "template": {"metadata": {"labels": runtime_check.TRAINER_STEP_LABELS},
                                                         "spec": {"template": {"spec": pod_spec}}}}
        ]}}},
    }
    if restart_policy is not None:
        doc = render.runtime(doc, sidecar_image="sidecar:test")
    return doc


def _request(tmp_path, *, namespace: str, runtime: str) -> str:
    path = tmp_path / "req.json"
    path.write_text(json.dumps({
        "jobId": f"job.{uuid.uuid4().hex[:6]}", "generation": 1, "submission": 2, "attempt": 0,
        "command": ["python", "train.py"], "namespace": namespace,
        "runtimeRef": {"kind": "ClusterTrainingRuntime", "name": runtime},
    }))
    return str(path)


def test_start_creates_suspended_with_a_zero_and_a_second_start_changes_nothing(control_plane, api_client, namespace, tmp_path):
    admin = kube.from_api_client(api_client)
    rt = f"rt-{uuid.uuid4().hex[:6]}"
    admin.create(paths.CLUSTER_TRAINING_RUNTIME, _runtime(rt, restart_policy="Never"))
    req = _request(tmp_path, namespace=namespace, runtime=rt)
    runner = CliRunner()
    env = {"KUBECONFIG": control_plane.kubeconfig}
    first = runner.invoke(cli.root, ["start", req], env=env, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "created" in first.output
    items, _ = admin.list(paths.TRAINJOB, namespace=namespace)
    assert len(items) == 1
    tj = items[0]
    assert tj["spec"]["suspend"] is True and raising.patch_admission(tj) == 0
    second = runner.invoke(cli.root, ["start", req], env=env, catch_exceptions=False)
    assert second.exit_code == 0 and "exists, unchanged" in second.output
    again = admin.get(paths.TRAINJOB, name=tj["metadata"]["name"], namespace=namespace)
    assert again["metadata"]["resourceVersion"] == tj["metadata"]["resourceVersion"]
    status = runner.invoke(cli.root, ["status", "-n", namespace, "-o", "json", tj["metadata"]["name"]], env=env)
    assert status.exit_code == 0
    assert json.loads(status.output)["r"] == 1 and json.loads(status.output)["epoch"] == "1000002000001"


def test_start_refuses_a_runtime_that_restarts_in_place(control_plane, api_client, namespace, tmp_path):
    admin = kube.from_api_client(api_client)
    rt = f"rt-{uuid.uuid4().hex[:6]}"
    admin.create(paths.CLUSTER_TRAINING_RUNTIME, _runtime(rt, restart_policy=None))
    result = CliRunner().invoke(cli.root, ["start", _request(tmp_path, namespace=namespace, runtime=rt)],
                                env={"KUBECONFIG": control_plane.kubeconfig})
    assert result.exit_code == 1
    assert "restartPolicy" in result.output
    assert admin.list(paths.TRAINJOB, namespace=namespace)[0] == []
