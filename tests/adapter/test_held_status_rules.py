"""Kueue mode's hold in `toolkit status` (adapter.compute_status, pure): a Workload of the
TrainJob with spec.active false reads "held" once Kueue has suspended the TrainJob, and says
Kueue is stopping it while it still runs; an active Workload changes nothing."""

from __future__ import annotations

from typing import Any

from tests.adapter import test_status_rules as rules
from toolkit import adapter


def _workload(active: bool | None) -> dict[str, Any]:
    spec: dict[str, Any] = {} if active is None else {"active": active}
    return {"metadata": {"name": "trainjob-tj-1"}, "spec": spec}


def test_an_inactive_workload_reads_held_and_the_next_execution_once_suspended() -> None:
    s = adapter.compute_status(rules.trainjob(a=2, suspend=True), rules.jobset(0), workloads=[_workload(False)])
    assert (s.state, s.execution, s.admission) == ("held (Workload spec.active false)", "next", 3)
    assert s.state == adapter.HELD


def test_an_inactive_workload_of_a_running_trainjob_says_kueue_is_stopping_it() -> None:
    s = adapter.compute_status(rules.trainjob(a=2, suspend=False), rules.jobset(0), workloads=[_workload(False)])
    assert (s.state, s.execution, s.admission) == (
        "running (Workload spec.active false: Kueue is stopping it)", "current", 2)


def test_an_active_workload_or_none_reads_as_the_trainjob_does() -> None:
    for workloads in ([_workload(True)], [_workload(None)], [], None):
        assert adapter.compute_status(rules.trainjob(a=2, suspend=True), None, workloads=workloads).state == "suspended"
        assert adapter.compute_status(rules.trainjob(a=2, suspend=False), None, workloads=workloads).state == "running"
