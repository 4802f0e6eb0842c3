"""End to end in Kueue mode: the real Kueue manager (TrainJob integration on)
admits TrainJobs through a ClusterQueue that requires our AdmissionCheck, and
our controller (`toolkit controller`) raises A before it approves each
admission. A higher-priority TrainJob preempts a running one; Kueue resets
the check to Pending on eviction, so the re-admission raises A again.

Each step is read from the Workload, not inferred from the pods: at every
admission it shows QuotaReserved and Admitted, and our check Ready with the
message "A raised to N", N exactly the A the pods carry and the TrainJob's
patch and floor; while evicted, Evicted (Preempted) and no reservation.
"""

from __future__ import annotations

from typing import Any


from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import names, raising

E2E_KUEUE = True  # read by the stack fixture


def _admitted_at(scenario: Scenario, check: str, pods: list[dict[str, Any]]) -> int:
    """The Workload of pods that run now: QuotaReserved and Admitted true, our
    check Ready with "A raised to N", N the A every pod carries. Returns N."""
    wl = scenario.workload()
    conditions = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
    for kind in ("QuotaReserved", "Admitted"):
        assert conditions.get(kind, {}).get("status") == "True", conditions
    entry = next(e for e in wl["status"]["admissionChecks"] if e["name"] == check)
    a = {pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for pod in pods}
    assert len(a) == 1, a
    n = int(a.pop())
    assert (entry["state"], entry["message"]) == ("Ready", f"A raised to {n}"), entry
    assert raising.counts(scenario.trainjob()) == raising.Counts(patch=n, floor=n)
    return n


def test_kueue_admission_preemption_and_readmission_raise_admission(
        stack: stack_mod.Stack, e2e_namespace: str, queues: str) -> None:
    check = f"ac-{queues}"
    with stack.plane.api_client() as api, stack.plane.api_client() as api2:
        low = Scenario(stack, api, e2e_namespace)
        high = Scenario(stack, api2, e2e_namespace, service_account=False)
        low.create_runtime(flow.runtime("kueue", cpu="1"))
        low.start("kueue", queue="lq", job_id="e2e.low", env={"STAY": "1"},
                  labels={"kueue.x-k8s.io/priority-class": f"low-{queues}"})

        # Kueue reserves quota, our controller raises A and sets the check
        # Ready, Kueue admits and unsuspends: the pods run with that A.
        pods = low.new_pods()
        first_a = _admitted_at(low, check, pods)
        # 1 even when Kueue writes the Workload between our raise and our Ready: the pass writes
        # Ready on the new version with the same A (admission.py). The check's message, the pods'
        # A and the TrainJob's patch and floor agree exactly (_admitted_at).
        assert first_a == 1
        for pod in pods:
            assert low.run(pod).exit_code is None  # left running: the preemption stops it

        # A higher priority preempts it; it runs with its own A.
        high.start("kueue", queue="lq", job_id="e2e.high",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{queues}"})
        low.wait("the low TrainJob to be suspended by the eviction", lambda: low.trainjob()["spec"].get("suspend"))
        high_pods = high.new_pods()
        assert _admitted_at(high, check, high_pods) == 1
        # While the high one holds the quota, the low Workload is evicted by
        # preemption and holds no reservation. Kueue reset our check to
        # Pending when it evicted it and released the quota only after the
        # TrainJob was suspended; in that window (Evicted with QuotaReserved)
        # our controller leaves the check Pending and A where it was, so the
        # raise belongs to the re-admission.
        evicted = low.workload()
        conditions = {c["type"]: c for c in evicted["status"].get("conditions") or []}
        assert conditions["Evicted"]["status"] == "True" and conditions["Evicted"]["reason"] == "Preempted", conditions
        assert conditions["QuotaReserved"]["status"] == "False", conditions
        entry = next(e for e in evicted["status"]["admissionChecks"] if e["name"] == check)
        assert (entry["state"], entry["message"]) == ("Pending", "Reset to Pending after eviction. Previously: Ready"), entry
        assert raising.counts(low.trainjob()).current == first_a
        for pod in high_pods:
            assert high.run(pod, until_exit=True).exit_code == 0  # finishes: frees the quota

        # Re-admitted: the eviction put the check back to Pending, so A was
        # raised again at re-admission, and the check's
        # message names exactly the A the new pods carry.
        pods = low.new_pods()
        again = _admitted_at(low, check, pods)
        assert again > first_a
        for pod in pods:
            low.run(pod)
        low.check_identities()
        high.check_identities()
