"""The admission policy `dispatch-identity`, as the release renders it (the prologue written into its
parameter), in the real apiserver: a TrainJob made without dispatch's marks in a namespace that opts
in is wrapped at creation exactly as `toolkit start` wraps a command; one that cannot be wrapped is
marked with the reason, naming the field, and left as it was; a namespace without the label, and a
TrainJob `toolkit start` made, see nothing.

The policy is cluster-wide but bound to labelled namespaces only: the session plane's other suites
never see it. It is removed when the module ends."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import harness, local
from tests.adapter import kit, policy
from release import bundle
from toolkit import adapter, derive, kube, names, paths, raising, render, request, wrap

pytestmark = pytest.mark.cluster

SDK_COMMAND = ["bash", "-c", "read -r -d '' SCRIPT << EOM\ndef train():\n    print('hi')\ntrain()\nEOM\n"
               "printf \"%s\" \"$SCRIPT\" > \"train.py\"\npython \"train.py\""]


@pytest.fixture(scope="module")
def admin(control_plane: harness.ControlPlane | harness.ExistingCluster) -> Iterator[kube.Client]:
    with control_plane.api_client() as api, policy.installed(api) as client:
        yield client


@pytest.fixture
def opted_in(control_plane: harness.ControlPlane | harness.ExistingCluster, admin: kube.Client) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with control_plane.api_client() as api:
        harness.create_namespace(api, name, labels={**policy.OPTED_IN, "dispatch.phpboyscout.uk/test": "true"})
        try:
            yield name
        finally:
            admin.delete(policy.NAMESPACE, name=name)


def trainjob(name: str, *, trainer: dict[str, Any] | None, queue: bool = True) -> dict[str, Any]:
    """A TrainJob as the Kubeflow SDK posts it (no marks of ours, no suspend)."""
    spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"}}
    if trainer is not None:
        spec["trainer"] = trainer
    metadata: dict[str, Any] = {"name": name}
    if queue:
        metadata["labels"] = {names.KUEUE_QUEUE_LABEL: "training"}
    return {"metadata": metadata, "spec": spec}


def create(client: kube.Client, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    return client.create(paths.TRAINJOB, obj, namespace=namespace)


def test_an_sdk_trainjob_is_wrapped_as_toolkit_start_wraps_a_command(admin: kube.Client, opted_in: str) -> None:
    made = create(admin, opted_in, trainjob("sdk", trainer={"command": SDK_COMMAND, "args": ["--epochs", "3"],
                                                             "env": [{"name": "HF_HOME", "value": "/cache"}],
                                                             "numNodes": 1}))
    trainer = made["spec"]["trainer"]
    assert trainer["command"] == wrap.command()  # the prologue byte for byte, as `toolkit wrap` prints it
    assert trainer["args"] == [*SDK_COMMAND, "--epochs", "3"]
    assert trainer["env"][0] == {"name": "HF_HOME", "value": "/cache"}
    assert [e["name"] for e in trainer["env"][1:]] == [names.ENV_ADMISSION, names.ENV_RESTART, names.ENV_EPOCH_PREFIX,
                                                       names.ENV_TOKEN_PREFIX]
    # A and J as `toolkit start` passes them; the prefixes from the pod annotations the check writes.
    assert trainer["env"][1:3] == wrap.dispatch_env(epoch_prefix="", token_prefix="x")[:2]
    assert [e["valueFrom"]["fieldRef"]["fieldPath"] for e in trainer["env"][3:]] == [
        f"metadata.annotations['{names.EPOCH_PREFIX_ANNOTATION}']", f"metadata.annotations['{names.TOKEN_PREFIX_ANNOTATION}']"]
    assert made["spec"]["runtimePatches"] == [raising.patch_entry(0)]
    assert made["metadata"]["annotations"] == {names.DERIVED_ANNOTATION: "admission-policy"}
    assert made["spec"].get("suspend") in (None, False)  # queued: Kueue suspends it, not us
    assert raising.patch_admission(made) == 0


def test_not_queued_it_is_created_suspended(admin: kube.Client, opted_in: str) -> None:
    made = create(admin, opted_in, trainjob("plain", trainer={"command": ["python", "train.py"]}, queue=False))
    assert made["spec"]["suspend"] is True
    assert made["spec"]["trainer"]["args"] == ["python", "train.py"]


@pytest.mark.parametrize(("trainer", "field"), [
    (None, "spec.trainer.command: not set"),
    ({"numNodes": 1}, "spec.trainer.command: not set"),
    ({"command": ["tune", "run"], "args": ["full_finetune"]}, "spec.trainer.command: [tune, run] selects a Trainer built-in"),
    ({"command": ["-c", "x"]}, "spec.trainer.command[0]: starts with '-'"),
    ({"command": [""]}, "spec.trainer.command[0]: empty"),
    ({"command": ["python"], "env": [{"name": "DISPATCH_EPOCH", "value": "9"}]}, "spec.trainer.env: names starting DISPATCH_"),
    ({"command": wrap.command(), "args": ["python"]}, "spec.trainer.command: already runs the dispatch prologue"),
])
def test_what_cannot_be_wrapped_is_marked_with_the_field_and_left_as_it_was(
        admin: kube.Client, opted_in: str, trainer: dict[str, Any] | None, field: str) -> None:
    made = create(admin, opted_in, trainjob(f"r-{uuid.uuid4().hex[:6]}", trainer=trainer))
    assert set(made["metadata"]["annotations"]) == {names.REFUSED_ANNOTATION}
    assert made["metadata"]["annotations"][names.REFUSED_ANNOTATION].startswith(field)
    assert "runtimePatches" not in made["spec"]
    assert made["spec"].get("trainer") == trainer


def test_a_namespace_without_the_label_and_a_started_trainjob_see_nothing(admin: kube.Client, opted_in: str,
                                                                          namespace: str) -> None:
    sent = trainjob("sdk", trainer={"command": SDK_COMMAND})
    made = create(admin, namespace, sent)
    assert made["spec"]["trainer"] == sent["spec"]["trainer"] and "annotations" not in made["metadata"]
    req = request.from_dict({"jobId": "job.1", "generation": 1, "submission": 2, "attempt": 0, "namespace": opted_in,
                         "command": ["python", "train.py"], "mode": "kueue", "queueName": "training",
                         "runtimeRef": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"}})
    started = render.trainjob(req)
    made = create(admin, opted_in, {k: v for k, v in started.items() if k not in ("apiVersion", "kind")})
    assert made["spec"]["trainer"] == started["spec"]["trainer"]
    assert made["metadata"]["annotations"] == started["metadata"]["annotations"]


def test_without_its_parameter_nothing_is_created_unwrapped(admin: kube.Client, opted_in: str) -> None:
    saved = admin.get(paths.CONFIG_MAP, name="dispatch-identity", namespace=policy.HOME)
    admin.delete(paths.CONFIG_MAP, name="dispatch-identity", namespace=policy.HOME)
    try:
        with pytest.raises(kube.ApiError) as refused:
            create(admin, opted_in, trainjob("no-param", trainer={"command": ["python", "train.py"]}))
        assert "dispatch-identity" in str(refused.value)
    finally:
        admin.create(paths.CONFIG_MAP, {"metadata": {"name": "dispatch-identity"}, "data": saved["data"]},
                     namespace=policy.HOME)


def test_the_unrendered_parameter_fails_closed() -> None:
    # The kustomize base's placeholder, run where the prologue would run: nothing of the command runs.
    (param,) = [d for d in bundle.kustomize_build("controller", kustomize=local.kustomize())
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "dispatch-identity"]
    assert param["data"]["prologue"] != policy.rendered()["ConfigMap"]["data"]["prologue"]
    done = subprocess.run(["/bin/sh", "-c", param["data"]["prologue"], "dispatch-prologue", "echo", "ran"],
                          capture_output=True, text=True, timeout=10)
    assert (done.returncode, done.stdout) == (125, "")
    assert done.stderr.startswith("dispatch: the prologue was not rendered") and done.stderr.count("\n") == 1


def test_plain_mode_open_gives_it_its_identity_and_refuses_what_was_not_wrapped(admin: kube.Client,
                                                                                opted_in: str) -> None:
    kit.ensure_runtime(admin, opted_in)
    runtime = {"name": kit.RUNTIME, "kind": "TrainingRuntime"}
    made = create(admin, opted_in, {"metadata": {"name": "plain"}, "spec": {
        "runtimeRef": runtime, "trainer": {"command": ["python", "train.py"]}}})
    assert made["spec"]["suspend"] is True and derive.needs_identity(made)
    raised = adapter.open_(admin, namespace=opted_in, name="plain", counter_namespace=opted_in)
    opened = admin.get(paths.TRAINJOB, name="plain", namespace=opted_in)
    assert raised.admission == 1 and opened["spec"]["suspend"] is False
    assert opened["metadata"]["annotations"][names.JOB_ID_ANNOTATION] == f"{opted_in}.plain.1"
    assert derive.pod_annotation(opened, names.EPOCH_PREFIX_ANNOTATION) == "1000000"
    counter = admin.get(paths.CONFIG_MAP, name=names.GENERATIONS_CONFIGMAP, namespace=opted_in)
    assert counter["data"] == {opted_in: "1"}

    create(admin, opted_in, {"metadata": {"name": "tune"}, "spec": {
        "runtimeRef": runtime, "trainer": {"command": ["tune", "run"]}}})
    with pytest.raises(adapter.AdapterError) as refused:
        adapter.open_(admin, namespace=opted_in, name="tune", counter_namespace=opted_in)
    assert str(refused.value).startswith(
        f"TrainJob {opted_in}/tune: not wrapped at creation: spec.trainer.command: [tune, run] selects")
    assert admin.get(paths.TRAINJOB, name="tune", namespace=opted_in)["spec"]["suspend"] is True
