"""A game jam through the real dispatcher, on the real control plane, against the reference backend.

The backend holds back a jam entry while another entry of the same jam and
model is in flight (any harness), so the dispatcher, which knows nothing of
jams, creates the entries' driver Jobs strictly one after the other, while
every other run goes on being dispatched. The drivers run on the real node
(the test driver image): each reports for itself, the test only lets a
waiting one go on, and the second entry's driver is OOM-killed by the kernel.
"""

from __future__ import annotations

import threading
import time

import kubernetes.client
import pytest

from dispatcher import jobspec
from tests.dispatcher import cluster
from tests.refbackend import proc

pytestmark = pytest.mark.cluster

TERMINAL = ("succeeded", "failed", "cancelled")


class Observer(threading.Thread):
    """Checks the invariant all along: list the Jobs, then read the backend. An entry's Job in the
    list means its predecessor had ended before that list, so the backend, read after it, must say so."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, backend: proc.Backend,
                 entries: list[dict[str, str]]) -> None:
        super().__init__(daemon=True)
        self.api, self.namespace, self.backend, self.entries = api, namespace, backend, entries
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.first_seen: dict[str, float] = {}
        self.rounds = 0

    def run(self) -> None:
        names = [jobspec.job_name(e["id"]) for e in self.entries]
        while not self.stop.is_set():
            try:
                jobs = {j.metadata.name for j in cluster.jobs(self.api, self.namespace)}
                states = {r["id"]: r["state"] for r in self.backend.runs()}
            except Exception as e:  # a blip of the apiserver is not a finding; keep looking
                self.violations.append(f"observer could not look: {type(e).__name__}: {e}")
                time.sleep(0.1)
                continue
            now = time.monotonic()
            for name in jobs:
                self.first_seen.setdefault(name, now)
            for before, (entry, name) in zip(self.entries, list(zip(self.entries, names))[1:]):
                if name in jobs and states[before["id"]] not in TERMINAL:
                    self.violations.append(f"{name} exists while {before['id']} is {states[before['id']]}")
            in_flight = [e["id"] for e in self.entries if states[e["id"]] in ("claimed", "running")]
            if len(in_flight) > 1:
                self.violations.append(f"two entries in flight at once: {in_flight}")
            self.rounds += 1
            time.sleep(0.05)


def test_a_jam_is_dispatched_strictly_one_entry_after_the_other_while_other_runs_proceed(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str) -> None:
    cluster.limit_memory(api_client, namespace)
    with proc.Backend(host=cluster.BACKEND_HOST) as backend:
        # Three entries of one (jam, model) on two harnesses; around them, runs the jam must not hold up.
        # The first succeeds when let go, the second is OOM-killed when let go, the third succeeds.
        drivers = [cluster.launch("succeed", running=True, wait=True, entry=0),
                   cluster.launch("oom", running=True, wait=True, entry=1),
                   cluster.launch("succeed", running=True, entry=2)]
        entries = [backend.enqueue(harness=("h1", "h2", "h1")[i], launch_request=drivers[i],
                                   jam="spring", model="m1") for i in range(3)]
        others = [backend.enqueue(harness="h1"), backend.enqueue(harness="h2"),
                  backend.enqueue(harness="h2", jam="spring", model="m2")]
        job = {r["id"]: jobspec.job_name(r["id"]) for r in entries + others}
        d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                               TCAB_DISPATCHER_MAX_INFLIGHT="10",
                               TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST=cluster.DRIVER_MEMORY_REQUEST)
        observer = Observer(cluster.control_plane_client(api_client), namespace, backend, entries)
        try:
            d.start()
            observer.start()

            def names() -> set[str]:
                return {j.metadata.name for j in cluster.jobs(api_client, namespace)}

            # The first entry and every other run are dispatched; the second and third entries wait.
            cluster.wait(lambda: {job[entries[0]["id"]], *(job[o["id"]] for o in others)} <= names(),
                         what="the first entry's Job and the other runs' Jobs")
            cluster.wait(lambda: backend.get(entries[0]["id"])["state"] == "running", timeout=60,
                         what="the first entry's driver reporting running")
            late = backend.enqueue(harness="h1")  # a run enqueued after the jam's entries...
            cluster.wait(lambda: jobspec.job_name(late["id"]) in names(), what="a later run's Job")
            time.sleep(2)  # ...goes past them: ~20 claims at a 0.1 s poll, none gave out an entry
            assert not {job[entries[1]["id"]], job[entries[2]["id"]]} & names()

            # Entry 1 ends well (its driver says so, then exits 0): entry 2 follows, alone.
            pod = cluster.driver_pod(api_client, namespace, job[entries[0]["id"]])
            ended = time.monotonic()
            cluster.release(api_client, namespace, pod.metadata.name)
            # (Waited for through the observer, whose first sight of the Job is what the order is read from.)
            cluster.wait(lambda: job[entries[1]["id"]] in observer.first_seen, what="the second entry's Job")
            assert observer.first_seen[job[entries[1]["id"]]] > ended
            first_end = cluster.wait(lambda: cluster.terminated(cluster.driver_pod(
                api_client, namespace, job[entries[0]["id"]])), timeout=30, what="the first entry's driver to exit")
            assert first_end.exit_code == 0
            assert backend.get(entries[0]["id"])["state"] == "succeeded"
            cluster.wait(lambda: backend.get(entries[1]["id"])["state"] == "running", timeout=60,
                         what="the second entry's driver reporting running")
            time.sleep(1.5)
            assert job[entries[2]["id"]] not in names()

            # Entry 2's driver is OOM-killed: the dispatcher's own death report ends it, and entry 3 follows.
            pod = cluster.driver_pod(api_client, namespace, job[entries[1]["id"]])
            cluster.release(api_client, namespace, pod.metadata.name)
            cluster.wait(lambda: job[entries[2]["id"]] in observer.first_seen, timeout=60, what="the third entry's Job")
            second = backend.get(entries[1]["id"])
            assert second["state"] == "failed"
            error = second["reports"][-1]["body"]["error"]
            assert (error["reason"], error["exit_code"]) == ("OOMKilled", 137)
            assert observer.first_seen[job[entries[2]["id"]]] > observer.first_seen[job[entries[1]["id"]]]
            cluster.wait(lambda: backend.get(entries[2]["id"])["state"] == "succeeded", timeout=60,
                         what="the third entry's driver reporting succeeded")

            # Each entry was claimed once, and in enqueue order.
            assert [backend.get(e["id"])["claims"] for e in entries] == [1, 1, 1]
            order = sorted(entries, key=lambda e: observer.first_seen[job[e["id"]]])
            assert [e["id"] for e in order] == [e["id"] for e in entries]
            assert d.terminate() == 0
        finally:
            observer.stop.set()
            observer.join(timeout=10)
            d.close()
        assert not observer.is_alive()
        assert observer.rounds > 20
        assert observer.violations == []
