"""Shared pytest fixtures: the real control plane and what tests need from it.

Interface (others import and rely on it; keep it stable):
- `control_plane` (session): a started `harness.ControlPlane` with the Trainer,
  JobSet and Kueue CRDs Established; or, when TEST_KUBECONFIG is set, a
  `harness.ExistingCluster` over that kubeconfig with the same attributes.
- `namespace` (function): the name of a fresh namespace whose `default`
  ServiceAccount exists; deleted after the test (not waited for).
- `api_client` (function): an admin `kubernetes.client.ApiClient`, closed after.

The plane starts lazily, on the first test that asks for it, so a run of pure
unit tests never builds or starts anything. When a test that used the plane
fails, the tail of every component's log is attached to its report.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.controlplane import harness

_planes: list[harness.ControlPlane | harness.ExistingCluster] = []


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        for plane in _planes:
            report.sections.append((f"control plane logs ({report.when})", plane.logs(lines=60)))
    return report
