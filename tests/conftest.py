"""Shared pytest fixtures: the real control plane and what tests need from it.

Interface (others import and rely on it; keep it stable):
- `control_plane` (session): a started `harness.ControlPlane` with the Trainer,
  JobSet and Kueue CRDs Established; or, when TEST_KUBECONFIG is set, a
  `harness.ExistingCluster` over that kubeconfig with the same attributes.
- `namespace` (function): the name of a fresh namespace whose `default`
  ServiceAccount exists; deleted after the test (not waited for).
- `api_client` (function): an admin `kubernetes.client.ApiClient`, closed after.
- `a_node_cluster(**options)` (a context manager): a control plane of its own with
  the real node on it (devcluster/local.py: kubelet, kube-proxy, containerd), no
  Kueue (nor Trainer and JobSet unless `training=True`): for tests whose pods must
  really run. One node per host, so it waits for the host's node slot; the node is
  stopped and the host swept when it ends. A suite overrides `control_plane` with
  it to run on the node (tests/dispatcher/conftest.py); tests/node shares one.

The plane starts lazily, on the first test that asks for it, so a run of pure
unit tests never builds or starts anything. When a test that used the plane
fails, the part of every component's log written during that test is copied
into the test's temp dir (`tmp_path/control-plane-logs/`, made when the test
has no tmp_path of its own), and the tail of every log is attached to its
report. The session plane's own logs go with its workdir when it stops.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import re
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from devcluster import harness, local
from devcluster import stack as stack_mod

_planes: list[harness.ControlPlane | harness.ExistingCluster] = []
# Each log file's size when the test's setup began: the test's part starts there.
_log_offsets = pytest.StashKey[dict[pathlib.Path, int]]()
LOGS_DIR_NAME = "control-plane-logs"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[harness.ControlPlane | harness.ExistingCluster]:
    existing = os.environ.get("TEST_KUBECONFIG")
    plane: harness.ControlPlane | harness.ExistingCluster
    plane = harness.ExistingCluster(existing) if existing else harness.ControlPlane()
    _planes.append(plane)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
        _planes.remove(plane)


@contextlib.contextmanager
def a_node_cluster(*, training: bool = False, **options: Any) -> Iterator[stack_mod.Stack]:
    """The local cluster without Kueue (and without Trainer and JobSet unless TRAINING): the control
    plane and the real node, its logs kept per test like the session plane's. OPTIONS go to
    `local.start` (e.g. the release's directory)."""
    running = local.start(kueue=False, training=training, **options)
    _planes.append(running.plane)
    try:
        yield running
    finally:
        _planes.remove(running.plane)
        running.stop()
        running.plane.stop()


@pytest.fixture
def api_client(control_plane: harness.ControlPlane | harness.ExistingCluster) -> Iterator[kubernetes.client.ApiClient]:
    with control_plane.api_client() as api:
        yield api


@pytest.fixture
def namespace(control_plane: harness.ControlPlane | harness.ExistingCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with control_plane.api_client() as api:
        harness.create_namespace(api, name, labels={"dispatch.phpboyscout.uk/test": "true"})
        try:
            yield name
        finally:
            kubernetes.client.CoreV1Api(api).delete_namespace(name)


def _log_files(plane: harness.ControlPlane | harness.ExistingCluster) -> list[pathlib.Path]:
    return sorted(p for p in pathlib.Path(plane.log_dir).glob("*.log") if p.is_file())


def _test_tmp_path(item: pytest.Item) -> pathlib.Path:
    """The test's tmp_path; one made as pytest makes it when the test has none."""
    funcargs = getattr(item, "funcargs", {})
    if isinstance(funcargs.get("tmp_path"), pathlib.Path):
        return pathlib.Path(funcargs["tmp_path"])
    factory: pytest.TempPathFactory = item.config._tmp_path_factory  # what the tmp_path fixture uses
    return factory.mktemp(re.sub(r"[\W]", "_", item.name)[:30], numbered=True)


def _keep_logs(item: pytest.Item, plane: harness.ControlPlane | harness.ExistingCluster) -> pathlib.Path | None:
    """Copy this test's part of each log into the test's temp dir; None when there are no logs."""
    files = _log_files(plane)
    if not files:
        return None  # an ExistingCluster: no processes of ours
    offsets = item.stash.get(_log_offsets, {})
    dest = _test_tmp_path(item) / LOGS_DIR_NAME
    dest.mkdir(parents=True, exist_ok=True)
    for path in files:
        start = offsets.get(path, 0)
        with open(path, "rb") as source, open(dest / path.name, "wb") as copy:
            copy.write(f"# {path} from byte {start}: what was written during this test\n".encode())
            source.seek(start)
            while chunk := source.read(1 << 20):
                copy.write(chunk)
    return dest


_exit_status = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_exit_status] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the run with pytest's own status once every report is written (the summary, the JUnit
    XML), after the exit handlers, without the interpreter's finalization: a native library's background threads (the
    object-store client's runtime, loaded by the fence's tests) can abort the process while the
    interpreter tears itself down, after every test has passed, and that SIGABRT would be the run's
    status."""
    status = config.stash.get(_exit_status, None)
    if status is None:
        return
    atexit._run_exitfuncs()  # what a normal exit runs first (a control plane left running is stopped)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    offsets = {}
    for plane in _planes:
        for path in _log_files(plane):
            try:
                offsets[path] = path.stat().st_size
            except OSError:
                pass  # a plane being stopped: nothing of this test's to keep there
    item.stash[_log_offsets] = offsets  # a plane started by this test's setup has none: from byte 0
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        used = getattr(item, "funcargs", {}).get("control_plane")
        for plane in [used] if used is not None else list(_planes):
            try:
                kept = _keep_logs(item, plane)
            except OSError as e:  # never let keeping the logs hide the failure itself
                kept, note = None, f"(could not keep the logs: {e})\n"
            else:
                note = f"the logs of this test are kept in {kept}\n" if kept else ""
            report.sections.append((f"control plane logs ({report.when})", note + plane.logs(lines=60)))
    return report
