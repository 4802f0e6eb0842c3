"""The Kueue plane the adapter's Kueue-mode suites share: a control plane of its own with the real
Trainer, JobSet and Kueue controllers and kwok's simulated node for the pods (their webhooks change
how every TrainJob and pod is admitted, which the session plane's suites must not see). Each test
works in namespaces, queues and checks of its own on it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from controller import admission
from devcluster import harness, scenario as flow, stack as stack_mod
from tests.controller.conftest import ControllerProcess


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


@contextlib.contextmanager
def checked_queue(stack: stack_mod.Stack, api: object, namespace: str, *,
                  labels: dict[str, str] | None = None) -> Iterator[tuple[flow.Scenario, ControllerProcess]]:
    """NAMESPACE (made here, with LABELS) with a LocalQueue `lq` to a ClusterQueue that lists the
    AdmissionCheck `ac-NAMESPACE` of our controller, which runs as a real process watching it, and
    a converted TrainingRuntime `kueue`. The controller logs no error, or the test fails."""
    harness.create_namespace(api, namespace, labels=labels)
    flow.kueue_queues(api, suffix=namespace, namespace=namespace, check_controller=admission.CONTROLLER_NAME,
                      flavor=stack_mod.KWOK_FLAVOR)
    controller = ControllerProcess(kubeconfig=stack.plane.kubeconfig, namespace=namespace, leader_elect=False,
                                   extra=[])
    try:
        controller.wait_ready()
        sc = flow.Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("kueue", cpu="1"))
        yield sc, controller
    finally:
        controller.stop()
        errors = [line for line in controller.lines if line.get("level") == "error"]
        assert not errors, controller.log_tail()
