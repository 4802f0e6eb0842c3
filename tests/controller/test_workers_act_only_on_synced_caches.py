"""Workers act only on synced caches: "not known yet" is never "not ours".

A Controller runs against an apiserver on a real local socket (`holding_apiserver`) that lists a
running trainer pod at once but holds the AdmissionChecks' list. Every other informer has listed
and the pod's key is queued, yet no worker takes it: judging the pod now would read the checks
of ours as none, and take a pod admitted through our check for one that was not. While the list
is held the detector's view of our checks is unknown (None), not empty. Once the list is
answered, the pod is judged (the detector reads its TrainJob) and our check is known.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import kubernetes.client
import pytest

from controller import app, reconcile
from controller import metrics as metrics_mod
from tests.controller import holding_apiserver
from tests.controller.conftest import wait_until
from toolkit import kube, marks, names, paths

NS = "ns"
CHECK = "dispatch-check"
POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "tj-node-0-0", "namespace": NS, "uid": "pod-uid", "resourceVersion": "1",
                 "labels": {names.JOBSET_NAME_LABEL: "tj", marks.REPLICATED_JOB_LABEL: names.TRAINER_REPLICATED_JOB}},
    "spec": {"containers": [{"name": "node"}]},
    "status": {"phase": "Running"},
}
ADMISSION_CHECK = {
    "apiVersion": paths.ADMISSION_CHECK.api_version, "kind": "AdmissionCheck",
    "metadata": {"name": CHECK, "uid": "check-uid", "resourceVersion": "1"},
    "spec": {"controllerName": app.Settings.controller_name},
    "status": {"conditions": [{"type": "Active", "status": "True"}]},
}


@pytest.fixture
def apiserver() -> Iterator[holding_apiserver.HoldingApiserver]:
    server = holding_apiserver.HoldingApiserver().start()
    yield server
    server.close()


def test_no_key_is_processed_until_the_admission_checks_have_listed(apiserver):
    checks = paths.ADMISSION_CHECK.path()
    for res in (paths.WORKLOAD, paths.JOBSET, paths.POD, paths.EVENT, paths.TRAINJOB):
        apiserver.lists[res.path(namespace=NS)] = []
    apiserver.lists[paths.POD.path(namespace=NS)] = [POD]
    apiserver.lists[checks] = [ADMISSION_CHECK]
    holding = True
    apiserver.hold = lambda method, path: holding and path == checks
    trainjob = paths.TRAINJOB.path(namespace=NS, name="tj")

    client = kube.Client(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=apiserver.url)), retries=0)
    controller = reconcile.Controller(client, app.Settings(namespace=NS, workers=2), metrics=metrics_mod.Metrics())
    controller.start()
    try:
        others = [inf for inf in controller.informers if inf is not controller.checks]
        wait_until(lambda: all(inf.synced.is_set() for inf in others), what="every other informer listed")
        wait_until(lambda: apiserver.seen("GET", checks), what="the AdmissionChecks' list sent")
        time.sleep(1.0)  # ample for an idle worker to take a queued key
        assert not controller.checks.synced.is_set()
        assert len(controller.queue) == 1, "the pod's key waits in the queue"
        assert controller._ours() is None
        assert not apiserver.seen("GET", trainjob), "a pod was judged before our checks were known"

        holding = False
        wait_until(lambda: apiserver.seen("GET", trainjob), what="the pod judged once the checks listed")
        assert controller._ours() == {CHECK}
        wait_until(lambda: len(controller.queue) == 0, what="the queue drained")
    finally:
        assert controller.shutdown()
        apiserver.close()
        client.close()
    for thread in controller.threads:
        thread.join(10)
    assert [t.name for t in controller.threads if t.is_alive()] == []
