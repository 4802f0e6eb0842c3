"""Fixtures of the fault suite: each module (one fault family) gets a cluster of its own from
`local.start(kueue=True)` (the control plane, Trainer, JobSet, Kueue, our controller and the real
node), since its faults stop, kill and restart that cluster's parts. Every process group the
module's cluster ran, restarted ones included, is recorded, and once the cluster is stopped none may
still have a live process (a leftover fails the module's last test, then is killed). When a test
fails, every process's log is attached to its report.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import kubernetes.client
import pytest

from controller import admission
from devcluster import harness, local, scenario
from devcluster import procs, stack as stack_mod


_live: list[stack_mod.Stack] = []


@pytest.fixture(scope="module")
def stack() -> Iterator[stack_mod.Stack]:
    running = local.start(kueue=True)  # stops what it started if it fails
    _live.append(running)
    groups: list[tuple[str, procs.Group]] = list(running.plane.groups().items())
    try:
        yield running
    finally:
        groups.extend(running.plane.groups().items())  # components a fault restarted
        groups.extend(running.started)  # every start of every controller, restarts included
        if running.node is not None:
            groups.extend(running.node.started)
        _live.remove(running)
        running.stop()
        running.plane.stop()
        left = stack_mod.still_running(groups)
        if left:
            stack_mod.clean_up(groups)
            pytest.fail(f"the fault module left these running: {left}")


@pytest.fixture
def namespace(stack: stack_mod.Stack) -> Iterator[str]:
    """A namespace of the test's own, deleted after it once its pods are gone: the node's two CPUs
    hold one execution at a time, and the next test's must fit."""
    name = f"fault-{uuid.uuid4().hex[:8]}"
    with stack.plane.api_client() as api:
        harness.create_namespace(api, name)
        yield name
        core = kubernetes.client.CoreV1Api(api)
        core.delete_namespace(name)
        deadline = time.monotonic() + 90
        while core.list_namespaced_pod(name).items:
            assert time.monotonic() < deadline, f"the pods of {name} were not gone 90 s after its deletion"
            time.sleep(0.5)


@pytest.fixture
def queues(stack: stack_mod.Stack, namespace: str) -> str:
    """`scenario.kueue_queues` named after the namespace; returns our AdmissionCheck's name."""
    with stack.plane.api_client() as api:
        scenario.kueue_queues(api, suffix=namespace, namespace=namespace, check_controller=admission.CONTROLLER_NAME)
    return f"ac-{namespace}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and "stack" in getattr(item, "fixturenames", ()):
        for running in _live:
            report.sections.append((f"controller logs ({report.when})", running.logs(lines=120)))
            report.sections.append((f"control plane logs ({report.when})", running.plane.logs(lines=40)))
    return report
