"""One term of the leader's work: the informers, the queue and the workers, as drawn in
`controller/app.py`; a new `Controller` each time the process leads, never resumed.

The handlers run on the informers' threads and only enqueue: a (kind, namespace, name) key with
the latest object, deduplicated by key (`queue.WorkQueue`). The workers pass each key to its
stage: a Workload to `admission.reconcile_workload` (raise A, then set our check Ready), with the
latest copies the caches hold of it and of its TrainJob (the TrainJob informer only fills a
cache: nothing is queued for a TrainJob), an
AdmissionCheck of ours to `admission.ensure_active`, a JobSet, a trainer pod or a sidecar's
Event to the `detector.Detector`. One worker holds a key at a time.

Workers act only on synced caches: "not known yet" is never "not ours". The informers start with
the workers, and the handlers queue keys from the first list on, but no worker takes a key until
every informer has listed once (`_caches_synced`); what arrives meanwhile waits in the queue.
`_ours`, the detector's view of our AdmissionChecks, is None (unknown) until their informer has
listed, never an empty set that would judge a running Kueue pod as admitted by no check of ours.

A key whose pass fails backs off (1 s doubling, at most RETRY_CAP; ANNOTATIONS_RETRY_CAP for a
TrainJob whose annotations the apiserver refuses, logged in one line once per streak: only a
person frees room) and starts afresh after a pass that succeeds. The caches keep only what the
handlers and the detector read (`views`). `shutdown` lets the workers finish the step they are
in; the process decides what a worker still in its step after the grace means (`app.run`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from toolkit import adapter, backoff, flagmark, informer, kube, marks, names, paths
from controller import admission, detector, queue, views
from controller import metrics as metrics_mod
from controller import settings as settings_mod

Obj = dict[str, Any]
log = logging.getLogger("controller")
# The longest wait before a failed key's next pass, and for a TrainJob whose annotations the
# apiserver refuses (full: a person must make room, so trying every second only adds load).
RETRY_CAP = 60.0
ANNOTATIONS_RETRY_CAP = 300.0


class Controller:
    """The leader's work: informers, queue, workers."""

    def __init__(self, client: kube.Client, settings: settings_mod.Settings, *,
                 metrics: metrics_mod.Metrics) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.stop = threading.Event()
        self.queue = queue.WorkQueue()
        self.ours: set[str] = set()
        self.detector = detector.Detector(client, metrics=metrics, ours=self._ours)
        self._ours_lock = threading.Lock()
        # Workload uid -> when it was first seen waiting on our check (quota
        # reserved, check Pending): the start of its ready latency. One entry
        # per Workload, whatever its number of versions; dropped when it is
        # processed, when a version no longer waits (Ready, evicted) and when
        # it is deleted, so it holds at most the Workloads waiting now.
        # Written by the workload informer's thread, popped by workers
        # (single dict operations, atomic under the GIL).
        self._seen_reserved: dict[str, float] = {}
        metrics.awaiting_ready.set_function(lambda: len(self._seen_reserved))
        # JobSet key -> the UID last handed to the detector. Its rule reads only a JobSet's UID
        # (recorded when first seen, a different one flagged), which never changes for one object:
        # the status updates a JobSet gets while it runs carry nothing for it, and each would cost
        # the worker a read of the TrainJob, ahead of admissions in the queue (bench/admission).
        # Dropped when the JobSet is deleted; written by the JobSet informer's thread only.
        self._jobset_uids: dict[str, str] = {}
        # Workload keys whose next pass reads the Workload and its TrainJob afresh instead of the
        # informers' copies: a pass a worker queued again (stale, refused, an error). Set and popped
        # by workers (one worker holds a key at a time), dropped when the Workload is deleted: at
        # most one entry per Workload.
        self._read_fresh: dict[tuple[str, str, str], bool] = {}
        # Workload key -> the marker (uid/resourceVersion) of the version our last Ready was written on. A
        # copy of that very version, queued again (a write Kueue made during the pass, a relist)
        # still shows our check Pending, and is known to be approved: no pass, no second raise.
        # Touched by the worker holding the key; dropped with the Workload: one entry per Workload.
        self._approved: dict[tuple[str, str, str], str] = {}
        # Keys whose last pass failed, with their backoff; dropped at their next success. Touched by
        # the worker holding the key only.
        self._failing: dict[tuple[str, str, str], backoff.Backoff] = {}
        ns = settings.namespace or None
        mk = lambda res, handler, **kw: informer.Informer(  # noqa: E731
            client, res, handler=handler, namespace=ns if res.namespaced else None, stop=self.stop, **kw
        )
        # Each cache keeps only what is read of its kind (`views`): no Workload's or JobSet's spec,
        # no managedFields, of a TrainJob what the raise reads, of a pod's spec only what the
        # detector judges (bench/admission).
        self.checks = mk(paths.ADMISSION_CHECK, self._on_check)
        # The caches that hold one object per TrainJob keep them as compact JSON (`informer`).
        self.workloads = mk(paths.WORKLOAD, self._on_workload, transform=views.workload_view, compact=True)
        self.trainjobs = mk(paths.TRAINJOB, lambda kind, obj: None, transform=views.trainjob_view, compact=True)
        self.informers = [
            self.checks,
            self.workloads,
            mk(paths.JOBSET, self._on_jobset, transform=views.metadata_only, compact=True),
            mk(paths.POD, self._on_pod, label_selector=names.JOBSET_NAME_LABEL, transform=views.pod_view),
            mk(paths.EVENT, self._on_event, field_selector=f"reason={names.SIDECAR_VIOLATION_REASON}"),
        ]
        # The flagged TrainJobs, for the gauge only (nothing is queued): a watch filtered by the
        # flag's label, so its cache holds the flagged ones and nothing else, names alone.
        self.flagged = mk(paths.TRAINJOB, lambda kind, obj: None, label_selector=flagmark.SELECTOR,
                          transform=views.names_only)
        self.informers.extend([self.flagged, self.trainjobs])
        self.threads: list[threading.Thread] = []

    # -- handlers (informer threads): cheap, they only enqueue ----------

    def _on_check(self, kind: str, check: Obj) -> None:
        name = check["metadata"]["name"]
        mine = (check.get("spec") or {}).get("controllerName") == self.settings.controller_name
        with self._ours_lock:
            before = set(self.ours)
            if kind == "DELETED" or not mine:
                self.ours.discard(name)
            else:
                self.ours.add(name)
            changed = before != self.ours
        if mine and kind != "DELETED":
            self.queue.add(("check", "", name), check)
        if changed:  # a check became ours: Workloads waiting on it need a pass
            for wl in self.workloads.items():
                self._on_workload("SYNC", wl)

    def _on_workload(self, kind: str, wl: Obj) -> None:
        meta = wl["metadata"]
        if kind == "DELETED":
            self._seen_reserved.pop(meta["uid"], None)
            self._read_fresh.pop(("workload", meta["namespace"], meta["name"]), None)
            self._approved.pop(("workload", meta["namespace"], meta["name"]), None)
            return
        with self._ours_lock:
            ours = set(self.ours)
        if admission.pending_checks(wl, ours):
            # setdefault: the clock starts at the first version that waits, not the last
            self._seen_reserved.setdefault(meta["uid"], time.monotonic())
            self.queue.add(("workload", meta["namespace"], meta["name"]), wl)
            return
        # Not waiting (any more): a later reservation starts a new clock.
        self._seen_reserved.pop(meta["uid"], None)
        if admission.in_eviction_window(wl):
            log.info("evicted, check left Pending until quota is reserved again",
                     extra={"workload": f"{meta['namespace']}/{meta['name']}"})

    def _on_jobset(self, kind: str, js: Obj) -> None:
        meta = js["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if kind == "DELETED":
            self._jobset_uids.pop(key, None)
        elif marks.owner_trainjob(js) and self._jobset_uids.get(key) != meta["uid"]:
            self._jobset_uids[key] = meta["uid"]
            self.queue.add(("jobset", meta["namespace"], meta["name"]), js)

    def _on_pod(self, kind: str, pod: Obj) -> None:
        if kind != "DELETED":
            self.queue.add(("pod", pod["metadata"]["namespace"], pod["metadata"]["name"]), pod)

    def _on_event(self, kind: str, event: Obj) -> None:
        if kind != "DELETED":
            self.queue.add(("event", event["metadata"]["namespace"], event["metadata"]["name"]), event)

    def _ours(self) -> set[str] | None:
        """The names of our AdmissionChecks, or None while their informer has not listed them: an
        empty set then would judge every Kueue pod as not admitted through our check."""
        if not self.checks.synced.is_set():
            return None
        with self._ours_lock:
            return set(self.ours)

    # -- workers ------------------------------------------------------

    def _process(self, key: tuple[str, str, str], obj: Obj) -> None:
        kind, namespace, name = key
        if kind == "check":
            admission.ensure_active(self.client, obj)
        elif kind == "workload":
            self._workload(key, obj)
        elif kind == "jobset":
            self.detector.jobset(obj)
        elif kind == "pod":
            self.detector.pod(obj)
        elif kind == "event":
            self.detector.event(obj)

    def _workload(self, key: tuple[str, str, str], obj: Obj) -> None:
        _, namespace, name = key
        with self._ours_lock:
            ours = set(self.ours)
        # The latest copy the cache holds (the one queued may be older), unless this pass was
        # queued again by a worker: then the Workload and its TrainJob are read afresh.
        fresh = bool(self._read_fresh.pop(key, None))
        seen = None if fresh else (self.workloads.get(f"{namespace}/{name}") or obj)
        if seen is not None and self._approved.get(key) == admission.marker(seen):
            return  # the very version our Ready was written on
        uid = obj["metadata"]["uid"]
        # Read before the write: our own Ready comes back as a watch event
        # that drops the entry, maybe before this worker gets here again.
        started = self._seen_reserved.get(uid)
        owner = marks.owner_trainjob(obj)
        trainjob = None if fresh or owner is None else self.trainjobs.get(f"{namespace}/{owner}")
        outcome = admission.reconcile_workload(
            self.client, namespace=namespace, name=name, ours=ours, seen=seen, trainjob=trainjob,
            counter_namespace=self.settings.lease_namespace,
        )
        if outcome.conflicts:
            self.metrics.conflicts.inc(outcome.conflicts)
        if outcome.raised:
            self.metrics.raises.inc()
        if outcome.action in ("ready", "skipped", "untouched", "rejected"):
            self._seen_reserved.pop(uid, None)
        if outcome.action == "ready" and outcome.version is not None:
            self._approved[key] = outcome.version
        if outcome.action == "ready":
            if started is not None:
                queue_name = ((obj.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""
                self.metrics.ready_latency.labels(cluster_queue=queue_name).observe(time.monotonic() - started)
            log.info(
                "check ready",
                extra={"workload": f"{namespace}/{name}", "admission": outcome.admission, "raised": outcome.raised},
            )
        elif outcome.action in ("untouched", "rejected"):
            log.info("check set without a raise", extra={"workload": f"{namespace}/{name}", "outcome": outcome.action})
        elif outcome.action == "stale":
            self._read_fresh[key] = True
            self.queue.add_after(key, obj, 0.05)
        elif outcome.action == "refused":
            # e.g. the TrainJob is not suspended: look again later, never approve
            self._read_fresh[key] = True
            self.queue.add_after(key, obj, 2.0)

    def _caches_synced(self) -> bool:
        """Block until every informer has listed once (True) or the term ends (False)."""
        for inf in self.informers:
            while not inf.synced.wait(0.1):
                if self.stop.is_set():
                    return False
        return not self.stop.is_set()

    def _worker(self) -> None:
        # A key queued before every cache has listed waits in the queue: a step judged against a
        # cache still empty would take "not known yet" for "not ours" (no check of ours, no pod).
        if not self._caches_synced():
            return
        while not self.stop.is_set():
            got = self.queue.get(timeout=0.5)
            if got is None:
                continue
            key, obj = got
            try:
                self._process(key, obj)  # type: ignore[arg-type]
                self._failing.pop(key, None)  # type: ignore[arg-type]
            except Exception as exc:
                self.metrics.reconcile_errors.labels(kind=key[0]).inc()  # type: ignore[index]
                # A key that keeps failing backs off (1 s doubling, at most RETRY_CAP; 5 minutes for
                # a TrainJob whose annotations the apiserver refuses: only a person frees room).
                streak = self._failing.get(key)  # type: ignore[call-overload]
                refused = isinstance(exc, adapter.AnnotationsRefused)
                if streak is None:
                    streak = self._failing[key] = backoff.Backoff(  # type: ignore[index]
                        base=1.0, cap=ANNOTATIONS_RETRY_CAP if refused else RETRY_CAP)
                where = {"key": "/".join(key), "retry": streak.attempt + 1}  # type: ignore[arg-type]
                if refused:
                    # One line, not a traceback: it names the TrainJob, our bytes and the budget.
                    (log.warning if streak.attempt == 0 else log.debug)(
                        "annotations refused, backing off: %s", exc, extra=where)
                else:
                    log.exception("reconcile failed, retrying", extra=where)
                if key[0] == "workload":  # type: ignore[index]
                    self._read_fresh[key] = True  # type: ignore[index]
                self.queue.add_after(key, obj, streak.next_delay())
            finally:
                self.queue.done(key)

    def start(self) -> None:
        for inf in self.informers:
            self.threads.append(inf.start())
        for i in range(self.settings.workers):
            t = threading.Thread(target=self._worker, name=f"worker-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(inf.synced.wait(max(0.0, deadline - time.monotonic())) for inf in self.informers)

    def shutdown(self, timeout: float = 2.0) -> bool:
        """Let workers finish the step they are in (at most TIMEOUT in all); True when every one
        has. Informers stop at their watch's next event or its end (daemon threads: a process that
        exits does not wait for them); what they deliver meanwhile goes to this closed queue."""
        self.stop.set()
        self.queue.close()
        deadline = time.monotonic() + timeout
        workers = [t for t in self.threads if t.name.startswith("worker-")]
        for t in workers:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in workers)
