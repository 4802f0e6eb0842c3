"""Fixtures of the real-node suite: `trainer_cluster`, a control plane with the real Trainer and
JobSet controllers and the real node (devcluster/local.py, no Kueue), started once per module
that asks for it; `node_cluster` (tests/conftest.py) is the same without Trainer and JobSet.
One node per host: a module waits for the host's node slot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import local
from devcluster import stack as stack_mod


@pytest.fixture(scope="module")
def trainer_cluster() -> Iterator[stack_mod.Stack]:
    running = local.start(kueue=False)  # stops what it started if it fails
    try:
        yield running
    finally:
        running.stop()
        running.plane.stop()
