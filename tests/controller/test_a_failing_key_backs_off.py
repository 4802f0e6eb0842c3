"""A key whose pass keeps failing backs off instead of retrying every second, and a TrainJob whose
annotations the apiserver refuses (AnnotationsRefused: only a person can make room) is logged once
per streak, in one line, not once a second with a traceback.

A real Controller and its worker loop against an apiserver on a real local socket
(`holding_apiserver`); the failure is injected where the pass would meet it (the detector's step),
so what is under test is the loop's retry schedule, the only thing this changes."""

from __future__ import annotations

import logging
import time

import kubernetes.client
import pytest

from controller import app, reconcile
from controller import metrics as metrics_mod
from tests.controller import holding_apiserver
from tests.controller.conftest import wait_until
from tests.controller.test_workers_act_only_on_synced_caches import ADMISSION_CHECK, NS, POD
from toolkit import adapter, kube, paths


@pytest.fixture
def controller():
    server = holding_apiserver.HoldingApiserver().start()
    for res in (paths.WORKLOAD, paths.JOBSET, paths.POD, paths.EVENT, paths.TRAINJOB):
        server.lists[res.path(namespace=NS)] = []
    server.lists[paths.POD.path(namespace=NS)] = [POD]
    server.lists[paths.ADMISSION_CHECK.path()] = [ADMISSION_CHECK]
    client = kube.Client(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url)), retries=0)
    made = reconcile.Controller(client, app.Settings(namespace=NS, workers=1), metrics=metrics_mod.Metrics())
    yield made
    assert made.shutdown()
    server.close()
    client.close()
    for thread in made.threads:
        thread.join(10)


def test_refused_annotations_back_off_and_are_logged_once(controller, caplog):
    passes: list[float] = []

    def refused(pod):
        passes.append(time.monotonic())
        raise adapter.AnnotationsRefused("TrainJob ns/tj: our annotations are 196608 bytes, above the budget")

    controller.detector.pod = refused
    with caplog.at_level(logging.DEBUG, logger="controller"):
        controller.start()
        wait_until(lambda: len(passes) >= 4, what="four passes", timeout=30)
    gaps = [b - a for a, b in zip(passes, passes[1:])]
    # 1 s doubling, each drawn from the upper half of its ceiling: [0.5, 1], [1, 2], [2, 4]
    assert 0.45 <= gaps[0] <= 1.5 and 0.95 <= gaps[1] <= 2.5 and 1.95 <= gaps[2] <= 4.5, gaps
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "annotations refused" in r.message]
    assert len(warnings) == 1 and warnings[0].exc_info is None


def test_a_key_that_passes_again_starts_its_backoff_afresh(controller):
    passes: list[float] = []

    def flaky(pod):
        passes.append(time.monotonic())
        if len(passes) in (1, 2, 4):
            raise kube.Unavailable("connection refused")
        if len(passes) == 3:
            controller.queue.add(("pod", NS, POD["metadata"]["name"]), pod)  # its next event

    controller.detector.pod = flaky
    controller.start()
    wait_until(lambda: len(passes) >= 5, what="five passes", timeout=30)
    # failed twice (waits of [0.5, 1] then [1, 2]), passed, failed again: the wait is back to [0.5, 1]
    assert 0.95 <= passes[2] - passes[1] <= 2.5
    assert 0.45 <= passes[4] - passes[3] <= 1.5
    assert controller._failing == {}
