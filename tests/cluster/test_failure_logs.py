"""A failing test keeps the control plane's logs: the part of each process's
log written during that test is copied into the test's temp dir, and the tails
are printed in its report (tests/conftest.py). A passing test keeps nothing.

Shown on a pytest run of its own (a subprocess) whose conftest takes the
hooks from tests/conftest.py and starts a small real plane (etcd,
kube-apiserver, kube-controller-manager; no CRDs, no scheduler), registered
as the shared fixture registers its plane.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
PROCESSES = ["etcd.log", "kube-apiserver.log", "kube-controller-manager.log"]

CONFTEST = '''
import pytest

from tests import conftest as shared
from tests.conftest import pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401 - the hooks under test
from devcluster import harness


@pytest.fixture(scope="session")
def control_plane():
    plane = harness.ControlPlane(scheduler=False, crds=False)
    shared._planes.append(plane)
    try:
        yield plane.start()
    finally:
        plane.stop()
        shared._planes.remove(plane)
'''

TESTS = '''
import os
import pathlib


def record(name, tmp_path):
    pathlib.Path(os.environ["OUT"], name).write_text(str(tmp_path))


def test_a_passes(control_plane, tmp_path):
    record("passed", tmp_path)


def test_b_fails(control_plane, tmp_path):
    record("failed", tmp_path)
    assert False, "failing on purpose"


def test_c_fails_without_a_tmp_path(control_plane):
    assert False, "failing on purpose"
'''


def test_a_failing_test_keeps_its_part_of_each_log_in_its_temp_dir(tmp_path: pathlib.Path) -> None:
    inner, out, basetemp = tmp_path / "inner", tmp_path / "out", tmp_path / "basetemp"
    inner.mkdir()
    out.mkdir()
    (inner / "conftest.py").write_text(CONFTEST)
    (inner / "test_inner.py").write_text(TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(out)}
    env.pop("TEST_KUBECONFIG", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:randomly",
                           f"--basetemp={basetemp}", "test_inner.py"],
                          cwd=inner, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 failed, 1 passed" in done.stdout, done.stdout

    passed = pathlib.Path((out / "passed").read_text())
    assert not (passed / "control-plane-logs").exists()

    kept = pathlib.Path((out / "failed").read_text()) / "control-plane-logs"
    assert sorted(p.name for p in kept.iterdir()) == PROCESSES
    apiserver = (kept / "kube-apiserver.log").read_text()
    header, _, body = apiserver.partition("\n")
    # The plane started in the first test, so the failing one keeps only its own part.
    assert re.fullmatch(r"# /\S+/kube-apiserver\.log from byte [1-9]\d*: what was written during this test", header)
    assert "==== start" not in body

    (without,) = basetemp.glob("test_c_fails_without_a_tmp_pat[0-9]*")  # not its "current" symlink
    assert sorted(p.name for p in (without / "control-plane-logs").iterdir()) == PROCESSES

    assert "control plane logs (call)" in done.stdout
    assert f"the logs of this test are kept in {kept}" in done.stdout
    assert "---- kube-apiserver (" in done.stdout
