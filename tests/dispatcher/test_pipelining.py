"""Pipelined claims on the real control plane: a run the backend offers twice at once gets one Job.

The dispatcher keeps several claims in flight. The reference backend's claim
is atomic, but with a lease of 10 ms and nothing saying "running", it offers
a claimed run again to the very next claim after the lease, while the first
claim's create is still in hand: the same run is answered to two claims in
flight at once, again and again. The test plays each driver: half a second
after its Job appears it says "running", so its run leaves the rotation and
the pending ones are reached. Every run must still get exactly one Job
(one uid ever, seen by a watch of our own from before the start), with its
own Secret holding its own token, and be dispatched exactly once.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from tests.dispatcher import cluster
from tests.refbackend import proc

pytestmark = pytest.mark.cluster

RUNS = 12


def test_a_run_offered_twice_at_once_to_claims_in_flight_gets_one_job_and_is_dispatched_once(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str) -> None:
    added: dict[str, set[str]] = collections.defaultdict(set)
    deleted: list[str] = []
    stop = threading.Event()
    watching = threading.Event()
    started: list[threading.Timer] = []
    runs: dict[str, dict[str, str]] = {}
    backend = proc.Backend(lease=0.01, host=cluster.BACKEND_HOST)

    def watch() -> None:
        with cluster.control_plane_client(api_client) as api:
            batch = kubernetes.client.BatchV1Api(api)
            version = batch.list_namespaced_job(namespace).metadata.resource_version
            watching.set()
            while not stop.is_set():
                for event in kubernetes.watch.Watch().stream(batch.list_namespaced_job, namespace,
                                                             resource_version=version, timeout_seconds=1):
                    job = event["object"]
                    version = job.metadata.resource_version
                    if event["type"] == "ADDED":
                        added[job.metadata.name].add(job.metadata.uid)
                        timer = threading.Timer(0.5, backend.report, (runs[job.metadata.name], "running"))
                        timer.start()
                        started.append(timer)
                    elif event["type"] == "DELETED":
                        deleted.append(job.metadata.name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with backend:
        runs.update({f"tcab-run-{r['id']}": r for r in (backend.enqueue() for _ in range(RUNS))})
        d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                               TCAB_DISPATCHER_MAX_INFLIGHT="50", TCAB_DISPATCHER_WORKERS="8",
                               TCAB_DISPATCHER_LOG_LEVEL="info")
        try:
            assert watching.wait(30)
            d.start()
            cluster.wait(lambda: set(added) == set(runs), timeout=60, what="a Job for every run")

            def doubled() -> list[dict[str, Any]]:
                return [line for line in d.lines()
                        if line["message"].startswith("claim offered again while its job is being created")]

            # The case under test happened: a run answered to a claim while its create was in hand.
            cluster.wait(doubled, timeout=60, what="a run offered again while its create was in hand")
            time.sleep(2)  # and the backend keeps offering every run again meanwhile
            lines = d.lines()
            assert d.terminate() == 0
        finally:
            stop.set()
            watcher.join()
            for timer in started:
                timer.join()
            d.close()
        claims = {r["id"]: r["claims"] for r in backend.runs()}

    assert all(len(uids) == 1 for uids in added.values()), {n: u for n, u in added.items() if len(u) > 1}
    assert set(added) == set(runs) and deleted == []
    dispatched = collections.Counter(line["job"] for line in lines if line["message"] == "dispatched")
    assert dispatched == {name: 1 for name in runs}
    assert sum(claims.values()) > 2 * RUNS, claims  # offered again many times over
    for name, run in runs.items():
        job = kubernetes.client.BatchV1Api(api_client).read_namespaced_job(name, namespace)
        secret = kubernetes.client.CoreV1Api(api_client).read_namespaced_secret(name, namespace)
        assert [o.uid for o in secret.metadata.owner_references] == [job.metadata.uid]
        assert cluster.job_token(api_client, namespace, name) == run["token"]
    assert not [line for line in lines if line["level"] in ("warning", "error")]
