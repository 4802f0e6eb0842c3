"""Fixtures of the end-to-end suite: a control plane of its own with the real
Trainer, JobSet and Kueue controllers on it (devcluster/stack.py) and the
real node that runs every pod (devcluster/node.py), through `local.start`.

The e2e plane is not the session's shared `control_plane`: installing
Trainer's and JobSet's webhooks changes how every TrainJob and pod is
admitted, which would change what the other suites test. So this module
starts its own plane and stack once per e2e module (a module that sets
`E2E_KUEUE = True` gets Kueue and our controller too) and stops both after it.
When an e2e test fails, every controller's log (and the plane's) is attached
to its report.

Nothing is left running, and that is checked: every process group the plane,
the stack and the node started is recorded, and at the end of the run none
may still have a live process, and the host must show nothing of the node
(`node.host_snapshot()`: no mount, cgroup, bridge, address, KUBE- chain or
process of it). A leftover fails the run (an error in the last test's
teardown) and is then cleaned up.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from controller import admission
from devcluster import harness, local, node as node_mod, scenario
from devcluster import procs, stack as stack_mod


_live: list[stack_mod.Stack] = []
# (name, process group id) of every process the e2e planes and stacks started.
_started: list[tuple[str, procs.Group]] = []


def _quiet_host(*, sweep: bool = False) -> dict[str, object]:
    """The host as no node leaves it: read while holding the host's node slot, so another suite's
    node (a parallel run on the same host) is not mistaken for ours; SWEEP first what an earlier,
    killed run left (so that only this run is judged)."""
    lock = node_mod.host_lock(wait=local.NODE_WAIT_SECONDS)
    try:
        if sweep:
            node_mod.sweep()
        return node_mod.host_snapshot()
    finally:
        os.close(lock)


@pytest.fixture(scope="session", autouse=True)
def leaves_nothing_running() -> Iterator[None]:
    before = _quiet_host(sweep=True)
    yield
    left = stack_mod.still_running(_started)
    after = _quiet_host()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    if left or changed:
        stack_mod.clean_up(_started)
        node_mod.sweep()
        pytest.fail(f"the e2e run left these behind: {left}; host changes (before, after): {changed}")


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[stack_mod.Stack]:
    """A module sets E2E_KUEUE = True to run Kueue and our controller too, E2E_OURS = False to run
    nothing of ours (a cluster to install into)."""
    kueue = bool(getattr(request.module, "E2E_KUEUE", False))
    ours = bool(getattr(request.module, "E2E_OURS", True))
    running = local.start(kueue=kueue, ours=ours)  # stops what it started if it fails
    _started.extend(running.plane.groups().items())
    _live.append(running)
    try:
        yield running
    finally:
        _started.extend(running.started)
        if running.node is not None:
            _started.extend(running.node.started)
        running.stop()
        _live.remove(running)
        running.plane.stop()


@pytest.fixture
def queues(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[str]:
    """The Kueue objects of `scenario.kueue_queues`, named after the namespace (E2E_KUEUE modules)."""
    with stack.plane.api_client() as api:
        scenario.kueue_queues(api, suffix=e2e_namespace, namespace=e2e_namespace,
                              check_controller=admission.CONTROLLER_NAME)
        yield e2e_namespace


@pytest.fixture
def e2e_namespace(stack: stack_mod.Stack) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    with stack.plane.api_client() as api:
        harness.create_namespace(api, name)
        yield name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and "stack" in getattr(item, "fixturenames", ()):
        for running in _live:
            report.sections.append((f"controller logs ({report.when})", running.logs(lines=150)))
            report.sections.append((f"control plane logs ({report.when})", running.plane.logs(lines=40)))
    return report
