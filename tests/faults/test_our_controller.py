"""Our controller killed (SIGKILL) at each step of a Kueue admission, and the shipped topology (two
replicas, leader election) losing its leader mid-admission.

Steps: before the raise (the reservation waits on our check while no controller runs), between the
raise and the approval (held open by `checks.approval_held`), just after the approval. Outcome: the
restarted controller approves within the bound, from the raise it finds marked for the Workload (no
second raise unless Kueue wrote the Workload in between), never twice; after the approval it raises
nothing more. With two replicas, the leader killed between its raise and its approval: the standby
takes the Lease over and approves; one approval, by the standby, carrying the leader's raise.
"""

from __future__ import annotations

import time

import kubernetes.client
import pytest

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from tests.faults import checks
from toolkit import raising

CONTROLLER = "dispatch-controller"


def _run(stack: stack_mod.Stack, sc: Scenario, check: str, n: int) -> None:
    pods = sc.new_pods()
    checks.carry(pods, n)
    for pod in pods:
        sc.run(pod)
    assert len(checks.ready_lines(stack, sc)) == 1
    sc.check_identities()
    assert sc.foreign() is None


@pytest.mark.parametrize("moment", ["before the raise", "between the raise and the approval", "after the approval"])
def test_killed_at_a_step_of_the_admission(stack: stack_mod.Stack, namespace: str, queues: str, moment: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("kill", cpu="1"))
        start = lambda: sc.start("kill", queue="lq", job_id="fault.kill", env={"STAY": "1"})  # noqa: E731
        if moment == "before the raise":
            stack.kill(CONTROLLER)
            start()
            checks.reserved_not_raised(sc, queues, admission=0)
            stack.start_process(CONTROLLER)
            n = checks.admitted(sc, queues, since=time.monotonic())
            assert n == 1
        elif moment == "between the raise and the approval":
            with checks.approval_held(api, queues, namespace=namespace):
                start()
                checks.raised_not_approved(sc, queues, above=0)
                stack.kill(CONTROLLER)
            stack.start_process(CONTROLLER)
            n = checks.admitted(sc, queues, since=time.monotonic())
            assert n in (1, 2)
        else:
            start()
            n = checks.admitted(sc, queues, since=time.monotonic())
            stack.kill(CONTROLLER)
            stack.start_process(CONTROLLER)  # ready = its informers listed everything again
            time.sleep(3.0)  # a pass it would make on the relisted Workload has had its time
            assert raising.counts(sc.trainjob()) == raising.Counts(patch=n, floor=n)
            assert checks.check_entry(sc.workload(), queues)["message"] == f"A raised to {n}"
        _run(stack, sc, queues, n)


def test_leader_killed_mid_admission_the_standby_finishes(stack: stack_mod.Stack, namespace: str,
                                                          queues: str) -> None:
    stack.stop_process(CONTROLLER)
    replicas = stack.start_dispatch_replicas(2)
    try:
        with stack.plane.api_client() as api:
            sc = Scenario(stack, api, namespace)
            sc.create_runtime(flow.runtime("lease", cpu="1"))
            [leader] = stack.leaders(replicas)
            [standby] = [r for r in replicas if r != leader]
            with checks.approval_held(api, queues, namespace=namespace):
                sc.start("lease", queue="lq", job_id="fault.lease", env={"STAY": "1"})
                checks.raised_not_approved(sc, queues, above=0)
                stack.kill(leader)
            n = checks.admitted(sc, queues, since=time.monotonic())
            assert n in (1, 2)
            assert stack.leaders(replicas) == [standby]
            lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease("dispatch-controller",
                                                                                  "dispatch-system")
            assert lease.spec.holder_identity.startswith(f"{standby}-"), lease.spec.holder_identity
            [line] = checks.ready_lines(stack, sc)
            assert line["process"] == standby and line["admission"] == n
            # No second raise unless the Workload changed between the leader's raise and the Ready; that
            # second raise (n == 2) is the standby's, or the leader's own retry before it was killed.
            assert n == 2 or not line["raised"], line
            _run(stack, sc, queues, n)
    finally:
        for name in replicas:
            stack.stop_process(name)
        stack.start_process(CONTROLLER)
