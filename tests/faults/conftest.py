"""Fixtures of the fault suite: a cluster from `local.start(kueue=True, release_dir=...)` (the
control plane, Trainer, JobSet, Kueue, the real node, and our controller installed from the release:
both replicas as pods, `stack.ours`, devcluster/controller_pods.py), whose parts the faults stop,
kill and restart. Each module (one fault family) puts back what it stopped; the next module is handed the
same cluster only when it is as it was started: the same components and processes running, none
exited, both replicas of our controller Ready (`_as_started`). Otherwise it is stopped and the next module gets a new one; it is stopped
after the package in any case. Every test works in a namespace of its own, deleted once its pods
are gone. Every process group the cluster ran, restarted ones included, is recorded, and once the
cluster is stopped none may still have a live process (a leftover fails the test then running,
then is killed). When a test fails, every process's log is attached to its report.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from controller import admission
from devcluster import harness, local, scenario
from devcluster import procs, stack as stack_mod
from tests import namespaces


_live: list[stack_mod.Stack] = []  # the cluster now, if one runs
# What ran when it started: the plane's components, the stack's processes.
_started_with: dict[str, set[str]] = {}
_groups: list[tuple[str, procs.Group]] = []  # every process group it ran


def _start() -> stack_mod.Stack:
    release = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-faults-release-"))
    try:
        running = local.start(kueue=True, release_dir=release)  # stops what it started if it fails
    except BaseException:
        shutil.rmtree(release, ignore_errors=True)
        raise
    running.release_dir = release
    _live.append(running)
    _groups.extend(running.plane.groups().items())
    _started_with.update(plane=set(running.plane.groups()), stack=set(running.names()))
    return running


def _as_started(running: stack_mod.Stack) -> bool:
    """The same components and processes run as when it started, and none has exited."""
    try:
        running.check_alive()
    except Exception:
        return False
    plane = running.plane.groups()
    if not (set(plane) == _started_with["plane"] and set(running.names()) == _started_with["stack"]
            and len(stack_mod.still_running(plane.items())) == len(plane)):
        return False
    try:  # and both replicas of our controller Ready again (a killed one restarted by the kubelet)
        running.ours.all_running(timeout=120)
    except Exception:
        return False
    return True


def _stop() -> None:
    """Stop the cluster, if one runs; fail if a process group it ran is still live after."""
    if not _live:
        return
    running = _live.pop()
    groups = [*_groups, *running.plane.groups().items(), *running.started]  # restarts included
    if running.node is not None:
        groups.extend(running.node.started)
    _groups.clear()
    running.stop()
    running.plane.stop()
    if running.release_dir is not None:
        shutil.rmtree(running.release_dir, ignore_errors=True)
    left = stack_mod.still_running(groups)
    if left:
        stack_mod.clean_up(groups)
        pytest.fail(f"the fault suite's cluster left these running: {left}")


@pytest.fixture(scope="module")
def stack() -> Iterator[stack_mod.Stack]:
    running = _live[0] if _live else _start()
    _groups.extend(running.plane.groups().items())
    yield running
    _groups.extend(running.plane.groups().items())  # components a fault restarted
    if not _as_started(running):
        _stop()


@pytest.fixture(scope="package", autouse=True)
def _cluster_stopped_after_the_package() -> Iterator[None]:
    yield
    _stop()


@pytest.fixture
def namespace(stack: stack_mod.Stack) -> Iterator[str]:
    """A namespace of the test's own, deleted after it once its pods are gone: the node's two CPUs
    hold one execution at a time, and the next test's must fit."""
    name = f"fault-{uuid.uuid4().hex[:8]}"
    with stack.plane.api_client() as api:
        harness.create_namespace(api, name)
        yield name
        namespaces.leave(api, [name], timeout=90)


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
