"""The dispatcher's cluster tests run on the local cluster's real node.

`control_plane` is the node cluster's plane (tests/conftest.py `node_cluster`, one per module):
`namespace` and `api_client` follow it, so every driver pod a test's dispatcher creates is started,
run and ended by the real kubelet (containerd, runc), and `pods/log` and `pods/exec` go to it.
"""

from __future__ import annotations

import pytest

from devcluster import harness
from devcluster import stack as stack_mod


@pytest.fixture(scope="module")
def control_plane(node_cluster: stack_mod.Stack) -> harness.ControlPlane:
    return node_cluster.plane
