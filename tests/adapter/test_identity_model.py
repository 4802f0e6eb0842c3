"""A model test of the identity (docs/prologue.md, docs/adapter.md) and of the
way back from a foreign flag (`adopt`).

A hypothesis state machine drives one TrainJob through the events that end
one execution and begin another (JobSet restart, preemption and
re-admission, hold and release, an unsuspend by hand), the ones that reset a
counter from outside (patch rewritten or deleted, the floor edited or
deleted, the history made unreadable, JobSet deleted and recreated), a raise
that races another, the admission check's Ready failing after its raise
(refused by a policy, an error, the controller stopped between the two
writes) and its next pass, a pass handed any earlier version of the Workload
(the informer's copy, from a watch that lags), and a person's `adopt` after a
flag.

Detection is late, as late as it really can be. The sidecar's first check
runs before the trainer starts (its startupProbe), but it only reports: the
flag is written by the controller when it gets to the report, to the pod or
to the JobSet, which can be any time after the execution started, while it
runs or after it ended. So the controller's work is queued when its cause
appears and done at an arbitrary later step (`detector_catches_up`), with
what its work queue would hand it then: each pod's latest version (a pod
whose execution is over has ended: it is recorded in the history and its
JobSet UID label is compared, but it is not flagged by the floor or repeat
rules, which need a fresh read to show it running), and the JobSet's latest
version (a quick delete and recreate merges into one item, so the first
JobSet's own event may never be seen). Pods are handled in the order they
appeared, JobSets too; the two kinds interleave in any order.

The property, over every trace, once detection has caught up:

    each execution's R is greater than every earlier execution's R,
    or the TrainJob was flagged foreign at some moment between that
    execution's start and now (before it ran, while it ran, or after),
    or the execution is an unseen twin created within the clock margin of
    the raise before it: the controller never saw its pod running, its A, J
    and JobSet are an earlier execution's, and an ended pod is judged by the
    floor of the raises more than the margin before its creation (the
    apiserver's clocks have second resolution and its replicas may disagree
    by the margin; docs/adapter.md, "What detection cannot see").

And the admission check's own invariant, at every Ready it writes, whatever
detection sees: the A it carries is above every A an execution has started
with since a person last edited the patch, the floor or the history.

And no flag without a reset: a trace in which nobody rewrote or deleted the
patch or replaced the JobSet never flags the TrainJob (the ended pods of a
preempted execution, judged after the next raise, are not a reset).

A flag counts only while it stands: an adoption clears it, so an execution
that starts after an adoption needs a flag raised after it. Hence, for adopt:
after any trace, an adopt followed by any further events never yields an R
at or below one already seen, unless a new reset was flagged. The model's
person adopts only once the controller has caught up (its history is what
adopt reads; docs/adapter.md says what bounds R when it has not).

It runs on the pure core, not the apiserver: the store below is an
in-memory stand-in that keeps only what the property depends on, the
resourceVersion precondition of an update or a merge patch (a stale write is
refused with kube.Conflict). Everything else is the real code:
`adapter.raise_admission` with `kube.Client.read_modify_write` (the 409
loop), `raising.raised`, `adapter.adopt`, the admission check's pass
`admission.reconcile_workload` with its writes (`controller.writes`, from
copies of the Workload and the TrainJob as its caches hold them, any
earlier version, `views`),
and the controller's own handlers `Detector.pod` and `Detector.jobset` (the
detection rules, the fresh re-read, the history). The Workload is Kueue's as
far as the check reads it: a reservation is a new version with our check
Pending, an eviction releases the quota, our Ready is preconditioned on the
version read.

The search (`TestIdentity`): 400 examples of up to 30 steps, its seed derived
from the commit under test (`git rev-parse HEAD`), so one commit always runs
the same traces and each new commit searches new ones. A failure's report
names the seed; `DISPATCH_MODEL_SEED=<seed>` runs that search again. The
rules of the traces that approve an A already used are listed twice, which
hypothesis draws twice as often (see the class). Each bug the search has
found is kept below as a replay of its shortest trace, with a twin that
shows the property fails on it without the fix's behaviour.
"""

from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import uuid
from collections.abc import Callable

import hypothesis
import hypothesis.stateful as stateful
import hypothesis.strategies as st
import pytest

from controller import admission, detector, pod_rules, views, writes
from tests import mergepatch
from toolkit import adapter, causes, detect, history, kube, marks, names, paths, raising, render, runtime_check


CHECK = "ac"  # our AdmissionCheck's name in the model
# The runtime the TrainJob names, as `toolkit render runtime` leaves it: the admission check's
# pass checks it again before each raise.
RUNTIME = render.runtime({
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": "r"},
    "spec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"metadata": {"labels": runtime_check.TRAINER_STEP_LABELS},
                                      "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "i"}]}}}}},
    ]}}},
}, sidecar_image="sidecar:test")


class Store(kube.Client):
    """One TrainJob behind resourceVersion preconditions, its JobSet and its Workload; I/O only."""

    def __init__(self, trainjob: dict, clock: Callable[[], str]) -> None:
        # No transport: every call it serves is overridden below (read_modify_write uses get and replace).
        self.clock = clock  # the apiserver's: it stamps managedFields and creationTimestamp
        self.obj = trainjob
        self.rv = 1
        self.obj["metadata"]["resourceVersion"] = "1"
        self.obj["metadata"]["generation"] = 1  # the apiserver's: one more at each change of the spec
        self.before_write: Callable[[], object] | None = None  # a hook to slip a racing writer in
        self.jobset: dict | None = None
        self.pods: dict[str, dict] = {}  # by name, as the apiserver holds them now
        # The TrainJob's one Workload, as Kueue and our admission check write it (its own
        # resourceVersion precondition: the check's Ready is written on the version read).
        owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "tj",
                 "uid": self.obj["metadata"]["uid"]}
        self.workload = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                         "metadata": {"name": "wl", "namespace": "ns", "uid": "wl-uid", "resourceVersion": "1",
                                      "ownerReferences": [owner]},
                         "status": {"conditions": [], "admissionChecks": [{"name": CHECK, "state": "Pending"}]}}
        self.refuse_ready = False  # the next write of the Workload's status is refused (a policy, an error)
        # Every version of the Workload so far: what an informer's copy can be when a pass begins
        # (a watch that lags hands it any earlier version).
        self.versions: list[dict] = [copy.deepcopy(self.workload)]
        # Every version of the TrainJob so far: what the TrainJob informer's copy can be.
        self.trainjobs: list[dict] = [copy.deepcopy(self.obj)]

    @property
    def admitted(self) -> bool:
        """Kueue's Workload shows our check Ready (an admission through it)."""
        return admission.check_state(self.workload, CHECK) == "Ready"

    def _workload_written(self, *, reserved: bool) -> None:
        """Kueue's write: quota reserved (or released by an eviction, which stands as the Evicted
        condition until the next reservation), our check Pending again."""
        self.workload = admission.with_checks(self.workload, checks=[CHECK], state="Pending", message="")
        self.workload["status"]["conditions"] = [{"type": "QuotaReserved", "status": str(reserved)}]
        if not reserved:
            self.workload["status"]["conditions"].append(
                {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": self.clock()})
        self.workload["metadata"]["resourceVersion"] = str(int(self.workload["metadata"]["resourceVersion"]) + 1)
        self.versions.append(copy.deepcopy(self.workload))

    def kueue_reserves(self) -> None:
        self._workload_written(reserved=True)

    def kueue_evicts(self) -> None:
        self._workload_written(reserved=False)

    def list(self, res, *, namespace=None, label_selector=None, field_selector=None):
        if res == paths.WORKLOAD:
            return [copy.deepcopy(self.workload)], "1"
        assert res == paths.POD and field_selector and field_selector.startswith("metadata.name=")
        pod = self.pods.get(field_selector.split("=", 1)[1])
        return ([copy.deepcopy(pod)] if pod is not None else []), "1"

    def get(self, res, *, name, namespace=None):
        if res == paths.JOBSET:
            if self.jobset is None:
                raise kube.NotFound(404, "NotFound", "no JobSet")
            return copy.deepcopy(self.jobset)
        if res == paths.WORKLOAD:
            return copy.deepcopy(self.workload)
        if res == paths.CLUSTER_TRAINING_RUNTIME:
            return copy.deepcopy(RUNTIME)
        assert res == paths.TRAINJOB
        return copy.deepcopy(self.obj)

    def replace(self, res, obj, *, subresource=None, field_manager=None):
        if res == paths.WORKLOAD:
            assert subresource == "status"
            if self.refuse_ready:
                self.refuse_ready = False
                raise kube.Forbidden(403, "Forbidden", "denied by an admission policy")
            if obj["metadata"]["resourceVersion"] != self.workload["metadata"]["resourceVersion"]:
                raise kube.Conflict(409, "Conflict", "the object has been modified")
            self.workload = copy.deepcopy(obj)
            self.workload["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            self.versions.append(copy.deepcopy(self.workload))
            if admission.check_state(self.workload, CHECK) == "Retry":  # adopt's requeue: Kueue evicts
                self.kueue_evicts()
            return copy.deepcopy(self.workload)
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        if obj["metadata"]["resourceVersion"] != str(self.rv):
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        self.rv += 1
        before = self.obj
        self.obj = copy.deepcopy(obj)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        generation = before["metadata"]["generation"]
        self.obj["metadata"]["generation"] = generation + (before["spec"] != self.obj["spec"])
        # managedFields as the apiserver keeps them for what the rules read: the writer that
        # changed spec.suspend owns it; a named manager's entry is stamped at each of its writes
        # (the raise's and the adopt's each change a field only they write).
        manager = field_manager or "python-client"
        entries = {e["manager"]: e for e in copy.deepcopy(before["metadata"].get("managedFields") or [])}
        if before["spec"].get("suspend") != self.obj["spec"].get("suspend"):
            for entry in entries.values():
                entry.get("fieldsV1", {}).get("f:spec", {}).pop("f:suspend", None)
            entry = entries.setdefault(manager, {"manager": manager, "operation": "Update"})
            entry.setdefault("fieldsV1", {}).setdefault("f:spec", {})["f:suspend"] = {}
            entry["time"] = self.clock()
        if field_manager is not None:
            entries.setdefault(manager, {"manager": manager, "operation": "Update"})["time"] = self.clock()
        self.obj["metadata"]["managedFields"] = list(entries.values())
        self.trainjobs.append(copy.deepcopy(self.obj))
        return copy.deepcopy(self.obj)

    def merge_patch(self, res, patch, *, name, namespace=None, subresource=None, field_manager=None):
        """A JSON merge patch: its resourceVersion, when it carries one, is the precondition."""
        if res == paths.TRAINJOB and self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        current = self.workload if res == paths.WORKLOAD else self.obj
        version = (patch.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != current["metadata"]["resourceVersion"]:
            if not (res == paths.WORKLOAD and self.refuse_ready):
                raise kube.Conflict(409, "Conflict", "the object has been modified")
        merged = mergepatch.applied(copy.deepcopy(current), patch)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.replace(res, merged, subresource=subresource, field_manager=field_manager)

    def event(self, **kw):
        return {}


class Identity(stateful.RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        tj = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "ns", "uid": "tj-uid", "annotations": {},
                         "labels": {names.KUEUE_QUEUE_LABEL: "lq"}},
            "spec": {"suspend": True, "runtimePatches": [raising.patch_entry(0)]},
        }
        self.store = Store(tj, clock=self._now)
        self.running = False
        self.step = 0
        # every execution that ran: its R and the step it started
        self.executions: list[dict] = []
        # the flag's standing intervals: [raised at, cleared at (None: stands)]
        self.flags: list[list[int | None]] = []
        # the controller's work, queued when its cause appears
        self.pod_events: list[str] = []
        self.jobset_events: list[None] = []
        self.detector = detector.Detector(self.store, clock=self._now, ours=lambda: {CHECK})
        self.conflicts = 0
        self.raises: list[int] = []  # the step of every raise
        self.resets = 0  # rewrites and deletions of the patch, JobSets replaced
        self.edited = 0  # the executions before a person's last edit of the patch, the floor or the history
        # Each time a person's edit left the TrainJob with no mark of ours: the highest R run so
        # far, and the high-water mark the history had recorded then.
        self.erasures: list[tuple[int, int]] = []

    # -- helpers: what Trainer/JobSet/the controller would do --------

    @property
    def flagged(self) -> bool:
        return bool(self.flags) and self.flags[-1][1] is None

    def _write(self, mutate) -> None:
        def compute(obj):
            mutate(obj)
            return obj, None

        self.store.read_modify_write(paths.TRAINJOB, name="tj", namespace="ns", compute=compute)

    def _now(self) -> str:
        return f"2026-12-04T{10 + self.step // 3600:02d}:{self.step // 60 % 60:02d}:{self.step % 60:02d}Z"

    def _new_jobset(self) -> None:
        self.store.jobset = {
            "metadata": {"name": "tj", "namespace": "ns", "uid": uuid.uuid4().hex,
                         "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                              "name": "tj", "uid": "tj-uid"}]},
            "status": {"restarts": 0},
        }
        self.jobset_events.append(None)

    def _seen(self) -> None:
        """The flag as the object holds it, as intervals of standing."""
        if adapter.is_flagged(self.store.obj) and not self.flagged:
            self.flags.append([self.step, None])

    def _jobset_pass(self) -> None:
        """The controller's JobSet handler, on the JobSet's latest version."""
        self.jobset_events.pop(0)
        self.detector.jobset(copy.deepcopy(self.store.jobset))
        self._seen()

    def _pod_pass(self) -> None:
        """The controller's pod handler, on the pod's latest version."""
        name = self.pod_events.pop(0)
        if self.store.pods[name]["status"]["phase"] == "Running":
            for e in self.executions:
                e["seen_running"] = e["seen_running"] or e["pod"] == name
        self.detector.pod(copy.deepcopy(self.store.pods[name]))
        self._seen()

    def _end_pods(self, *, stopped: bool = False) -> None:
        """The running pods end: failed (a JobSet restart), or `stopped`: deleted by a suspend or an
        eviction, which the apiserver stamps (deletionTimestamp, its grace) and the controller sees."""
        for name, pod in self.store.pods.items():
            if pod["status"]["phase"] == "Running":
                pod["status"]["phase"] = "Failed"
                if stopped:
                    pod["metadata"]["deletionTimestamp"] = detect.shifted(self._now(), 30)
                    pod["metadata"]["deletionGracePeriodSeconds"] = 30
                    self.pod_events.append(name)

    def _start_execution(self) -> None:
        """Pods of the trainer job start from the current patch."""
        if self.store.jobset is None:
            self._new_jobset()
        self._end_pods()  # one execution at a time: the previous one's pods have ended
        tj = self.store.get(paths.TRAINJOB, name="tj")
        a = raising.patch_admission(tj)
        restarts = self.store.jobset["status"]["restarts"]
        name = f"tj-node-0-0-{self.step}"
        self.store.pods[name] = {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "labels": {marks.REPLICATED_JOB_LABEL: names.TRAINER_REPLICATED_JOB,
                           names.JOBSET_NAME_LABEL: "tj",
                           names.JOBSET_UID_LABEL: self.store.jobset["metadata"]["uid"],
                           names.RESTART_LABEL: str(restarts)},
                "annotations": {} if a is None else {names.ADMISSION_ANNOTATION: str(a)},
                "creationTimestamp": self._now(),
            },
            "status": {"phase": "Running"},
        }
        self.pod_events.append(name)
        if a is None or a == 0:
            return  # the prologue refuses: nothing runs
        self.executions.append({"a": a, "r": a + restarts, "start": self.step, "pod": name, "seen_running": False,
                                "key": (a, restarts, self.store.jobset["metadata"]["uid"])})

    def _raise(self, *, unsuspend: bool = False) -> None:
        raised = adapter.raise_admission(self.store, namespace="ns", name="tj", unsuspend=unsuspend)
        self.conflicts += raised.conflicts
        self.raises.append(self.step)

    def _pass(self, *, ready_refused: bool = False, seen: dict | None = None,
              trainjob: dict | None = None) -> admission.Outcome:
        """The admission check's pass over the Workload (`admission.reconcile_workload`, from a fresh
        read, or from SEEN and TRAINJOB: copies its caches hold, as `views` slims them);
        `ready_refused`: its Ready write fails after the raise (refused by a policy or a webhook, an
        error, or the controller stopped between the two writes)."""
        self.store.refuse_ready = ready_refused
        seen = None if seen is None else views.workload_view(seen)
        trainjob = None if trainjob is None else views.trainjob_view(trainjob)
        try:
            done = admission.reconcile_workload(self.store, namespace="ns", name="wl", ours={CHECK}, seen=seen,
                                                trainjob=trainjob)
        except kube.Forbidden:  # the approval of a TrainJob not ours (no raise) refused: the worker retries
            assert ready_refused and not marks.is_ours(self.store.obj)
            done = admission.Outcome("refused")
        self.store.refuse_ready = False
        self.conflicts += done.conflicts
        if done.raised:
            self.raises.append(self.step)
        if done.action == "ready" and done.admission is not None:
            # The admission check's own invariant (controller/admission.py), whatever detection
            # sees: Ready only ever carries an A no execution has started with. (An execution
            # before a person's edit of the patch, the floor or the history may have used an A the
            # raise can no longer know; detection answers for those, by the property below.)
            used = max((e["a"] for e in self.executions[self.edited:]), default=0)
            assert done.admission > used, f"Ready with A {done.admission}, an A an execution already used ({used})"
        return done

    def _stop(self) -> None:
        self._write(lambda o: o["spec"].__setitem__("suspend", True))
        if self.store.admitted:
            self.store.kueue_evicts()  # Kueue releases the quota and sets our check Pending again
        self.running = False
        self._end_pods(stopped=True)

    @property
    def pending(self) -> bool:
        return bool(self.pod_events or self.jobset_events)

    def _catch_up(self) -> None:
        while self.jobset_events or self.pod_events:
            self._pod_pass() if self.pod_events else self._jobset_pass()

    def _person_edited(self) -> None:
        if not marks.is_ours(self.store.obj):
            ran = max((e["r"] for e in self.executions), default=0)
            self.erasures.append((ran, history.of(self.store.obj).high_water))

    # -- events ---------------------------------------------------------

    def teardown(self) -> None:
        """Once detection has caught up, the property holds for every execution."""
        self._catch_up()
        self.step += 1
        self._check(every=True)

    @stateful.rule()
    def time_passes(self) -> None:
        self.step += 1

    @stateful.precondition(lambda self: bool(self.pod_events))
    @stateful.rule()
    def controller_handles_a_pod(self) -> None:
        self._pod_pass()

    @stateful.precondition(lambda self: bool(self.jobset_events))
    @stateful.rule()
    def controller_handles_the_jobset(self) -> None:
        self._jobset_pass()

    @stateful.precondition(lambda self: not self.running and not self.store.admitted)
    @stateful.rule()
    def kueue_reserves_and_we_raise(self) -> None:
        """Kueue reserves quota (a new version of the Workload, our check Pending); our pass raises A
        and sets the check Ready."""
        self.store.kueue_reserves()
        self._pass()

    @stateful.precondition(lambda self: not self.running and not self.store.admitted)
    @stateful.rule()
    def kueue_reserves_and_our_ready_fails_after_the_raise(self) -> None:
        """As above, but the Ready write fails once our raise has landed: the check stays Pending on
        the version the raise was for. The next pass (`controller_passes_again`) must raise again
        before any Ready carries an A, if anything (a person, `release`) unsuspended meanwhile."""
        self.store.kueue_reserves()
        done = self._pass(ready_refused=True)
        assert done.action in ("refused", "stale") and not self.store.admitted, done

    @stateful.precondition(lambda self: not self.running and bool(admission.pending_checks(self.store.workload, {CHECK})))
    @stateful.rule()
    def controller_passes_again(self) -> None:
        """The admission check's next pass over a Workload Kueue has not written since."""
        self._pass()

    @stateful.rule(data=st.data())
    def controller_passes_from_a_stale_copy(self, data) -> None:
        """The admission check's pass handed an informer's copy of the Workload that may be any
        earlier version (a watch that lags), whatever runs now: the copy only says where to look."""
        seen = data.draw(st.sampled_from(self.store.versions), label="the copy")
        self._pass(seen=copy.deepcopy(seen))

    @stateful.rule(data=st.data())
    def controller_passes_from_stale_copies_of_both(self, data) -> None:
        """The pass as the controller makes it: from the informers' copies of the Workload and of
        its TrainJob, each any earlier version; the raise and the Ready are preconditioned on them."""
        seen = data.draw(st.sampled_from(self.store.versions), label="the Workload's copy")
        trainjob = data.draw(st.sampled_from(self.store.trainjobs), label="the TrainJob's copy")
        self._pass(seen=copy.deepcopy(seen), trainjob=copy.deepcopy(trainjob))

    @stateful.precondition(lambda self: not self.running and self.store.admitted)
    @stateful.rule()
    def kueue_admits_and_unsuspends(self) -> None:
        """Our check is Ready: Kueue admits and unsuspends."""
        self._write(lambda o: o["spec"].__setitem__("suspend", False))
        self.running = True
        self._start_execution()

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def unsuspended_by_hand(self) -> None:
        """`kubectl patch --type merge -p '{"spec":{"suspend":false}}'` after a hold or an eviction:
        Trainer resumes the same JobSet; no raise, no admission through our check."""
        def compute(obj):
            obj["spec"]["suspend"] = False
            return obj, None

        self.store.read_modify_write(paths.TRAINJOB, name="tj", namespace="ns", compute=compute,
                                     field_manager="kubectl-patch")
        self.resets += 1
        self.running = True
        count = len(self.executions)
        self._start_execution()
        for e in self.executions[count:]:
            e["by_hand"] = True

    @stateful.precondition(lambda self: self.running and self.store.admitted)
    @stateful.rule()
    def suspended_by_hand_while_admitted(self) -> None:
        """`kubectl patch --type merge -p '{"spec":{"suspend":true}}'` on a TrainJob admitted through
        our check: its pods are stopped; Kueue, whose Workload is still admitted, unsuspends it a
        moment later, and the same JobSet's pods come back with the same A and J."""
        def suspend(obj):
            obj["spec"]["suspend"] = True
            return obj, None

        def kueue_starts(obj):
            obj["spec"]["suspend"] = False
            return obj, None

        self.store.read_modify_write(paths.TRAINJOB, name="tj", namespace="ns", compute=suspend,
                                     field_manager="kubectl-patch")
        self._end_pods(stopped=True)
        self.resets += 1
        self.step += 1
        self.store.read_modify_write(paths.TRAINJOB, name="tj", namespace="ns", compute=kueue_starts,
                                     field_manager="kueue")
        self._start_execution()

    @stateful.precondition(lambda self: bool(self.pod_events))
    @stateful.rule()
    def a_new_leader_handles_a_pod_before_its_caches_sync(self) -> None:
        """A leader's first pass, before its cache of the AdmissionChecks has synced (a failover):
        our checks are not known yet, which must never read as "none of them"."""
        known, self.detector.ours = self.detector.ours, lambda: None
        try:
            self._pod_pass()
        finally:
            self.detector.ours = known

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def release(self) -> None:
        self._raise(unsuspend=True)
        self.running = True
        self._start_execution()

    @stateful.precondition(lambda self: self.running)
    @stateful.rule()
    def preempt_or_hold(self) -> None:
        self._stop()

    @stateful.precondition(lambda self: self.running)
    @stateful.rule()
    def jobset_restarts(self) -> None:
        self.store.jobset["status"]["restarts"] += 1
        self._start_execution()

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def racing_raise(self) -> None:
        """Another raiser lands between our read and our write: our write
        is refused and recomputed from a fresh read, never re-sent."""
        before = raising.counts(self.store.obj).next
        self.store.before_write = lambda: adapter.raise_admission(self.store, namespace="ns", name="tj")
        self._raise()
        assert raising.counts(self.store.obj).current == before + 1

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule(value=st.integers(0, 5))
    def patch_rewritten(self, value: int) -> None:
        self._write(lambda o: o["spec"].__setitem__("runtimePatches", [raising.patch_entry(value)]))
        self.resets += 1
        self.edited = len(self.executions)
        self._person_edited()

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule(value=st.sampled_from([None, "0", "1", "x"]))
    def floor_edited(self, value: str | None) -> None:
        """The floor annotation set by hand (None: deleted)."""
        def edit(o):
            annotations = o["metadata"].setdefault("annotations", {})
            if value is None:
                annotations.pop(names.FLOOR_ANNOTATION, None)
            else:
                annotations[names.FLOOR_ANNOTATION] = value
        self._write(edit)
        self.resets += 1
        self.edited = len(self.executions)
        self._person_edited()

    @stateful.rule()
    def history_made_unreadable(self) -> None:
        """The history annotation overwritten with text that is not a history. (Deleted, or
        rewritten readable with a lower mark, it cannot be told from a history that never held
        more: like the recorded JobSet UID, it is in the trust boundary of whoever may update
        TrainJobs, docs/threat-model.md.)"""
        self._write(lambda o: o["metadata"].setdefault("annotations", {}).__setitem__(
            history.HISTORY_ANNOTATION, "{not json"))
        self.resets += 1
        self.edited = len(self.executions)

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def patch_deleted(self) -> None:
        self._write(lambda o: o["spec"].__setitem__("runtimePatches", []))
        self.resets += 1
        self.edited = len(self.executions)
        self._person_edited()

    @stateful.precondition(lambda self: self.store.jobset is not None)
    @stateful.rule()
    def jobset_deleted_and_recreated(self) -> None:
        self.resets += 1
        self._new_jobset()
        if self.running:
            self._start_execution()

    # Not while it runs in Kueue mode without an admission through our check (started by hand):
    # adopt can then neither hold it (Kueue mode) nor re-queue it (no Ready check to set Retry), and
    # says so ("still running and no admitted Workload with our check was found to re-queue").
    @stateful.precondition(lambda self: self.flagged and not (self.running and not self.store.admitted))
    @stateful.rule()
    def a_person_adopts(self) -> None:
        self._catch_up()
        self._adopt(self._reviewed())

    def _reviewed(self) -> tuple[str, list[str]]:
        """What `toolkit status` shows a person: the causes' fingerprint, and the causes."""
        annotations = self.store.obj["metadata"].get("annotations") or {}
        kept = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION)).kept
        return adapter.compute_status(self.store.obj, None).foreign_fingerprint or "", kept

    def _adopt(self, reviewed: tuple[str, list[str]]) -> None:
        refusable = history.of(self.store.obj).unreadable or not marks.is_ours(self.store.obj)
        fingerprint, seen = reviewed
        try:
            done = adapter.adopt(self.store, namespace="ns", name="tj", reason="checked by a person",
                                 reviewed=fingerprint, checks={CHECK})
        except adapter.AdapterError:
            # An unreadable history, or every mark of ours removed by hand: a person repairs it
            # first, and the flag stands meanwhile. Or a cause arrived since the person read them:
            # they read `toolkit status` again.
            assert refusable or self._reviewed()[1] != seen
            return
        # An adoption clears the causes the person reviewed, never one that arrived meanwhile.
        assert history.of(self.store.obj).adoptions[-1].causes == seen, "adopt cleared causes nobody reviewed"
        self.flags[-1][1] = self.step
        assert not adapter.is_flagged(self.store.obj)
        if done.held:
            self.running = False
            self._end_pods()
        if done.requeued:
            self._stop()  # Kueue evicts on Retry; the next admission raises
        seen = max((e["r"] for e in self.executions), default=0)
        assert done.next_r > seen, f"adopt's next R {done.next_r} is not above the R {seen} already seen"

    @stateful.precondition(lambda self: self.flagged and self.pending
                           and not (self.running and not self.store.admitted))
    @stateful.rule()
    def a_person_adopts_what_they_read_while_the_controller_works(self) -> None:
        """A person reads the causes, and while they decide the controller does the work it had
        queued (a new cause may arrive: a repeat flagged meanwhile); then they adopt what they read."""
        reviewed = self._reviewed()
        self._catch_up()
        self._adopt(reviewed)

    # The search's bias: hypothesis draws uniformly among the rules whose precondition holds, and a
    # rule listed twice is drawn twice as often. These are the steps of the traces in which a pass
    # approves an A some execution already used (a Ready that failed after the raise, an unsuspend
    # by hand, the next pass on an unchanged Workload): listed twice, those traces are short and
    # frequent enough that the default search finds them.
    kueue_reserves_and_our_ready_fails_after_the_raise_ = kueue_reserves_and_our_ready_fails_after_the_raise
    unsuspended_by_hand_ = unsuspended_by_hand
    suspended_by_hand_while_admitted_ = suspended_by_hand_while_admitted
    controller_passes_again_ = controller_passes_again

    # -- the property ---------------------------------------------------

    def _covered(self, start: int) -> bool:
        return any(raised <= self.step and (cleared is None or cleared > start) for raised, cleared in self.flags)

    def _unseen_twin(self, i: int) -> bool:
        """The gap left (docs/adapter.md, "What detection cannot see"): an execution whose pod the
        controller never saw running, whose A, J and JobSet are an earlier execution's, created
        within the clock margin (`detect.SKEW_SECONDS`) of the raise before it."""
        e = self.executions[i]
        last_raise = max((step for step in self.raises if step <= e["start"]), default=None)
        return (not e["seen_running"] and last_raise is not None and e["start"] - last_raise <= detect.SKEW_SECONDS
                and any(x["key"] == e["key"] for x in self.executions[:i]))

    def _unseen_resume(self, i: int) -> bool:
        """The other gap (docs/adapter.md, "What detection cannot see"): an execution resumed
        without a raise whose pod the controller never saw running: once it has ended, nothing the
        apiserver keeps says the suspension before it had no raise."""
        e = self.executions[i]
        return bool(e.get("by_hand")) and not e["seen_running"]

    def _erased(self, i: int) -> bool:
        """The third gap (docs/adapter.md, "What detection cannot see"): a person removed every mark
        of ours (the patch entry and the floor) while executions up to this one's R had run that
        the history had not recorded: the TrainJob was then no longer ours, and what bounded R
        went with the marks."""
        return any(self.executions[i]["r"] <= ran and ran > recorded for ran, recorded in self.erasures)

    def _check(self, *, every: bool) -> None:
        assert self.resets or not self.flags, f"flagged with no reset: {self.store.obj['metadata']['annotations']}"
        highest = 0
        for i, e in enumerate(self.executions):
            assert (e["r"] > highest or self._covered(e["start"]) or (not every and self.pending)
                    or self._unseen_twin(i) or self._unseen_resume(i) or self._erased(i)), (
                f"R {e['r']} repeated without a flag: {self.executions}, flags {self.flags}")
            highest = max(highest, e["r"])

    @stateful.invariant()
    def r_only_increases_unless_flagged_once_detection_caught_up(self) -> None:
        self.step += 1
        self._check(every=False)


def _search_seed() -> int:
    """The search's seed: DISPATCH_MODEL_SEED to replay a run, else derived from the commit under
    test, so that one commit always runs the same search (a run is replayable and landing is
    deterministic) and each new commit searches new traces."""
    given = os.environ.get("DISPATCH_MODEL_SEED")
    if given is not None:
        return int(given)
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pathlib.Path(__file__).parent, capture_output=True,
                          text=True, check=False)
    return int(done.stdout.strip()[:12] or "0", 16)


SEED = _search_seed()


class Searched(Identity):
    """The machine the search runs: Identity under the seed above (named in a failure's report)."""

    def __init__(self) -> None:
        super().__init__()
        hypothesis.note(f"search seed {SEED}: DISPATCH_MODEL_SEED={SEED} replays it")


hypothesis.seed(SEED)(Searched)
# too_slow: on a busy 2-core machine the generation of 30-step runs can cross hypothesis's time
# budget for generating data; what the search checks is the same either way.
Searched.TestCase.settings = hypothesis.settings(max_examples=400, stateful_step_count=30, deadline=None,
                                                 suppress_health_check=[hypothesis.HealthCheck.too_slow])
TestIdentity = Searched.TestCase


def _fails(monkeypatch_target: Callable[[], None]) -> str:
    monkeypatch_target()
    try:
        stateful.run_state_machine_as_test(
            # No shrinking: the test needs a failure, not the smallest one. Derandomized: one search,
            # the same in every run, so a can-fail test never passes or fails by the draw.
            Identity, settings=hypothesis.settings(max_examples=1000, stateful_step_count=30, deadline=None,
                                                   derandomize=True, database=None, report_multiple_bugs=False,
                                                   phases=[hypothesis.Phase.generate])
        )
    except AssertionError as exc:
        return str(exc)
    except ExceptionGroup as group:  # hypothesis found several distinct failures
        return "\n".join(str(exc) for exc in group.exceptions)
    raise AssertionError("the model accepted a broken build")


def test_the_model_can_fail_without_the_floor(monkeypatch):
    """The property is not vacuous: with the floor ignored, a rewritten patch
    repeats an R with no flag, and the machine finds it."""
    original = raising.counts

    def without_floor() -> None:
        monkeypatch.setattr(raising, "counts", lambda tj: raising.Counts(patch=original(tj).patch, floor=None))
        monkeypatch.setattr(detect, "pod", lambda **kw: None)
        for rule in ("repeat", "repeat_across_raise", "repeat_by_creation", "repeat_after_stop",
                     "repeat_across_unsuspend"):
            monkeypatch.setattr(history, rule, lambda h, **kw: None)

    assert "repeated without a flag" in _fails(without_floor)


def test_the_model_can_fail_when_an_adoption_ignores_the_high_water_mark(monkeypatch):
    """The adopt property is not vacuous: an adoption that sets no minimum
    lets the next execution repeat an R (the JobSet was reset, J is back at
    0), with the flag already cleared, and the machine finds it."""
    original = history.adopt

    def no_minimum() -> None:
        monkeypatch.setattr(history, "adopt", lambda h, **kw: (original(h, **kw)[0], 1))
        monkeypatch.setattr(history, "repeat", lambda h, **kw: None)

    message = _fails(no_minimum)
    assert any(found in message for found in (
        "repeated without a flag", "is not above the R", "an A an execution already used")), message


def _without_hold_rules(monkeypatch) -> None:
    """The rules for one execution's pods on both sides of a stop or an unsuspend taken away: they
    catch several of the traces below as well, so a replay that shows another rule is needed takes
    them away too."""
    for rule in ("repeat_after_stop", "repeat_across_unsuspend"):
        monkeypatch.setattr(history, rule, lambda h, **kw: None)


def _suspended_by_hand_while_admitted_trace() -> Identity:
    """Admitted through our check at A = 1 and seen; suspended by hand while admitted; Kueue starts
    it again a second later: the same A, J and JobSet, and the controller sees the new pod first."""
    machine = Identity()
    for step in ("kueue_reserves_and_we_raise", "kueue_admits_and_unsuspends", "controller_handles_a_pod",
                 "controller_handles_the_jobset", "suspended_by_hand_while_admitted"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    machine.pod_events.reverse()  # the new pod's event before the old one's stop
    return machine


def test_an_execution_suspended_by_hand_and_started_again_by_kueue_is_flagged():
    machine = _suspended_by_hand_while_admitted_trace()
    first, again = machine.executions
    assert first["key"] == again["key"]
    machine.teardown()
    foreign = machine.store.obj["metadata"]["annotations"][names.FOREIGN_ANNOTATION]
    assert "the execution A=1 J=0, R 1, has pods created before and after the unsuspend at " in foreign


def test_the_stop_alone_flags_an_execution_suspended_by_hand_and_started_again(monkeypatch):
    """Each of the two rules catches it alone: without the unsuspend's time (a controller that never
    read the TrainJob while Kueue's unsuspend stood), the stop of the first pod does."""
    monkeypatch.setattr(history, "repeat_across_unsuspend", lambda h, **kw: None)
    machine = _suspended_by_hand_while_admitted_trace()
    machine.teardown()
    foreign = machine.store.obj["metadata"]["annotations"][names.FOREIGN_ANNOTATION]
    assert "has a pod created at 2026-12-04T10:00:05Z, after a pod of it was stopped at " in foreign


def test_the_model_can_fail_without_the_rules_for_a_hold_by_hand(monkeypatch):
    """A suspend by hand while admitted, undone by Kueue: without the stop and unsuspend rules, the
    execution resumed with its A and J repeats its epoch unflagged, and the machine finds it."""
    _without_hold_rules(monkeypatch)
    with pytest.raises(AssertionError, match="repeated without a flag"):
        _suspended_by_hand_while_admitted_trace().teardown()
    assert "repeated without a flag" in _fails(lambda: None)


def test_the_model_can_fail_when_adopt_clears_what_was_not_reviewed(monkeypatch):
    """An adoption that takes no account of what the person read clears a cause flagged while they
    decided, and the machine finds it."""
    original = adapter.adopt

    def unreviewed() -> None:
        monkeypatch.setattr(adapter, "adopt", lambda client, *, reviewed, **kw: original(
            client, reviewed=adapter.compute_status(client.get(paths.TRAINJOB, name="tj"), None).foreign_fingerprint,
            **kw))

    assert "adopt cleared causes nobody reviewed" in _fails(unreviewed)


def test_the_model_can_fail_when_unknown_checks_read_as_none_of_ours(monkeypatch):
    """A leader's pass before its AdmissionCheck cache synced: read as "no check is ours", every pod
    Kueue started is judged resumed without a raise, a flag with no reset, and the machine finds it."""
    original = pod_rules.admitted_by

    def unknown_is_empty() -> None:
        monkeypatch.setattr(detector.Detector, "_admitted", lambda self, pod, tj: (
            None if raising.unsuspended_at(tj) is None or not marks.is_live(pod) else
            original([self.client.get(paths.WORKLOAD, name="wl")], tj, ours=self.ours() or set(),
                     unsuspended=raising.unsuspended_at(tj)[1])))

    assert "flagged with no reset" in _fails(unknown_is_empty)


def test_the_model_can_fail_when_an_eviction_reads_as_an_admission(monkeypatch):
    """An unsuspend by hand while the Workload is evicted: with the eviction read as an admission
    for it and the hold rules off, the pods started by hand repeat the evicted execution's A and J
    unflagged, and the machine finds it."""
    original = pod_rules.admitted_by

    def evicted_is_admitted() -> None:
        monkeypatch.setattr(pod_rules, "admitted_by", lambda w, tj, *, ours, unsuspended=None: original(
            w, tj, ours=ours, unsuspended=None))
        for rule in ("repeat_after_stop", "repeat_across_unsuspend"):
            monkeypatch.setattr(history, rule, lambda h, **kw: None)

    assert "repeated without a flag" in _fails(evicted_is_admitted)


def _unseen_twin_trace() -> Identity:
    """Admitted at A = 1 and seen; preempted; raised to 2; the patch rewritten to 1; admitted again
    (A = 1, J = 0, the same JobSet: the first execution's identity) and preempted before the
    controller handles its pod. Each step is a second of the apiserver's clock."""
    machine = Identity()
    for step in ("kueue_reserves_and_we_raise", "kueue_admits_and_unsuspends", "controller_handles_a_pod",
                 "controller_handles_the_jobset", "preempt_or_hold", "kueue_reserves_and_we_raise"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    machine.patch_rewritten(1)
    machine.r_only_increases_unless_flagged_once_detection_caught_up()
    for step in ("kueue_admits_and_unsuspends", "preempt_or_hold"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    return machine


def test_an_execution_below_the_floor_that_ended_unseen_is_flagged_by_the_floor_at_its_creation():
    machine = _unseen_twin_trace()
    first, twin = machine.executions
    assert first["key"] == twin["key"] and not twin["seen_running"]
    machine.teardown()
    foreign = machine.store.obj["metadata"]["annotations"][names.FOREIGN_ANNOTATION]
    assert f"pod {twin['pod']} had admission 1, below the floor 2 raised at " in foreign


def test_the_model_can_fail_when_ended_pods_are_not_judged_by_the_floor_at_their_creation(monkeypatch):
    """Without the rules for ended pods the twin goes unflagged, and the property says so. (Its
    pods straddle the raise to 2, so the rule of the times judges it too: both are taken away.)"""
    monkeypatch.setattr(pod_rules, "_created_below_floor", lambda pod, trainjob: None)
    monkeypatch.setattr(history, "repeat_across_raise", lambda h, **kw: None)
    _without_hold_rules(monkeypatch)
    machine = _unseen_twin_trace()
    with pytest.raises(AssertionError, match="repeated without a flag"):
        machine.teardown()


def _preempted_then_raised_trace() -> Identity:
    """Admitted at A = 1, preempted before the controller handles its pod, raised to 2 a second
    later; only then does the controller see the first execution's (ended) pod."""
    machine = Identity()
    for step in ("kueue_reserves_and_we_raise", "kueue_admits_and_unsuspends", "preempt_or_hold", "time_passes",
                 "kueue_reserves_and_we_raise", "controller_handles_a_pod"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    return machine


def test_an_ended_pod_above_the_floor_at_its_creation_is_not_flagged_after_the_next_raise():
    machine = _preempted_then_raised_trace()
    assert not adapter.is_flagged(machine.store.obj)
    machine.teardown()


def test_the_model_can_fail_when_ended_pods_are_judged_by_the_floor_as_it_stands(monkeypatch):
    """The no-reset property is not vacuous: judging an ended pod by today's floor flags the
    preempted execution's pod once the next raise has passed it."""
    now = raising.floor_when_created
    monkeypatch.setattr(raising, "floor_when_created", lambda tj, created: raising.last_raise(tj) or now(tj, created))
    with pytest.raises(AssertionError, match="flagged with no reset"):
        _preempted_then_raised_trace()


def _resumed_by_hand_trace() -> Identity:
    """Admitted through our check at A = 1 and seen; evicted; unsuspended by hand (no raise, no
    admission through our check): the same A, J and JobSet run again, and the controller sees it."""
    machine = Identity()
    for step in ("kueue_reserves_and_we_raise", "kueue_admits_and_unsuspends", "controller_handles_a_pod",
                 "controller_handles_the_jobset", "preempt_or_hold", "time_passes", "unsuspended_by_hand",
                 "controller_handles_a_pod", "controller_handles_a_pod"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    return machine


def test_an_execution_resumed_by_hand_is_flagged():
    machine = _resumed_by_hand_trace()
    first, again = machine.executions
    assert first["key"] == again["key"] and again["seen_running"]
    machine.teardown()
    foreign = machine.store.obj["metadata"]["annotations"][names.FOREIGN_ANNOTATION]
    assert f"pod {again['pod']} started after spec.suspend was set false by kubectl-patch at " in foreign


def test_the_model_can_fail_without_the_resume_rule(monkeypatch):
    """Without the rule that reads who last set spec.suspend, the repeat goes unflagged, and the
    property says so."""
    monkeypatch.setattr(pod_rules, "resumed", lambda pod, trainjob, *, admitted: None)
    _without_hold_rules(monkeypatch)
    with pytest.raises(AssertionError, match="repeated without a flag"):
        _resumed_by_hand_trace().teardown()


def _erased_marks_trace() -> Identity:
    """Released at A = 1; the JobSet replaced while it runs (the same A and J again, a new JobSet);
    held; then, before the controller got to any of it, a person removes the floor and the patch
    entry: the TrainJob carries no mark of ours when the controller looks."""
    machine = Identity()
    for step in ("release", "jobset_deleted_and_recreated", "preempt_or_hold"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    machine.floor_edited(None)
    machine.patch_deleted()
    return machine


def test_an_execution_whose_marks_were_all_removed_before_it_was_seen_is_not_ours_any_more():
    machine = _erased_marks_trace()
    first, again = machine.executions
    assert first["r"] == again["r"] and machine.erasures == [(1, 0)]
    machine.teardown()  # the property holds, through the erasure exception
    assert not adapter.is_flagged(machine.store.obj) and not marks.is_ours(machine.store.obj)


def test_the_model_can_fail_when_the_erasure_exception_is_dropped(monkeypatch):
    """The exception is what lets the trace pass: without it the repeat is reported."""
    monkeypatch.setattr(Identity, "_erased", lambda self, i: False)
    machine = _erased_marks_trace()
    with pytest.raises(AssertionError, match="repeated without a flag"):
        machine.teardown()


def _ready_failed_then_resumed_by_hand_trace() -> Identity:
    """Kueue reserves; our pass raises A to 1 but its Ready fails; a person unsuspends by hand (an
    execution with A = 1), then holds; the next pass finds the Workload as the raise left it."""
    machine = Identity()
    for step in ("kueue_reserves_and_our_ready_fails_after_the_raise", "unsuspended_by_hand", "preempt_or_hold",
                 "controller_passes_again"):
        getattr(machine, step)()
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    return machine


def test_a_pass_after_a_failed_ready_raises_again_when_the_trainjob_ran_since():
    machine = _ready_failed_then_resumed_by_hand_trace()
    assert [e["a"] for e in machine.executions] == [1] and machine.store.admitted
    assert raising.counts(machine.store.obj).current == 2 and len(machine.raises) == 2
    machine.kueue_admits_and_unsuspends()
    assert [e["a"] for e in machine.executions] == [1, 2]
    machine.teardown()


def test_the_model_can_fail_when_the_raised_for_marker_alone_approves(monkeypatch):
    """The marker matching the Workload version, with no look at the generation and the suspension
    (what the pass did before it read them): the pass approves the A the resumed execution used."""
    def marker_only(trainjob, workload):
        found = ((trainjob.get("metadata") or {}).get("annotations") or {}).get(adapter.RAISED_FOR_ANNOTATION)
        return (found or "").startswith(f"{admission.marker(workload)}/")

    monkeypatch.setattr(writes, "raised_here", marker_only)
    with pytest.raises(AssertionError, match="Ready with A 1, an A an execution already used"):
        _ready_failed_then_resumed_by_hand_trace()


def _stale_copy_after_a_start_by_hand() -> tuple[Identity, dict, dict]:
    """Kueue reserves; our raise lands and our Ready fails; a person unsuspends by hand (an
    execution with A = 1) and holds. Returns the machine, the Workload's copy from the
    reservation (what a lagging informer hands the next pass) and the TrainJob as the raise left it."""
    machine = Identity()
    machine.kueue_reserves_and_our_ready_fails_after_the_raise()
    workload, raised = copy.deepcopy(machine.store.versions[-1]), copy.deepcopy(machine.store.obj)
    machine.unsuspended_by_hand()
    machine.preempt_or_hold()
    assert [e["a"] for e in machine.executions] == [1]
    return machine, workload, raised


def test_a_pass_from_a_stale_copy_of_the_workload_raises_again_after_a_start_by_hand():
    """The Workload may come from the informer's copy: the TrainJob, read fresh, shows the start by
    hand (its generation moved), so the pass raises to 2 before its Ready."""
    machine, workload, _ = _stale_copy_after_a_start_by_hand()
    done = machine._pass(seen=workload)
    assert (done.action, done.admission) == ("ready", 2)
    machine.teardown()


def test_the_model_can_fail_when_the_trainjob_comes_from_a_stale_copy_too(monkeypatch):
    """The shortcut not taken: the TrainJob read from a copy as well (as the raise left it) finds the
    raise for this Workload version landed, writes nothing, and approves the A the execution used."""
    machine, workload, raised = _stale_copy_after_a_start_by_hand()
    fresh = machine.store.get

    def stale(res, *, name, namespace=None):
        return copy.deepcopy(raised) if res == paths.TRAINJOB else fresh(res, name=name, namespace=namespace)

    monkeypatch.setattr(machine.store, "get", stale)
    with pytest.raises(AssertionError, match="Ready with A 1, an A an execution already used"):
        machine._pass(seen=workload)


def test_a_cached_trainjob_that_says_already_raised_is_read_fresh_before_the_ready():
    """Both copies from the caches, the TrainJob's as the raise left it (its marker names this
    Workload version): the pass does not trust "already raised", reads the TrainJob, finds the
    start by hand and raises to 2 before its Ready."""
    machine, workload, raised = _stale_copy_after_a_start_by_hand()
    done = machine._pass(seen=workload, trainjob=raised)
    assert (done.action, done.admission) == ("ready", 2)
    machine.teardown()


def test_the_model_can_fail_when_already_raised_is_taken_from_the_cache(monkeypatch):
    """The shortcut not taken: the read that proves "already raised" answered by the cached copy
    approves the A the execution used."""
    machine, workload, raised = _stale_copy_after_a_start_by_hand()
    monkeypatch.setattr(writes, "_read", lambda client, **kw: views.trainjob_view(copy.deepcopy(raised)))
    with pytest.raises(AssertionError, match="Ready with A 1, an A an execution already used"):
        machine._pass(seen=workload, trainjob=raised)


def test_a_stale_cached_trainjob_costs_one_409_and_a_raise_from_the_fresh_read():
    """The TrainJob's copy from before another raise landed: the merge patch computed from it is
    refused (its resourceVersion), read once fresh, and the raise written from that read: A grows
    past the other raise's, never repeats it."""
    machine = Identity()
    stale = copy.deepcopy(machine.store.obj)
    machine._raise()  # another raiser's A = 1
    machine.store.kueue_reserves()
    done = machine._pass(seen=copy.deepcopy(machine.store.workload), trainjob=stale)
    assert (done.action, done.admission, done.conflicts) == ("ready", 2, 1)
    assert raising.counts(machine.store.obj) == raising.Counts(patch=2, floor=2, recorded=2)
    machine.teardown()


def _played(*steps: str | tuple[str, object]) -> Identity:
    """A machine through STEPS (a rule's name, or the name and its argument), the property checked
    after each, as the search checks it."""
    machine = Identity()
    for step in steps:
        name, *args = (step,) if isinstance(step, str) else step
        getattr(machine, name)(*args)
        machine.r_only_increases_unless_flagged_once_detection_caught_up()
    return machine


def _lowered_after_an_unseen_execution_trace() -> Identity:
    """A person rewrites our patch to A = 3 and unsuspends by hand; the execution (A = 3, J = 0) is
    held before the controller sees it; the person rewrites the patch to 0. The next admission
    raises from what the TrainJob then holds (to 1, then 3 with a racing raise): the same A, J and
    JobSet run again, after a raise the first execution's pods were created before."""
    return _played(("patch_rewritten", 3), "unsuspended_by_hand", "preempt_or_hold", ("patch_rewritten", 0),
                   "kueue_reserves_and_we_raise", "racing_raise", "kueue_admits_and_unsuspends")


def test_an_execution_whose_pods_straddle_a_raise_is_flagged():
    machine = _lowered_after_an_unseen_execution_trace()
    first, again = machine.executions
    assert first["key"] == again["key"] and not first["seen_running"]
    machine.teardown()
    foreign = machine.store.obj["metadata"]["annotations"][names.FOREIGN_ANNOTATION]
    assert "the execution A=3 J=0, R 3, has pods created before and after the raise at " in foreign


def test_the_model_can_fail_without_the_rule_of_the_raise_between(monkeypatch):
    monkeypatch.setattr(history, "repeat_across_raise", lambda h, **kw: None)
    _without_hold_rules(monkeypatch)
    with pytest.raises(AssertionError, match="repeated without a flag"):
        _lowered_after_an_unseen_execution_trace().teardown()


def _lowered_then_released_trace() -> Identity:
    """As above, but the patch is rewritten to 2 and the TrainJob released (a raise to 1): the next
    executions (A = 1, J = 0 and 1) have R at or below the unseen one's 2 under other keys, and end
    before the controller sees them running."""
    return _played(("patch_rewritten", 2), "unsuspended_by_hand", "preempt_or_hold", ("patch_rewritten", 0),
                   "release", "jobset_restarts", "jobset_restarts")


def test_an_execution_that_started_after_one_with_a_higher_r_is_flagged_though_it_ended_unseen():
    machine = _lowered_then_released_trace()
    assert [e["r"] for e in machine.executions] == [2, 1, 2, 3]
    machine.teardown()
    foreign = machine.store.obj["metadata"]["annotations"][names.FOREIGN_ANNOTATION]
    assert "the execution A=1 J=0, R 1, started at " in foreign and ", after the execution A=2 J=0, R 2," in foreign


def test_the_model_can_fail_without_the_rule_of_the_start_order(monkeypatch):
    monkeypatch.setattr(history, "repeat_by_creation", lambda h, **kw: None)
    with pytest.raises(AssertionError, match="repeated without a flag"):
        _lowered_then_released_trace().teardown()


def _raised_then_lowered_trace() -> Identity:
    """Released at A = 1 and held before the controller sees it; a person deletes the floor and
    rewrites our patch to 0; released again. Each execution was created in the same second as the
    raise before it, so no time tells them apart: only the raise's own record of the A it wrote
    (`history.raised`) keeps the second raise above the first."""
    return _played("release", "preempt_or_hold", ("floor_edited", None), ("patch_rewritten", 0), "release")


def test_a_raise_stays_above_an_earlier_raise_whose_floor_and_patch_a_person_lowered():
    machine = _raised_then_lowered_trace()
    assert [e["a"] for e in machine.executions] == [1, 2]
    assert history.of(machine.store.obj).raised == 2
    machine.teardown()


def test_the_model_can_fail_when_the_raise_forgets_what_it_wrote(monkeypatch):
    monkeypatch.setattr(history, "highest_admission", lambda h: max(
        (*(floor for floor, _ in h.floors), *(e.a for e in h.executions)), default=0))
    _without_hold_rules(monkeypatch)
    machine = _raised_then_lowered_trace()
    assert [e["a"] for e in machine.executions] == [1, 1]
    with pytest.raises(AssertionError, match="repeated without a flag"):
        machine.teardown()
