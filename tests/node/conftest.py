"""Fixtures of the real-node suite.

`node_cluster`: one local cluster (devcluster/local.py: the control plane and the real node; no
Trainer, JobSet or Kueue, so a TrainJob a test stores stays only stored) shared by the modules that
ask for it. Those modules run first (`pytest_collection_modifyitems`), each test in namespaces of
its own (`kit.new_namespace`); after each module they are deleted, their pods at once, and the
pods waited for, so the next module's pods have the node's two CPUs. One node per host: the
shared cluster is stopped before a module that runs a cluster of its own (`trainer_cluster`,
`toolkit cluster up`, a cluster with the release), and after the package.

`trainer_cluster`: a cluster of the module's own with the real Trainer and JobSet controllers."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator

import kubernetes.client
import pytest

from devcluster import stack as stack_mod
from tests import namespaces
from tests.conftest import a_node_cluster
from tests.node import kit

HERE = pathlib.Path(__file__).parent
PODS_GONE_SECONDS = 120.0
_held: list[tuple[contextlib.ExitStack, stack_mod.Stack]] = []


def _shares(item: pytest.Item) -> bool:
    return "node_cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This package's tests, in the slots they were collected into: first the modules that share
    the cluster, then the others; each module's tests in their own order."""
    slots = [i for i, item in enumerate(items) if HERE in pathlib.Path(item.path).parents]
    ours = [items[i] for i in slots]
    sharing = {item.path for item in ours if _shares(item)}
    modules = list(dict.fromkeys(item.path for item in ours))
    for i, item in zip(slots, sorted(ours, key=lambda it: (it.path not in sharing, modules.index(it.path)))):
        items[i] = item


def _stop() -> None:
    while _held:
        exits, _ = _held.pop()
        exits.close()


def _shared() -> stack_mod.Stack:
    if not _held:
        exits = contextlib.ExitStack()
        running = exits.enter_context(a_node_cluster())  # stops what it started if it fails
        _held.append((exits, running))
    return _held[0][1]


def _leave_no_test_namespace(running: stack_mod.Stack) -> None:
    """Delete the module's namespaces (`namespaces.leave`)."""
    with running.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        found = [n.metadata.name for n in core.list_namespace(label_selector=f"{kit.TEST_LABEL}=true").items]
        namespaces.leave(api, found, timeout=PODS_GONE_SECONDS)


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[stack_mod.Stack]:
    running = _shared()
    yield running
    try:  # a module that left a process of it dead, or pods that do not go, does not hand it on
        running.check_alive()
        _leave_no_test_namespace(running)
    except Exception:
        _stop()
        raise


@pytest.fixture(scope="module")
def trainer_cluster() -> Iterator[stack_mod.Stack]:
    with a_node_cluster(training=True) as running:
        yield running


@pytest.fixture(scope="module", autouse=True)
def _no_shared_cluster_beside_one_of_its_own(request: pytest.FixtureRequest) -> None:
    """A module that does not share the cluster runs with none held: the host has one node slot."""
    if not any(_shares(item) for item in request.session.items if item.path == request.path):
        _stop()


@pytest.fixture(scope="package", autouse=True)
def _shared_cluster_stopped_after_the_package() -> Iterator[None]:
    yield
    _stop()
