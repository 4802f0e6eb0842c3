"""The dispatcher's cluster tests run on the local cluster's real node.

`control_plane` is the plane of one node cluster shared by every module of this package
(`tests.conftest.a_node_cluster`): every test works in a namespace of its own (`namespace`), so
the modules need no cluster each, and the apiserver a test stops it starts again. `namespace` and
`api_client` follow it, so every driver pod a test's dispatcher creates is started, run and ended
by the real kubelet (containerd, runc), and `pods/log` and `pods/exec` go to it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import harness
from devcluster import stack as stack_mod
from tests.conftest import a_node_cluster


@pytest.fixture(scope="package")
def dispatcher_cluster() -> Iterator[stack_mod.Stack]:
    with a_node_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def control_plane(dispatcher_cluster: stack_mod.Stack) -> harness.ControlPlane:
    return dispatcher_cluster.plane
