"""Our controller, installed from the release (two replicas, leader election over the Lease, as
pods on the node), stopped or killed at each step of a Kueue admission.

Steps: before the raise (the Deployment scaled to zero: the reservation waits on our check while no
controller runs, then scaled back), between the raise and the approval (held open by
`checks.approval_held`: every replica's container SIGKILLed through the runtime, restarted by the
kubelet), just after the approval (the same). Outcome: the restarted controller approves within
the bound, from the raise it finds marked for the Workload (no second raise unless Kueue wrote the
Workload in between), never twice; after the approval it raises nothing more. The leader alone
killed between its raise and its approval: the standby takes the Lease over and approves; one
approval, by the standby, carrying the leader's raise.
"""

from __future__ import annotations

import time

import kubernetes.client
import pytest

from devcluster import install, scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from tests.faults import checks
from toolkit import raising


def _run(stack: stack_mod.Stack, sc: Scenario, check: str, n: int) -> None:
    pods = sc.new_pods()
    checks.carry(pods, n)
    for pod in pods:
        sc.run(pod)
    assert len(checks.ready_lines(stack, sc)) == 1
    sc.check_identities()
    assert sc.foreign() is None


def _kill_every_replica(stack: stack_mod.Stack) -> None:
    for pod in stack.ours.all_running():
        stack.ours.kill(pod)


@pytest.mark.parametrize("moment", ["before the raise", "between the raise and the approval", "after the approval"])
def test_killed_at_a_step_of_the_admission(stack: stack_mod.Stack, namespace: str, queues: str, moment: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("kill", cpu="1"))
        start = lambda: sc.start("kill", queue="lq", job_id="fault.kill", env={"STAY": "1"})  # noqa: E731
        if moment == "before the raise":
            stack.ours.stop()
            start()
            checks.reserved_not_raised(sc, queues, admission=0)
            stack.ours.start()
            n = checks.admitted(sc, queues, since=time.monotonic())
            assert n == 1
        elif moment == "between the raise and the approval":
            with checks.approval_held(api, queues, namespace=namespace):
                start()
                checks.raised_not_approved(sc, queues, above=0)
                _kill_every_replica(stack)
            stack.ours.all_running()
            n = checks.admitted(sc, queues, since=time.monotonic())
            assert n in (1, 2)
        else:
            start()
            n = checks.admitted(sc, queues, since=time.monotonic())
            _kill_every_replica(stack)
            stack.ours.all_running()  # ready = the leader's informers listed everything again
            stack.ours.leader()
            time.sleep(3.0)  # a pass it would make on the relisted Workload has had its time
            assert raising.counts(sc.trainjob()) == raising.Counts(patch=n, floor=n)
            assert checks.check_entry(sc.workload(), queues)["message"] == f"A raised to {n}"
        _run(stack, sc, queues, n)


def test_leader_killed_mid_admission_the_standby_finishes(stack: stack_mod.Stack, namespace: str,
                                                          queues: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("lease", cpu="1"))
        replicas = stack.ours.all_running()
        leader = stack.ours.leader()
        [standby] = [r for r in replicas if r != leader]
        with checks.approval_held(api, queues, namespace=namespace):
            sc.start("lease", queue="lq", job_id="fault.lease", env={"STAY": "1"})
            checks.raised_not_approved(sc, queues, above=0)
            stack.ours.kill(leader)
        n = checks.admitted(sc, queues, since=time.monotonic())
        assert n in (1, 2)
        assert stack.ours.leader() == standby
        lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(install.LEASE, install.NAMESPACE)
        assert lease.spec.holder_identity.startswith(f"{standby}"), lease.spec.holder_identity
        [line] = checks.ready_lines(stack, sc)
        assert line["process"] == standby and line["admission"] == n
        # No second raise unless the Workload changed between the leader's raise and the Ready; that
        # second raise (n == 2) is the standby's, or the leader's own retry before it was killed.
        assert n == 2 or not line["raised"], line
        _run(stack, sc, queues, n)
