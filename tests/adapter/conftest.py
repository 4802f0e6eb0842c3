"""The Kueue plane the adapter's Kueue-mode suites share: a control plane of its own with the real
Trainer, JobSet and Kueue controllers and kwok's simulated node for the pods (their webhooks change
how every TrainJob and pod is admitted, which the session plane's suites must not see). Each test
works in namespaces, queues and checks of its own on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import harness, stack as stack_mod


@pytest.fixture(scope="session")
def kueue_stack() -> Iterator[stack_mod.Stack]:
    """Trainer, JobSet, Kueue and kwok on a plane of their own, with one kwok node."""
    plane = harness.ControlPlane()
    plane.start()
    try:
        running = stack_mod.Stack(plane, kueue=True, kwok=True).start()
        try:
            with plane.api_client() as api:
                running.add_node(api, "kwok-0")
            yield running
        finally:
            running.stop()
    finally:
        plane.stop()
