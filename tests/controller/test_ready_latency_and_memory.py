"""What the controller remembers about Workloads, on the real apiserver with
the controller as a real process: one clock per Workload waiting on our
check (`dispatch_workloads_awaiting_ready`), started at the first version
that waits and dropped when it is processed, stops waiting or is deleted,
so a long-running controller's memory follows the Workloads waiting now,
not every version it ever saw; and the ready latency runs from that first
sight, not from the last event before Ready."""

from __future__ import annotations

import concurrent.futures
import re
import time
import uuid

import pytest

from devcluster import metrics
from tests.adapter import kit
from tests.controller.conftest import wait_until
from toolkit import kube, paths

pytestmark = pytest.mark.cluster


def _metric(ctl, name: str) -> float:
    status, body = ctl.get("/metrics")
    assert status == 200
    found = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def _touch(admin: kube.Client, *, namespace: str, name: str, value: str) -> None:
    """A new Workload version that still waits (an annotation, as any controller may write)."""
    def compute(wl):
        wl["metadata"].setdefault("annotations", {})["test/touch"] = value
        return wl, None
    admin.read_modify_write(paths.WORKLOAD, name=name, namespace=namespace, compute=compute)


def _check(admin: kube.Client) -> str:
    name = f"dispatch-{uuid.uuid4().hex[:8]}"
    kit.create_admission_check(admin, name)
    return name


def test_one_clock_per_waiting_workload_from_its_first_sight_to_ready(admin, namespace, start_controller):
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    kit.set_suspend(admin, namespace, name, False)  # A cannot be raised: the check waits, refused every 2 s
    wl = kit.create_workload(admin, tj)["metadata"]["name"]
    ctl = start_controller()
    assert _metric(ctl, "dispatch_workloads_awaiting_ready") == 0
    reserved = time.monotonic()
    kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    wait_until(lambda: _metric(ctl, "dispatch_workloads_awaiting_ready") == 1, what="the clock started")
    # Eight more versions while it waits: still one clock.
    held = 4.0
    for i in range(8):
        time.sleep(held / 8)
        _touch(admin, namespace=namespace, name=wl, value=str(i))
    assert _metric(ctl, "dispatch_workloads_awaiting_ready") == 1
    kit.set_suspend(admin, namespace, name, True)  # the next retry raises and approves
    wait_until(lambda: kit.check_entry(admin, namespace=namespace, name=wl, check=check).get("state") == "Ready",
               what="Ready", timeout=60)  # one retry (2 s) expected: the bound is far above it
    ready = time.monotonic()
    wait_until(lambda: _metric(ctl, 'dispatch_check_ready_seconds_count{cluster_queue="cq"}') == 1, what="one latency observed")
    latency = _metric(ctl, 'dispatch_check_ready_seconds_sum{cluster_queue="cq"}')
    # From the first sight of the reservation (shortly after `reserved`),
    # not from the last touch (which was at most a retry, 2 s, before Ready).
    # Both bounds are causal, not guesses at the machine's speed: the clock
    # started before the `held` seconds of touches (the wait above saw it),
    # and it stopped before the test saw Ready.
    assert held - 0.5 <= latency <= ready - reserved, (latency, ready - reserved)
    wait_until(lambda: _metric(ctl, "dispatch_workloads_awaiting_ready") == 0, what="the clock dropped")

    # Waiting again, then deleted before it is ever Ready: dropped on delete.
    kit.set_suspend(admin, namespace, name, False)
    kit.kueue_evict(admin, namespace=namespace, name=wl, check=check)
    kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    wait_until(lambda: _metric(ctl, "dispatch_workloads_awaiting_ready") == 1, what="waiting again")
    admin.delete(paths.WORKLOAD, name=wl, namespace=namespace)
    wait_until(lambda: _metric(ctl, "dispatch_workloads_awaiting_ready") == 0, what="dropped on delete")
    assert _metric(ctl, 'dispatch_check_ready_seconds_count{cluster_queue="cq"}') == 1


COUNT = 1000


def test_a_thousand_workloads_created_and_deleted_leave_no_clock_behind(admin, namespace, start_controller):
    """Every way a clock can end at scale: approved, touched while waiting,
    deleted before the controller got to it, deleted while refused."""
    check = _check(admin)
    ours, refused = kit.create_trainjob(admin, namespace), kit.create_trainjob(admin, namespace)
    kit.set_suspend(admin, namespace, refused["metadata"]["name"], False)
    ctl = start_controller()
    started = time.monotonic()

    def one(i: int) -> None:
        # Fewer round trips than kit's helpers (no re-reads): the status
        # written from the created object, as kit.kueue_reserve writes it.
        created = kit.create_workload(admin, refused if i % 4 == 0 else ours)
        wl = created["metadata"]["name"]
        created["status"] = {
            "conditions": [kit._condition("QuotaReserved", True, "QuotaReserved")],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "node", "count": 1}]},
            "admissionChecks": [{"name": check, "state": "Pending", "message": "", "lastTransitionTime": kit.now()}],
        }
        admin.replace(paths.WORKLOAD, created, subresource="status")
        if i % 2:
            admin.merge_patch(paths.WORKLOAD, {"metadata": {"annotations": {"test/touch": "1"}}},
                              name=wl, namespace=namespace)
        admin.delete(paths.WORKLOAD, name=wl, namespace=namespace)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(COUNT)))
    made = time.monotonic() - started
    wait_until(lambda: _metric(ctl, "dispatch_workloads_awaiting_ready") == 0, what="every clock dropped", timeout=120)
    left, _ = admin.list(paths.WORKLOAD, namespace=namespace)
    assert left == []
    # absent when none was approved (a labelled series exists from its first observation)
    approved = metrics.sample(ctl.get("/metrics")[1], 'dispatch_check_ready_seconds_count{cluster_queue="cq"}') or 0
    print(f"{COUNT} Workloads created, reserved and deleted in {made:.1f}s; {approved:.0f} approved on the way")


def test_the_api_requests_it_sends_are_counted_on_metrics(admin, namespace, start_controller):
    """`dispatch_api_requests`: every request sent, what bench/admission divides by the admissions."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    wl = kit.create_workload(admin, tj)["metadata"]["name"]
    ctl = start_controller()
    listed = _metric(ctl, "dispatch_api_requests_total")
    assert listed >= 7  # ready: each of its seven informers has listed
    kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    wait_until(lambda: kit.check_entry(admin, namespace=namespace, name=wl, check=check).get("state") == "Ready",
               what="Ready", timeout=60)
    # At least: the runtime read fresh, the raise, Ready (the Workload and its TrainJob from the caches).
    assert _metric(ctl, "dispatch_api_requests_total") - listed >= 3
