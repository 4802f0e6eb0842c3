"""The hazard the runtime rule exists for (docs/toolkit.md), on the real kubelet.

A runtime whose trainer pods say `restartPolicy: OnFailure`, created directly (check-runtime,
which the adapter runs before it creates a TrainJob, refuses it; nothing else stops it): when the
trainer exits non-zero the kubelet restarts the container in place, in the same pod, with the same
annotation and the same restart label, so the second execution prints the very DISPATCH_EPOCH the
first printed: two executions share an identity, and a late save of the first cannot be refused.

The same TrainJob under the same runtime made fit by `render.runtime` (restartPolicy Never,
backoffLimit 0): the failure ends the pod, JobSet restarts, and the new pod's restart label gives
a new epoch.

Both TrainJobs run the same command: print the environment, then fail once (the first execution
to make a directory on a hostPath every execution shares exits 3 after a moment, time enough to
read its log before JobSet deletes its pod), else wait for the test's go (a file there) and
succeed. Each execution's epoch is read from its container's log through pods/log: the current
run and, for a restart in place, `previous=True`, while the second run still runs (once the pod
has ended, the kubelet's container garbage collection keeps one dead container per name, so the
first run's log goes).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from devcluster import local, stack as stack_mod
from tests.node import kit
from toolkit import adapter, kube, names, render
from toolkit import request as request_mod

pytestmark = pytest.mark.cluster

GENERATION, SUBMISSION, ATTEMPT = 3, 7, 1
BASE = GENERATION * 10**12 + SUBMISSION * 10**6
MARKS = "/marks"
COMMAND = ["/bin/sh", "-c", f'env; if mkdir {MARKS}/first 2>/dev/null; then sleep 2; exit 3; fi; '
           f'while [ ! -e {MARKS}/go ]; do sleep 1; done']
TRAINER = "node"  # Trainer's name for the trainer container of the `node` replicated job


@pytest.fixture(scope="module")
def api(trainer_cluster: stack_mod.Stack) -> Iterator[kubernetes.client.ApiClient]:
    with trainer_cluster.plane.api_client() as client:
        yield client


def runtime_doc(name: str, marks: pathlib.Path) -> dict[str, Any]:
    """A TrainingRuntime as a user writes it: neither restartPolicy nor backoffLimit stated."""
    return {
        "apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {"spec": {
                "failurePolicy": {"maxRestarts": 2},
                "replicatedJobs": [{
                    "name": names.TRAINER_REPLICATED_JOB,
                    "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"template": {"spec": {
                            "containers": [{"name": TRAINER, "image": kit.BUSYBOX,
                                            "volumeMounts": [{"name": "marks", "mountPath": MARKS}]}],
                            "volumes": [{"name": "marks",
                                         "hostPath": {"path": str(marks), "type": "Directory"}}],
                        }}},
                    },
                }],
            }},
        },
    }


def trainjob(namespace: str, runtime: str) -> dict[str, Any]:
    req = request_mod.from_dict({
        "jobId": f"node.{runtime}", "generation": GENERATION, "submission": SUBMISSION, "attempt": ATTEMPT,
        "command": COMMAND, "namespace": namespace,
        "runtimeRef": {"kind": "TrainingRuntime", "name": runtime},
    })
    return render.trainjob(req)


def create_runtime(api: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.TRAINER_GROUP, names.TRAINER_VERSION, namespace, "trainingruntimes", body)


def printed(log: str, key: str) -> str | None:
    return next((line.split("=", 1)[1] for line in log.splitlines() if line.startswith(key + "=")), None)


def pods(core: kubernetes.client.CoreV1Api, namespace: str, trainjob_name: str) -> list[dict[str, Any]]:
    listed = core.list_namespaced_pod(namespace, label_selector=f"{names.JOBSET_NAME_LABEL}={trainjob_name}")
    return [dict(core.api_client.sanitize_for_serialization(p)) for p in listed.items]


def test_a_restart_in_place_prints_the_same_epoch_twice(api: kubernetes.client.ApiClient,
                                                        tmp_path: pathlib.Path) -> None:
    core = kubernetes.client.CoreV1Api(api)
    client = kube.from_api_client(api)
    namespace = kit.new_namespace(api)
    doc = runtime_doc("in-place", tmp_path)
    rjob = doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    rjob["backoffLimit"] = 3
    rjob["template"]["spec"]["restartPolicy"] = "OnFailure"
    create_runtime(api, namespace, doc)
    job = trainjob(namespace, "in-place")
    name = job["metadata"]["name"]
    with pytest.raises(adapter.AdapterError, match="restartPolicy"):
        adapter.start(client, trainjob=job)  # what the adapter would have said; created directly instead
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.TRAINER_GROUP, names.TRAINER_VERSION, namespace, "trainjobs", job)
    with pytest.raises(adapter.AdapterError, match="restartPolicy"):
        adapter.open_(client, namespace=namespace, name=name)  # open checks the runtime again, and refuses
    # What an operator bypassing the adapter would do: raise A and unsuspend in one update.
    assert adapter.raise_admission(client, namespace=namespace, name=name, unsuspend=True).admission == 1

    def restarted() -> dict[str, Any] | None:
        found = pods(core, namespace, name)
        return next((p for p in found if kit.container_status(p, TRAINER).get("restartCount") == 1
                     and "running" in kit.container_status(p, TRAINER)["state"]), None)
    pod = kit.wait("the trainer container to run again after failing", restarted)
    status = kit.container_status(pod, TRAINER)
    assert status["lastState"]["terminated"]["exitCode"] == 3, status
    first = kit.log(core, namespace, pod["metadata"]["name"], TRAINER, previous=True)
    second = kit.wait("the second run's identity in its log",
                      lambda: (text := kit.log(core, namespace, pod["metadata"]["name"], TRAINER))
                      and printed(text, "DISPATCH_EPOCH") and text)
    (tmp_path / "go").mkdir()
    done = kit.finished(core, namespace, pod["metadata"]["name"])
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert kit.container_status(done, TRAINER)["restartCount"] == 1
    assert len(pods(core, namespace, name)) == 1  # no second pod: the same pod ran twice
    assert printed(first, "HOSTNAME") == printed(second, "HOSTNAME")  # one pod, its container run twice
    assert printed(first, "DISPATCH_EPOCH") == printed(second, "DISPATCH_EPOCH") == str(BASE + 1)
    assert printed(first, "DISPATCH_ATTEMPT") == printed(second, "DISPATCH_ATTEMPT") == "node.in-place.7.1.1.0"


def test_the_checked_runtime_restarts_through_jobset_with_a_new_epoch(api: kubernetes.client.ApiClient,
                                                                      tmp_path: pathlib.Path) -> None:
    core = kubernetes.client.CoreV1Api(api)
    client = kube.from_api_client(api)
    namespace = kit.new_namespace(api)
    kit.sidecar_rbac(api, namespace)  # render.runtime runs the pods as the sidecar's ServiceAccount
    create_runtime(api, namespace, render.runtime(runtime_doc("checked", tmp_path), sidecar_image=local.SIDECAR_IMAGE))
    job = trainjob(namespace, "checked")
    name = job["metadata"]["name"]
    assert adapter.start(client, trainjob=job).created
    assert adapter.open_(client, namespace=namespace, name=name).admission == 1

    # Each pod's log, read while the pod exists (JobSet deletes the failed execution's pod).
    seen: dict[str, tuple[dict[str, Any], str]] = {}

    def both_ran() -> bool:
        for pod in pods(core, namespace, name):
            if not kit.container_status(pod, TRAINER).get("state", {}).keys() & {"running", "terminated"}:
                continue
            try:
                text = kit.log(core, namespace, pod["metadata"]["name"], TRAINER)
            except kubernetes.client.ApiException:
                continue  # gone between the list and the read
            if printed(text, "DISPATCH_EPOCH"):
                seen[pod["metadata"]["uid"]] = (pod, text)
        return len(seen) == 2
    try:
        kit.wait("a failed execution, then one after the JobSet restart", both_ran, timeout=120)
    except AssertionError as e:
        raise AssertionError(f"{e}; pods: {kit.describe(core, namespace)}") from None
    (tmp_path / "go").mkdir()
    last = max(seen.values(), key=lambda run: int(run[0]["metadata"]["labels"][names.RESTART_LABEL]))
    assert kit.finished(core, namespace, last[0]["metadata"]["name"])["status"]["phase"] == "Succeeded"
    runs = sorted(seen.values(), key=lambda run: int(run[0]["metadata"]["labels"][names.RESTART_LABEL]))
    assert [r[0]["metadata"]["labels"][names.RESTART_LABEL] for r in runs] == ["0", "1"]
    assert all(kit.container_status(p, TRAINER).get("restartCount", 0) == 0 for p, _ in runs)
    assert [printed(text, "DISPATCH_EPOCH") for _, text in runs] == [str(BASE + 1), str(BASE + 2)]
    assert [printed(text, "DISPATCH_ATTEMPT") for _, text in runs] == ["node.checked.7.1.1.0", "node.checked.7.1.1.1"]
