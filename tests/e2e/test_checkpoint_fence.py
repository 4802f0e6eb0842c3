"""The guarantee the epoch exists for, end to end on the real controllers and the real node: a
late checkpoint save from a superseded execution never overwrites a newer one.

One TrainJob in Kueue mode runs the sample trainer (the python flavour, which publishes through
dispatch_fence) with a hostPath volume every execution shares, as ranks share a
filesystem, and a long termination grace period. Its first execution stages a checkpoint and is
slow to publish it; it ignores SIGTERM, as a trainer busy writing a checkpoint may. A
higher-priority TrainJob preempts it: Kueue suspends it and the kubelet sends the first
execution SIGTERM, which it ignores, so its pod stays Terminating while Kueue admits the
high-priority one, then admits ours again (A raised). That execution publishes. Only then does
the first one publish: refused, exit 1, and LATEST still names the newer execution's epoch, its
checkpoint untouched. The old pod is held by a finalizer of the test's, so its container's exit
code can be read after the kubelet has finished with it.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib

import kubernetes.client

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from dispatch_fence import checkpoint
from toolkit import names

E2E_KUEUE = True  # read by the stack fixture

IMAGE = "localhost/dispatch/sample-trainer:python"
TRAINER_USER = (65532, 65532)  # the image's USER: the shared volume is its, as fsGroup would make it
GATE = "/ckpt/.go"
FINALIZER = "e2e.dispatch.phpboyscout.uk/keep"
GRACE_SECONDS = 300
# Whichever execution claims /ckpt/.slow first (the first one) ignores SIGTERM and waits for
# GATE before it publishes; every other one publishes at once. `env` first: the scenario reads
# the identity from its lines.
COMMAND = ["/bin/sh", "-c",
           f"env; if mkdir /ckpt/.slow 2>/dev/null; then trap '' TERM; "
           f"exec train --checkpoint /ckpt --save-after {GATE}; fi; exec train --checkpoint /ckpt"]
# Two such pods and their sidecars fit the node's 2 CPUs beside our controller's two pods and
# CoreDNS: the old one still holds its share.
CPU = "750m"


def _follow(core: kubernetes.client.CoreV1Api, namespace: str, pod: str) -> str:
    """The container's whole log, read until the container ends (the kubelet closes the stream)."""
    response = core.read_namespaced_pod_log(pod, namespace, container=flow.TRAINER_CONTAINER, follow=True,
                                            _preload_content=False)
    try:
        return b"".join(response.stream(4096)).decode(errors="replace")
    finally:
        response.release_conn()


def test_a_superseded_execution_s_late_save_is_refused_after_a_preemption_and_a_readmission(
        stack: stack_mod.Stack, e2e_namespace: str, queues: str, tmp_path: pathlib.Path) -> None:
    shared = tmp_path / "ckpt"
    shared.mkdir()
    os.chown(shared, *TRAINER_USER)
    with (stack.plane.api_client() as api, stack.plane.api_client() as api2,
          concurrent.futures.ThreadPoolExecutor(max_workers=1) as reader):
        job = Scenario(stack, api, e2e_namespace)
        high = Scenario(stack, api2, e2e_namespace, service_account=False)
        slow = flow.runtime("ckpt", cpu=CPU, image=IMAGE, host_dirs={"/ckpt": shared})
        pod_spec = slow["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod_spec["terminationGracePeriodSeconds"] = GRACE_SECONDS
        job.create_runtime(slow)
        job.create_runtime(flow.runtime("plain", cpu=CPU))
        job.start("ckpt", queue="lq", job_id="e2e.ckpt", command=COMMAND,
                  labels={"kueue.x-k8s.io/priority-class": f"low-{queues}"})

        # Execution 1 stages its checkpoint and holds it back.
        first_pod = job.new_pods()[0]
        first_name = first_pod["metadata"]["name"]
        # Strategic merge: added beside the Job controller's own finalizer, and removed alone below.
        job.core.patch_namespaced_pod(first_name, e2e_namespace, {"metadata": {"finalizers": [FINALIZER]}})
        first = job.run(first_pod)
        late_log = reader.submit(_follow, job.core, e2e_namespace, first_name)
        staging = shared / f".staging-{first.attempt}"
        job.wait("the first execution's staged checkpoint", lambda: (staging / checkpoint.MARKER).exists())

        # Preempted: suspended, and its pod terminates slowly (SIGTERM ignored, a long grace).
        high.start("plain", queue="lq", job_id="e2e.urgent",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{queues}"})
        job.wait("the eviction", lambda: job.trainjob()["spec"].get("suspend"))
        job.wait("the first pod to be terminating", lambda: job.pod(first_name)["metadata"].get("deletionTimestamp"))
        for pod in high.new_pods():
            assert high.run(pod, until_exit=True).exit_code == 0

        # Re-admitted with A raised while the first execution still runs: execution 2 publishes.
        second_pod = job.new_pods()[0]
        assert int(second_pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION]) > int(
            first_pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION])
        assert not late_log.done(), "the first execution is still running"
        second = job.run(second_pod, until_exit=True)
        assert second.exit_code == 0, second.log
        newest = checkpoint.latest(shared)
        assert newest is not None and newest.epoch == int(second.epoch or 0) > int(first.epoch or 0)
        before = sorted(p.name for p in shared.iterdir())

        # Now the first execution publishes its save: refused; LATEST and every checkpoint stand.
        (shared / GATE.removeprefix("/ckpt/")).touch()
        text = late_log.result(timeout=120)
        ended = job.wait("the first container's exit code", lambda: (
            (flow.container_status(job.pod(first_name), flow.TRAINER_CONTAINER) or {}).get("state") or {}
        ).get("terminated"))
        job.core.patch_namespaced_pod(first_name, e2e_namespace,
                                      {"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}})
    assert ended["exitCode"] == 1, text
    assert "a superseded execution's save, refused; nothing published" in text, text
    after = checkpoint.latest(shared)
    assert after is not None and (after.name, after.epoch) == (newest.name, newest.epoch)
    assert sorted(p.name for p in shared.iterdir()) == sorted([*before, GATE.removeprefix("/ckpt/")])
    assert (shared / newest.name / "model.txt").read_text() == (
        f"weights of {second.attempt}, epoch {second.epoch}\n")
    job.check_identities()
