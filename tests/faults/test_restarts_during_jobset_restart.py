"""kube-controller-manager, JobSet's controller and Trainer's controller each stopped while a rank
fails and started again: a JobSet restart that happens across the restart of a controller on its
path (the Job controller sees the pod fail and fails the Job; JobSet restarts its Jobs; Trainer
owns the JobSet).

The first execution waits on a file in a directory every execution shares, then exits 3; the test
writes the file while the controller is down, so the rank fails during the outage. Outcome: once the
controller is back, JobSet restarts within the bound (J = 1), with the same admission (no
re-admission: A and the approval unchanged), and the new execution's epoch is above the first's.
"""

from __future__ import annotations

import pathlib
import time

import pytest

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from tests.faults import checks
from toolkit import names, raising

DOWN_SECONDS = 3.0
# The first execution (the one that makes /marks/first) fails with 3 once /marks/go exists; later
# ones run until stopped. `env` first: the scenario reads the identity from its lines.
COMMAND = ["/bin/sh", "-c",
           'env; if mkdir /marks/first 2>/dev/null; then while [ ! -e /marks/go ]; do sleep 0.2; done; exit 3; fi; '
           'trap "exit 0" TERM; while :; do sleep 1 & wait $!; done']
PLANE = ("kube-controller-manager",)


def _terminated(sc: Scenario, pod: str) -> dict[str, object] | None:
    status = flow.container_status(sc.pod(pod), flow.TRAINER_CONTAINER) or {}
    return (status.get("state") or {}).get("terminated")


@pytest.mark.parametrize("component", ["kube-controller-manager", "jobset-controller", "trainer-controller-manager"])
def test_restarted_during_a_jobset_restart(stack: stack_mod.Stack, namespace: str, queues: str,
                                           tmp_path: pathlib.Path, component: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("restart", cpu="1", host_dirs={"/marks": tmp_path}))
        sc.start("restart", queue="lq", job_id=f"fault.{component}", command=COMMAND)
        n = checks.admitted(sc, queues, since=time.monotonic())
        [first_pod] = sc.new_pods()
        first = sc.run(first_pod)

        if component in PLANE:
            stack.plane.stop_component(component)
        else:
            stack.stop_process(component)
        (tmp_path / "go").touch()
        failed = sc.wait("the first execution to fail", lambda: _terminated(sc, first_pod["metadata"]["name"]))
        assert first.exit_code is None and failed["exitCode"] == 3  # it ran, then failed during the outage
        time.sleep(DOWN_SECONDS)
        if component in PLANE:
            ended = checks.started_again(stack, component)
        else:
            stack.start_process(component)
            ended = time.monotonic()

        pods = sc.new_pods()
        assert time.monotonic() - ended <= checks.ADMISSION_BOUND_SECONDS
        assert {p["metadata"]["labels"][names.RESTART_LABEL] for p in pods} == {"1"}
        checks.carry(pods, n)  # the same admission: a JobSet restart raises nothing
        for pod in pods:
            sc.run(pod)
        assert raising.counts(sc.trainjob()) == raising.Counts(patch=n, floor=n)
        assert checks.check_entry(sc.workload(), queues)["message"] == f"A raised to {n}"
        assert len(checks.ready_lines(stack, sc)) == 1
        sc.check_identities()
        assert sc.foreign() is None
