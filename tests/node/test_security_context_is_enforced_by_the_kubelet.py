"""securityContext on the real kubelet: what it refuses, and what the shipped pods run with.

`runAsNonRoot` on an image whose user is root is refused by the kubelet before the container is
created (CreateContainerConfigError, naming runAsNonRoot): containerd never gets a task for it.

The shipped pods run non-root, without new privileges, with no capability and with the runtime's
default seccomp profile. Shown from the running processes, not from the spec we wrote: the rendered
sidecar (render.runtime's pod template, as every training pod gets it) through the kernel's
/proc/<pid>/status of its container's process on the host (containerd's task list gives the PID);
the driver Job (dispatcher/jobspec.py, as the dispatcher creates it, with its token Secret) through
its container printing its own /proc/1/status into its log (its command replaced by that print;
its securityContext, image and ServiceAccount are the shipped ones).
Seccomp 2 is filter mode (a profile is loaded); 0 would mean unconfined.

The group: the kubelet hands the runtime the image's uid only, so a container whose pod states no
runAsGroup runs in group 0 whatever the image's USER says. The rendered sidecar states its group
and is held to it; the driver Job states the group `TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP` names, and
is held to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from devcluster import local, stack as stack_mod
from dispatcher import backend, jobspec, settings
from tests.node import kit
from toolkit import names, render, runtime_check

pytestmark = pytest.mark.cluster

NON_ROOT_UID = "65532"  # USER of the sidecar and sample-trainer images (images/*.Containerfile)
NO_CAPABILITIES = "0000000000000000"


@pytest.fixture(scope="module")
def api(node_cluster: stack_mod.Stack) -> Iterator[kubernetes.client.ApiClient]:
    with node_cluster.plane.api_client() as client:
        yield client


def confined(status: dict[str, str]) -> None:
    assert status["Uid"].split() == [NON_ROOT_UID] * 4, status["Uid"]
    assert status["Seccomp"] == "2", status.get("Seccomp")
    assert status["NoNewPrivs"] == "1", status.get("NoNewPrivs")
    assert status["CapEff"] == status["CapPrm"] == NO_CAPABILITIES, (status["CapEff"], status["CapPrm"])


def test_run_as_non_root_on_a_root_image_is_refused_by_the_kubelet(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    namespace = kit.new_namespace(api)
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "root-image"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": kit.BUSYBOX, "imagePullPolicy": "Never", "command": ["true"],
            "securityContext": {"runAsNonRoot": True}}]},
    })

    def refused() -> dict[str, Any] | None:
        waiting = kit.container_status(kit.pod(core, namespace, "root-image"), "main").get("state", {}).get("waiting")
        return waiting if waiting and waiting.get("reason") == "CreateContainerConfigError" else None
    waiting = kit.wait("the kubelet to refuse the container", refused)
    assert "runAsNonRoot" in waiting["message"] and "root" in waiting["message"], waiting
    status = kit.container_status(kit.pod(core, namespace, "root-image"), "main")
    assert not status.get("containerID") and status.get("restartCount", 0) == 0, status


def test_the_rendered_sidecar_runs_non_root_under_the_default_seccomp_profile(
        node_cluster: stack_mod.Stack, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    namespace = kit.new_namespace(api)
    kit.sidecar_rbac(api, namespace)
    shipped = render.runtime({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime", "metadata": {"name": "r"},
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": names.TRAINER_REPLICATED_JOB, "template": {
            "metadata": {"labels": runtime_check.TRAINER_STEP_LABELS}, "spec": {"template": {"spec": {"containers": [
                {"name": "node", "image": kit.BUSYBOX, "command": ["sleep", "600"]}]}}}}}]}}},
    }, sidecar_image=local.SIDECAR_IMAGE)
    pod_spec = shipped["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    core.create_namespaced_pod(namespace, {"metadata": {"name": "sidecar"}, "spec": pod_spec})

    def running() -> str | None:
        status = kit.container_status(kit.pod(core, namespace, "sidecar"), names.SIDECAR_CONTAINER)
        return status.get("containerID") if "running" in status.get("state", {}) else None
    container_id = kit.wait("the sidecar to run", running)
    assert node_cluster.node is not None
    status = kit.proc_status(kit.container_pid(node_cluster.node, container_id))
    confined(status)
    # Not group 0 either: the kubelet passes the image's uid to the runtime, not its gid, so the
    # renderer states the group (without runAsGroup this process ran as gid 0).
    assert status["Gid"].split() == [str(render.SIDECAR_GID)] * 4, status["Gid"]


def test_the_driver_job_runs_non_root_in_its_group_under_the_default_seccomp_profile(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    namespace = kit.new_namespace(api)
    config = settings.from_env({"TCAB_BACKEND_URL": "http://backend.invalid:8080",
                                "TCAB_BACKEND_SERVICE_TOKEN": "svc-token-0123",
                                "TCAB_DISPATCHER_DRIVER_IMAGE": kit.NON_ROOT_IMAGE,
                                "TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP": NON_ROOT_UID,
                                "TCAB_DISPATCHER_NAMESPACE": namespace})
    claim = backend.Claim(job_id="run-1", token="tok-123", launch_request={})
    job = jobspec.job(claim, config)
    job["spec"]["template"]["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "cat /proc/1/status"]
    batch = kubernetes.client.BatchV1Api(api)
    created = batch.create_namespaced_job(namespace, job)
    core.create_namespaced_secret(namespace, jobspec.secret(claim, config, job_uid=created.metadata.uid))

    def finished() -> dict[str, Any] | None:
        listed = core.list_namespaced_pod(namespace, label_selector=f"job-name={created.metadata.name}").items
        phases = [p for p in listed if p.status.phase in ("Succeeded", "Failed")]
        return dict(api.sanitize_for_serialization(phases[0])) if phases else None
    pod = kit.wait("the driver pod to finish", finished)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    status = kit.parse_status(kit.log(core, namespace, pod["metadata"]["name"], jobspec.names.DRIVER_CONTAINER))
    confined(status)
    assert status["Gid"].split() == [NON_ROOT_UID] * 4, status["Gid"]
