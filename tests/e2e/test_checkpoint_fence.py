"""The guarantee the epoch exists for, end to end on the real controllers: a
late checkpoint save from a superseded execution never overwrites a newer one.

One TrainJob in Kueue mode runs the sample trainer (the python flavour, which
publishes through toolkit/checkpoint.py) with a hostPath volume every
execution shares, as ranks share a filesystem. Its first execution (A=a, J=0)
stages a checkpoint and is slow to publish it: its container keeps running in
podman after its pod failed, a node that has not noticed yet. JobSet restarts
the rank (J=1) and that execution publishes; a higher-priority TrainJob
preempts it; Kueue admits it again (A raised) and that execution publishes.
Only then does the first one publish: refused, exit 1, and LATEST still names
the last execution's epoch, its checkpoint untouched.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import pytest

from devcluster import execute, scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import checkpoint, names

E2E_KUEUE = True  # read by the stack fixture

IMAGE = "localhost/dispatch/sample-trainer:python"
TRAINER_USER = (65532, 65532)  # the image's USER: the shared volume is its, as fsGroup would make it
GATE = "/ckpt/.go"
# The first execution (J=0, nothing published yet) waits for GATE before it publishes; every
# other one publishes at once. `env` first: the scenario reads the identity from its lines.
COMMAND = ["/bin/sh", "-c",
           'env; if [ "${DISPATCH_ATTEMPT##*.}" = 0 ] && [ ! -e /ckpt/LATEST ]; then '
           f'exec train --checkpoint /ckpt --save-after {GATE}; fi; exec train --checkpoint /ckpt']


def test_a_superseded_execution_s_late_save_is_refused_after_a_restart_and_a_readmission(
        stack: stack_mod.Stack, e2e_namespace: str, queues: str, tmp_path: pathlib.Path) -> None:
    shared = tmp_path / "ckpt"
    shared.mkdir()
    os.chown(shared, *TRAINER_USER)
    with (stack.plane.api_client() as api, stack.plane.api_client() as api2,
          concurrent.futures.ThreadPoolExecutor(max_workers=1) as slow_node):
        job = Scenario(stack, api, e2e_namespace)
        high = Scenario(stack, api2, e2e_namespace, service_account=False)
        job.create_runtime(flow.runtime("ckpt", cpu="1", image=IMAGE, host_dirs={"/ckpt": shared}))
        job.create_runtime(flow.runtime("plain", cpu="1"))
        job.start("ckpt", queue="lq", job_id="e2e.ckpt", command=COMMAND,
                  labels={"kueue.x-k8s.io/priority-class": f"low-{queues}"})

        # Execution 1 stages its checkpoint and holds it; its pod fails meanwhile (the rank is lost).
        first_pod = job.new_running_pods()[0]
        late = slow_node.submit(execute.run, first_pod, container_name="node", timeout=240)
        first_token = first_pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION]
        staging = shared / f".staging-{job.job_id}.{flow.SUBMISSION}.{flow.ATTEMPT}.{first_token}.0"
        job.wait("the first execution's staged checkpoint", lambda: (staging / checkpoint.MARKER).exists()
                 or late.done())
        assert not late.done(), late.result()
        job.end(first_pod, 3)

        # Execution 2, after JobSet's restart (J=1), publishes; its pod is left running.
        second = job.run(job.new_running_pods()[0])
        assert second.exit_code == 0, second.stdout + second.stderr
        assert second.attempt is not None and second.attempt.endswith(".1")
        assert checkpoint.latest(shared).epoch == int(second.epoch or 0)  # type: ignore[union-attr]

        # Preempted by a higher priority; re-admitted with A raised: execution 3 publishes.
        high.start("plain", queue="lq", job_id="e2e.urgent",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{queues}"})
        job.wait("the eviction", lambda: job.trainjob()["spec"].get("suspend"))
        for pod in high.new_running_pods():
            high.end(pod, high.run(pod).exit_code)
        third_pod = job.new_running_pods()[0]
        third = job.run(third_pod)
        assert third.exit_code == 0, third.stdout + third.stderr
        assert int(third_pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION]) > int(first_token)
        newest = checkpoint.latest(shared)
        assert newest is not None and newest.epoch == int(third.epoch or 0) > int(second.epoch or 0)
        before = sorted(p.name for p in shared.iterdir())
        job.end(third_pod, 0)

        # Now the slow node publishes execution 1's save: refused; LATEST and every checkpoint stand.
        (shared / GATE.removeprefix("/ckpt/")).touch()
        first = late.result(timeout=120)
    assert first.exit_code == 1, first.stdout + first.stderr
    assert first.epoch is not None and int(first.epoch) < int(third.epoch or 0)
    assert "a superseded execution's save, refused; nothing published" in first.stderr, first.stderr
    after = checkpoint.latest(shared)
    assert after is not None and (after.name, after.epoch) == (newest.name, newest.epoch)
    assert sorted(p.name for p in shared.iterdir()) == sorted([*before, GATE.removeprefix("/ckpt/")])
    assert (shared / newest.name / "model.txt").read_text() == (
        f"weights of {third.attempt}, epoch {third.epoch}\n")
    job.check_identities()
