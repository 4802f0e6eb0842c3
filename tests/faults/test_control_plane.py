"""Faults of the control plane during a Kueue admission: kube-apiserver stopped and started again
between our raise and our approval, and etcd stopped and started again at the same moment (the
apiserver stays up, refusing what it cannot store). Each on the real controllers and the real node.

Outcome for both: once the part is back, our controller's retry finds its raise marked for this
Workload and approves it (or, if Kueue wrote the Workload meanwhile, raises once more: A = 2), within
the bound; the pods carry exactly the A the approval names; one approval; the identity rule holds.
"""

from __future__ import annotations

import time

import pytest

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from tests.faults import checks

DOWN_SECONDS = 5.0  # long enough for every client to see refused connections and back off


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_stopped_between_our_raise_and_our_approval(stack: stack_mod.Stack, namespace: str, queues: str,
                                                    component: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("cp", cpu="1"))
        with checks.approval_held(api, queues, namespace=namespace):
            sc.start("cp", queue="lq", job_id=f"fault.{component}", env={"STAY": "1"})
            checks.raised_not_approved(sc, queues, above=0)
            stack.plane.stop_component(component)
            time.sleep(DOWN_SECONDS)
            checks.started_again(stack, component)
        ended = time.monotonic()
        n = checks.admitted(sc, queues, since=ended)
        assert n in (1, 2)
        pods = sc.new_pods()
        checks.carry(pods, n)
        for pod in pods:
            sc.run(pod)
        assert len(checks.ready_lines(stack, sc)) == 1
        sc.check_identities()
        assert sc.foreign() is None
