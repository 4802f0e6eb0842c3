"""A model test of the identity (seed 000, DESIGN.md §2, §6, §7).

A hypothesis state machine drives one TrainJob through the events that end
one execution and begin another (JobSet restart, preemption and
re-admission, hold and release) and the ones that reset a counter from
outside (patch rewritten or deleted, JobSet deleted and recreated), plus a
raise that races another. The property, over every trace:

    each execution's R is greater than every earlier execution's R,
    or the TrainJob was flagged foreign before that execution ran.

It runs on the pure core, not the apiserver: the store below is an
in-memory stand-in that keeps only what the property depends on, the
resourceVersion precondition of an update (a stale write is refused with
kube.Conflict). Everything else is the real code: `adapter.raise_admission`
with `kube.Client.read_modify_write` (the 409 loop), `raising.raised`, and
the detection rules `detect.pod` / `detect.jobset_uid` through
`controller.detector.pod_violation`. A pod's container "runs" only when the
prologue would accept it (A present and >= 1), and the checks on a pod
happen at its start, as the native sidecar does before the trainer starts.
"""

from __future__ import annotations

import copy
import uuid

import hypothesis
import hypothesis.stateful as stateful
import hypothesis.strategies as st

from controller import detector
from toolkit import adapter, detect, kube, names, paths, raising


class Store(kube.Client):
    """One TrainJob behind resourceVersion preconditions; I/O only."""

    def __init__(self, trainjob: dict) -> None:
        # No transport: every call it serves is overridden below (read_modify_write uses get and replace).
        self.obj = trainjob
        self.rv = 1
        self.obj["metadata"]["resourceVersion"] = "1"
        self.before_write = None  # a hook to slip a racing writer in

    def get(self, res, *, name, namespace=None):
        return copy.deepcopy(self.obj)

    def replace(self, res, obj, *, subresource=None):
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        if obj["metadata"]["resourceVersion"] != str(self.rv):
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        self.rv += 1
        self.obj = copy.deepcopy(obj)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)


class Identity(stateful.RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        tj = {
            "metadata": {"name": "tj", "namespace": "ns", "annotations": {}},
            "spec": {"suspend": True, "runtimePatches": [raising.patch_entry(0)]},
        }
        self.store = Store(tj)
        self.jobset_uid: str | None = None
        self.restarts = 0
        self.running = False
        self.raised_since_suspend = False
        self.flagged = False
        self.executions: list[tuple[int, bool]] = []  # (R, flagged before it ran)
        self.conflicts = 0

    # -- helpers: what Trainer/JobSet/the controller would do --------

    def _write(self, mutate) -> None:
        def compute(obj):
            mutate(obj)
            return obj, None

        self.store.read_modify_write(paths.TRAINJOB, name="tj", namespace="ns", compute=compute)

    def _observe_jobset(self) -> None:
        # the controller's detector: record the first UID, flag a new one
        recorded = self.store.obj["metadata"]["annotations"].get(names.JOBSET_UID_ANNOTATION)
        if recorded is None:
            self._write(lambda o: o["metadata"]["annotations"].__setitem__(names.JOBSET_UID_ANNOTATION, self.jobset_uid))
        elif detect.jobset_uid(recorded=recorded, seen=self.jobset_uid) is not None:
            self.flagged = True

    def _start_execution(self) -> None:
        """Pods of the trainer job start from the current patch."""
        if self.jobset_uid is None:
            self.jobset_uid = uuid.uuid4().hex
            self._observe_jobset()
        tj = self.store.get(paths.TRAINJOB, name="tj")
        a = raising.patch_admission(tj)
        pod = {
            "metadata": {
                "name": "tj-node-0-0",
                "labels": {detector.REPLICATED_JOB_LABEL: names.TRAINER_REPLICATED_JOB, names.RESTART_LABEL: str(self.restarts)},
                "annotations": {} if a is None else {names.ADMISSION_ANNOTATION: str(a)},
            },
            "status": {"phase": "Pending"},
        }
        if detector.pod_violation(pod, tj) is not None:
            self.flagged = True
        if a is None or a == 0:
            return  # the prologue refuses: nothing runs
        r = a + self.restarts
        self.executions.append((r, self.flagged))

    def _raise(self, *, unsuspend: bool = False) -> None:
        raised = adapter.raise_admission(self.store, namespace="ns", name="tj", unsuspend=unsuspend)
        self.conflicts += raised.conflicts

    # -- events ---------------------------------------------------------

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def kueue_reserves_and_we_raise(self) -> None:
        self._raise()
        self.raised_since_suspend = True

    @stateful.precondition(lambda self: not self.running and self.raised_since_suspend)
    @stateful.rule()
    def kueue_admits_and_unsuspends(self) -> None:
        self._write(lambda o: o["spec"].__setitem__("suspend", False))
        self.running = True
        self._start_execution()

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def release(self) -> None:
        self._raise(unsuspend=True)
        self.running = True
        self._start_execution()

    @stateful.precondition(lambda self: self.running)
    @stateful.rule()
    def preempt_or_hold(self) -> None:
        self._write(lambda o: o["spec"].__setitem__("suspend", True))
        self.running = False
        self.raised_since_suspend = False

    @stateful.precondition(lambda self: self.running)
    @stateful.rule()
    def jobset_restarts(self) -> None:
        self.restarts += 1
        self._start_execution()

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def racing_raise(self) -> None:
        """Another raiser lands between our read and our write: our write
        is refused and recomputed from a fresh read, never re-sent."""
        before = raising.counts(self.store.obj).current
        self.store.before_write = lambda: adapter.raise_admission(self.store, namespace="ns", name="tj")
        self._raise()
        assert raising.counts(self.store.obj).current == before + 2
        self.raised_since_suspend = True

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule(value=st.integers(0, 5))
    def patch_rewritten(self, value: int) -> None:
        self._write(lambda o: o["spec"].__setitem__("runtimePatches", [raising.patch_entry(value)]))

    @stateful.precondition(lambda self: not self.running)
    @stateful.rule()
    def patch_deleted(self) -> None:
        self._write(lambda o: o["spec"].__setitem__("runtimePatches", []))

    @stateful.precondition(lambda self: self.jobset_uid is not None)
    @stateful.rule()
    def jobset_deleted_and_recreated(self) -> None:
        self.jobset_uid = uuid.uuid4().hex
        self.restarts = 0
        self._observe_jobset()
        if self.running:
            self._start_execution()

    # -- the property ---------------------------------------------------

    @stateful.invariant()
    def r_only_increases_unless_flagged(self) -> None:
        highest = 0
        for r, flagged_before in self.executions:
            assert r > highest or flagged_before, f"R {r} repeated without a flag: {self.executions}"
            highest = max(highest, r)


Identity.TestCase.settings = hypothesis.settings(max_examples=100, stateful_step_count=30, deadline=None)
TestIdentity = Identity.TestCase


def test_the_model_can_fail_without_the_floor(monkeypatch):
    """The property is not vacuous: with the floor ignored, a rewritten patch
    repeats an R with no flag, and the machine finds it."""
    original = raising.counts
    monkeypatch.setattr(raising, "counts", lambda tj: raising.Counts(patch=original(tj).patch, floor=None))
    monkeypatch.setattr(detect, "pod", lambda **kw: None)
    try:
        stateful.run_state_machine_as_test(
            Identity, settings=hypothesis.settings(max_examples=100, stateful_step_count=30, deadline=None, database=None)
        )
    except AssertionError as exc:
        assert "repeated without a flag" in str(exc) or "floor" in str(exc)
    else:
        raise AssertionError("the model accepted a build without the floor")
