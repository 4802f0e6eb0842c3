"""Fixtures of the end-to-end suite: a control plane of its own with the real
Trainer, JobSet and Kueue controllers on it (devcluster/stack.py) and the
real node that runs every pod (devcluster/node.py), through `local.start`.

The e2e plane is not the session's shared `control_plane`: installing
Trainer's and JobSet's webhooks changes how every TrainJob and pod is
admitted, which would change what the other suites test. So this package
starts its own plane and stack, of the kind a module asks for (a module that
sets `E2E_KUEUE = True` gets Kueue and our controller too, installed from the
release as a user installs it: its images pulled from the cluster's registry,
controller.yaml applied, both replicas as pods on the node; `E2E_OURS = False`
nothing of ours). One stack serves every module of the same kind: the modules
that use a stack run first, grouped by kind (`pytest_collection_modifyitems`),
each test in a namespace of its own that is deleted, its pods gone, before
the next test (the node's two CPUs hold one execution at a time); a stack is
stopped when the next module wants another kind, when a module left one of its
processes dead, before a module that runs a cluster of its own (the demo), and
after the package.
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
import pathlib
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import kubernetes.client
import pytest

from controller import admission
from devcluster import harness, local, node as node_mod, scenario
from devcluster import procs, stack as stack_mod


NAMESPACE_GONE_SECONDS = 90.0
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


# The stack that serves the modules of one kind, by its kind: at most one at a time.
_held: dict[tuple[bool, bool], stack_mod.Stack] = {}
HERE = pathlib.Path(__file__).parent


def _kind(module: object) -> tuple[bool, bool]:
    """(Kueue and our controller run, anything of ours runs): E2E_KUEUE and E2E_OURS."""
    return bool(getattr(module, "E2E_KUEUE", False)), bool(getattr(module, "E2E_OURS", True))


def _stop_held() -> None:
    for kind in list(_held):
        running = _held.pop(kind)
        _started.extend(running.started)
        if running.node is not None:
            _started.extend(running.node.started)
        try:
            running.stop()
        finally:
            _live.remove(running)
            running.plane.stop()
            if getattr(running, "release_dir", None) is not None:
                shutil.rmtree(running.release_dir, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This package's tests, in the slots they were collected into: first the modules that use
    `stack`, grouped by kind, then the others; each module's tests in their own order."""
    slots = [i for i, item in enumerate(items) if HERE in pathlib.Path(item.path).parents]
    ours = [items[i] for i in slots]
    uses = {item.path for item in ours if "stack" in getattr(item, "fixturenames", ())}
    modules = list(dict.fromkeys(item.path for item in ours))

    def order(item: pytest.Item) -> tuple[int, tuple[bool, bool], int]:
        return (0 if item.path in uses else 1, _kind(getattr(item, "module", None)), modules.index(item.path))

    for i, item in zip(slots, sorted(ours, key=order)):
        items[i] = item


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[stack_mod.Stack]:
    """The running stack of the module's kind (`_kind`), started when none of it runs."""
    kind = _kind(request.module)
    if kind not in _held:
        _stop_held()
        # Our controller is the release's, installed as a user installs it (its pods on the node).
        release = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-e2e-release-")) if kind == (True, True) else None
        try:
            running = local.start(kueue=kind[0], release_dir=release)  # stops what it started if it fails
        except BaseException:
            if release is not None:
                shutil.rmtree(release, ignore_errors=True)
            raise
        running.release_dir = release
        _started.extend(running.plane.groups().items())
        _live.append(running)
        _held[kind] = running
    yield _held[kind]
    try:  # a module that left a process of it dead does not hand it on
        _held[kind].check_alive()
    except Exception:
        _stop_held()


@pytest.fixture(scope="module", autouse=True)
def _no_stack_beside_a_cluster_of_its_own(request: pytest.FixtureRequest) -> None:
    """A module without `stack` (the demo runs a cluster of its own) runs with none held: the
    host has one node slot."""
    if not any("stack" in getattr(item, "fixturenames", ()) for item in request.session.items
               if item.path == request.path):
        _stop_held()


@pytest.fixture(scope="package", autouse=True)
def _stacks_stopped_after_the_package() -> Iterator[None]:
    yield
    _stop_held()


# The Kubeflow SDK's virtualenv, for tests that submit TrainJobs as an SDK user does: the SDK brings
# its own kubernetes client, so it runs as a process of its own, in that venv's python.
BUILD_SDK = pathlib.Path(__file__).resolve().parents[2] / "devcluster" / "build-sdk-venv.sh"


@pytest.fixture(scope="session")
def sdk_python() -> str:
    """The python of the cached Kubeflow SDK virtualenv (devcluster/build-sdk-venv.sh builds it once,
    `make sdk-venv`); a venv that cannot be had fails the test, never skips it."""
    out = subprocess.run(["bash", str(BUILD_SDK)], capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, f"{BUILD_SDK.name} failed (make sdk-venv):\n{out.stderr[-3000:]}"
    python = pathlib.Path(out.stdout.splitlines()[-1])
    assert os.access(python, os.X_OK), f"{BUILD_SDK.name} named {python}, which is not an executable"
    return str(python)


@pytest.fixture
def queues(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[str]:
    """The Kueue objects of `scenario.kueue_queues`, named after the namespace (E2E_KUEUE modules)."""
    with stack.plane.api_client() as api:
        scenario.kueue_queues(api, suffix=e2e_namespace, namespace=e2e_namespace,
                              check_controller=admission.CONTROLLER_NAME)
        yield e2e_namespace


@pytest.fixture
def e2e_namespace(stack: stack_mod.Stack) -> Iterator[str]:
    """A namespace of the test's own, deleted after it once its pods are gone: the next test's
    pods must fit on the node."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    with stack.plane.api_client() as api:
        harness.create_namespace(api, name)
        yield name
        core = kubernetes.client.CoreV1Api(api)
        core.delete_namespace(name)
        deadline = time.monotonic() + NAMESPACE_GONE_SECONDS
        while core.list_namespaced_pod(name).items:
            assert time.monotonic() < deadline, (
                f"the pods of {name} were not gone {NAMESPACE_GONE_SECONDS:.0f} s after its deletion")
            time.sleep(0.5)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and "stack" in getattr(item, "fixturenames", ()):
        for running in _live:
            report.sections.append((f"controller logs ({report.when})", running.logs(lines=150)))
            report.sections.append((f"control plane logs ({report.when})", running.plane.logs(lines=40)))
    return report
