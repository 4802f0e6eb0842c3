"""A researcher who uses the Kubeflow SDK, on the real controllers and the real node: the SDK's own
`TrainerClient().train(...)` makes the TrainJob, and the function it ships prints DISPATCH_EPOCH
and DISPATCH_ATTEMPT, read back through the SDK's own `get_job_logs`.

In a namespace labelled for identity (`names.IDENTITY_NAMESPACE_LABEL`) the release's admission
policy wraps the SDK's TrainJob at creation, and our controller (installed from the release, as
its pods) gives it its identity at its first admission through our AdmissionCheck: the function
prints an epoch above 0, the one `toolkit status` shows. Held and released the Kueue way, the new
execution prints a higher one; deleted with the SDK's `delete_job` and made again under its name
(the SDK's Name option), an epoch above every earlier one. In a namespace without the label the
same call runs as it does without dispatch: the TrainJob is the SDK's, our check approves it
without a raise, and the function finds DISPATCH_EPOCH unset and completes.

The SDK has a kubernetes client of its own (the `sdk_python` venv), so it runs as a process of
its own: DRIVER, written into the test's directory (the SDK ships a function's source, so it must
come from a file), one call of the SDK per run.

The runtime is the e2e runtime made fit by `render.runtime`, with what the SDK asks of a runtime:
the framework label, `mlPolicy` without torch or MPI (so the SDK runs its script with `python`)
and a container `node` whose working directory is writable (the SDK writes the script there). The
python sample image has `python3` but no `python`, which every Python image the SDK is used with
has; a ConfigMap mounted on the trainer's PATH gives it one (PYTHON_ALIAS).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from controller import admission
from devcluster import objects, scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, marks, names, paths, wrap

E2E_KUEUE = True  # our controller runs (with Kueue) in this module's stack

IMAGE = "localhost/dispatch/sample-trainer:python"
RUNTIME = "sdk-python"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"  # the SDK reads a runtime only with it
TOOLKIT = str(pathlib.Path(sys.executable).parent / "toolkit")
SDK_SECONDS = 120.0  # one run of the driver: the SDK's import, its calls and its own waits
STAY_SECONDS = 600  # how long the function stays once it has printed, in the labelled namespace
GRACE_SECONDS = 5  # the trainer pod's grace period: a hold stops it promptly whatever PID 1 does

# `python` on the trainer's PATH, for an image that has only `python3` (see the module docstring).
PYTHON_ALIAS = "python-alias"
ALIAS_DIR = "/opt/python-alias"
PATH = f"{ALIAS_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The researcher's script. The function is what the SDK ships: it runs alone in the container, so
# it imports what it uses, and the SDK puts its source in an unquoted heredoc (no dollar sign,
# backquote or backslash in it).
DRIVER = '''\
import json
import sys
import time

from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import CustomTrainer, TrainerClient
from kubeflow.trainer.options import Labels, Name


def report_identity():
    import os
    import signal
    import sys
    import time

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    print("DISPATCH_EPOCH=" + os.environ.get("DISPATCH_EPOCH", "unset"), flush=True)
    print("DISPATCH_ATTEMPT=" + os.environ.get("DISPATCH_ATTEMPT", "unset"), flush=True)
    for _ in range(int(os.environ["STAY_SECONDS"])):
        time.sleep(1)


def main(verb, namespace, kubeconfig, *rest):
    client = TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig))
    if verb == "train":
        runtime, queue, stay, name = rest
        options = [Labels({"kueue.x-k8s.io/queue-name": queue})] + ([Name(name)] if name else [])
        trainer = CustomTrainer(func=report_identity, num_nodes=1, resources_per_node={"cpu": "1"},
                                env={"STAY_SECONDS": stay})
        return {"name": client.train(runtime=runtime, trainer=trainer, options=options)}
    name = rest[0]
    if verb == "logs":  # until the function has printed its identity
        deadline = time.monotonic() + float(rest[1])
        while True:
            lines = list(client.get_job_logs(name, step="node-0", follow=False))
            if any(line.startswith("DISPATCH_ATTEMPT=") for line in lines) or time.monotonic() > deadline:
                return {"lines": lines}
            time.sleep(1)
    if verb == "wait":
        return {"status": client.wait_for_job_status(name, status={"Complete"}, timeout=int(rest[1])).status}
    if verb == "delete":
        client.delete_job(name)
        return {}
    raise SystemExit("unknown verb " + verb)


print(json.dumps(main(*sys.argv[1:])))
'''


class Sdk:
    """The researcher's SDK calls in NAMESPACE, each a run of DRIVER in the SDK's venv."""

    def __init__(self, *, python: str, driver: pathlib.Path, kubeconfig: pathlib.Path, namespace: str) -> None:
        self.python, self.driver, self.kubeconfig, self.namespace = python, driver, kubeconfig, namespace

    def _run(self, verb: str, *args: str) -> dict[str, Any]:
        done = subprocess.run([self.python, str(self.driver), verb, self.namespace, str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=SDK_SECONDS, check=False)
        assert done.returncode == 0, f"the SDK's {verb} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
        return dict(json.loads(done.stdout.splitlines()[-1]))

    def train(self, *, stay: int, name: str = "") -> str:
        """`TrainerClient().train(...)` with the queue label (and Name when NAME is given): the job's name."""
        return str(self._run("train", RUNTIME, "lq", str(stay), name)["name"])

    def identity(self, name: str) -> tuple[str, str]:
        """(DISPATCH_EPOCH, DISPATCH_ATTEMPT) as the function printed them, read by `get_job_logs`."""
        lines = self._run("logs", name, "90")["lines"]
        return flow.printed("\n".join(lines), "DISPATCH_EPOCH") or "", flow.printed("\n".join(lines), "DISPATCH_ATTEMPT") or ""

    def wait_complete(self, name: str) -> str:
        return str(self._run("wait", name, "90")["status"])

    def delete(self, name: str) -> None:
        self._run("delete", name)


@pytest.fixture
def sdk(sdk_python: str, stack: stack_mod.Stack, e2e_namespace: str, tmp_path: pathlib.Path) -> Sdk:
    driver = tmp_path / "notebook.py"
    driver.write_text(DRIVER)
    return Sdk(python=sdk_python, driver=driver, kubeconfig=stack.plane.kubeconfig, namespace=e2e_namespace)


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str, queues: str) -> Iterator[Scenario]:
    """The namespace's runtime (converted) and Kueue objects; the Scenario reads its pods."""
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, e2e_namespace)
        sc.client.create(paths.CONFIG_MAP, {"metadata": {"name": PYTHON_ALIAS}, "data": {
            "python": '#!/bin/sh\nexec python3 "$@"\n'}}, namespace=e2e_namespace)
        sc.create_runtime(sdk_runtime())
        yield sc


def sdk_runtime() -> dict[str, Any]:
    """The e2e runtime as the SDK needs it (see the module docstring), before `render.runtime`."""
    doc = flow.runtime(RUNTIME, cpu="1", image=IMAGE)
    doc["metadata"]["labels"] = {FRAMEWORK_LABEL: "python"}
    pod_spec = doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = GRACE_SECONDS
    pod_spec["volumes"] = [{"name": PYTHON_ALIAS, "configMap": {"name": PYTHON_ALIAS, "defaultMode": 0o755}}]
    [node] = pod_spec["containers"]
    node["workingDir"] = "/tmp"
    node["env"] = [{"name": "PATH", "value": PATH}]
    node["volumeMounts"] = [{"name": PYTHON_ALIAS, "mountPath": ALIAS_DIR}]
    return doc


def dry_run(sc: Scenario) -> dict[str, Any]:
    """A TrainJob on the runtime created with dryRun (every admission step runs, nothing is
    stored), asked again while Trainer's or Kueue's webhook has not seen the runtime yet."""
    body = {"apiVersion": paths.TRAINJOB.api_version, "kind": "TrainJob", "metadata": {"name": "probe"},
            "spec": {"runtimeRef": {"name": RUNTIME, "kind": "TrainingRuntime"}, "trainer": {"command": ["true"]}}}
    made: dict[str, Any] = objects.once_the_runtime_is_seen(lambda: sc.client.request(
        "POST", paths.TRAINJOB.path(namespace=sc.namespace), query={"dryRun": "All"}, body=body))
    return made


def status(sc: Scenario, name: str) -> dict[str, Any]:
    """`toolkit status NAME -o json`, as the researcher runs it."""
    done = subprocess.run([TOOLKIT, "status", name, "-n", sc.namespace, "--kubeconfig", str(sc.stack.plane.kubeconfig),
                           "-o", "json"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def running(sc: Scenario) -> list[dict[str, Any]]:
    """The TrainJob's new pods once their trainer has started (`Scenario.new_pods`)."""
    pods = sc.new_pods()
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods


def check_identity(sc: Scenario, sdk: Sdk, name: str) -> tuple[int, str]:
    """The identity the function printed: an epoch above 0 and a token, both as `toolkit status`
    shows them for the running execution, the token under the job id the TrainJob was given."""
    epoch, attempt = sdk.identity(name)
    assert epoch.isdigit() and int(epoch) > 0, (epoch, attempt)
    shown = status(sc, name)
    assert (shown["state"], shown["execution"]) == ("running", "current"), shown
    assert (shown["epoch"], shown["attempt"]) == (epoch, attempt), shown
    job_id = sc.trainjob()["metadata"]["annotations"][names.JOB_ID_ANNOTATION]
    assert attempt.startswith(f"{job_id}."), (attempt, job_id)
    return int(epoch), attempt


def hold(sc: Scenario) -> None:
    """Hold the Kueue way (`adapter.hold`: the Workload's spec.active false) and wait until Kueue
    has suspended the TrainJob and its pods are gone."""
    assert adapter.hold(sc.client, namespace=sc.namespace, name=sc.name)
    sc.wait("Kueue to suspend the held TrainJob", lambda: sc.trainjob()["spec"].get("suspend") is True)
    sc.wait("the held execution's pods to go", lambda: not sc.pods())


def test_an_sdk_trainjob_prints_its_epoch_higher_after_a_hold_and_above_all_when_made_again(
        scenario: Scenario, sdk: Sdk) -> None:
    sc = scenario
    sc.core.patch_namespace(sc.namespace, {"metadata": {"labels": {
        names.IDENTITY_NAMESPACE_LABEL: names.IDENTITY_NAMESPACE_VALUE}}})
    # The release's policy wraps what is created here once the apiserver sees the label.
    sc.wait("the identity policy in effect in the labelled namespace", lambda: names.DERIVED_ANNOTATION in (
        dry_run(sc)["metadata"].get("annotations") or {}))

    sc.name = sdk.train(stay=STAY_SECONDS)
    made = sc.trainjob()
    trainer = made["spec"]["trainer"]
    assert trainer["command"] == wrap.command(), trainer  # the prologue runs the SDK's command
    assert trainer["args"][:2] == ["bash", "-c"] and "report_identity()" in trainer["args"][2], trainer
    assert made["metadata"]["annotations"][names.DERIVED_ANNOTATION] == "admission-policy"
    running(sc)
    first, first_attempt = check_identity(sc, sdk, sc.name)
    generation = int(sc.trainjob()["metadata"]["annotations"][names.GENERATION_ANNOTATION])
    assert first // 10**12 == generation >= 1

    # Preempted the Kueue way and admitted again: our check raises A, and the new pod prints more.
    hold(sc)
    assert adapter.release(sc.client, namespace=sc.namespace, name=sc.name).requeued
    running(sc)
    second, second_attempt = check_identity(sc, sdk, sc.name)
    assert second > first and second_attempt != first_attempt

    # Deleted with the SDK and made again under its name: a new generation, above every epoch.
    sdk.delete(sc.name)
    sc.wait("the TrainJob and its pods gone", lambda: not sc.pods() and not any(
        t["metadata"]["name"] == sc.name for t in sc.client.list(paths.TRAINJOB, namespace=sc.namespace)[0]))
    assert sdk.train(stay=STAY_SECONDS, name=sc.name) == sc.name
    running(sc)
    third, third_attempt = check_identity(sc, sdk, sc.name)
    assert third > max(first, second), (first, second, third)
    assert third_attempt not in (first_attempt, second_attempt)
    assert int(sc.trainjob()["metadata"]["annotations"][names.GENERATION_ANNOTATION]) > generation
    assert sc.foreign() is None


def test_without_the_label_the_sdk_trainjob_runs_as_it_does_without_dispatch(
        scenario: Scenario, sdk: Sdk, queues: str) -> None:
    sc = scenario
    assert names.DERIVED_ANNOTATION not in (dry_run(sc)["metadata"].get("annotations") or {})

    sc.name = sdk.train(stay=0)
    made = sc.trainjob()
    assert not [k for k in made["metadata"].get("annotations") or {} if k.startswith(names.DOMAIN)], made["metadata"]
    trainer = made["spec"]["trainer"]
    assert trainer["command"][:2] == ["bash", "-c"] and "report_identity()" in trainer["command"][2], trainer
    assert "args" not in trainer and not marks.has_our_patch(made), made["spec"]  # Kueue's own patch only
    assert [e["name"] for e in trainer["env"]] == ["STAY_SECONDS"]

    assert sdk.wait_complete(sc.name) == "Complete"
    assert sdk.identity(sc.name) == ("unset", "unset")
    [entry] = [e for e in (sc.workload().get("status") or {}).get("admissionChecks") or [] if e["name"] == f"ac-{queues}"]
    assert entry["state"] == "Ready" and entry["message"] == admission.UNTOUCHED, entry
    # The converted runtime's sidecar still checks the pod: it finds no admission of ours and says so
    # in one Warning Event, without holding the trainer back; our controller flags nothing.
    [violation] = sc.events(names.SIDECAR_VIOLATION_REASON)
    assert violation["message"].startswith("missing-admission: pod "), violation["message"]
    assert sc.foreign() is None
    assert sc.events(names.FOREIGN_REASON) == []
    assert not [k for k in sc.trainjob()["metadata"].get("annotations") or {} if k.startswith(names.DOMAIN)]
