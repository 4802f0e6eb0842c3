"""A hypothesis state machine over the operations the other fault modules inject one at a time, on
the real apiserver, Trainer, JobSet, Kueue, our controller (the release's two replicas, as pods) and
the real node: one Kueue-mode
TrainJob per example (its own namespace and queues), driven by these rules:

- approve (while deactivated): the Workload made active again; Kueue reserves quota, our check
  raises A and approves, the pods run. The approval may meet a fault: our controller scaled to
  zero before the raise (the reservation waits on our check while none runs), or, with the moment
  between our raise and our approval held open (`checks.approval_held`), the leading replica's
  container SIGKILLed through the runtime (the standby takes over) or kube-apiserver restarted there;
- approve after an unsuspend by hand (while deactivated): the approval held open after our raise
  (what a Ready refused by a policy or a webhook leaves), and meanwhile a person sets
  spec.suspend false with `kubectl patch`: Trainer creates pods with the raised A before Kueue
  suspends the TrainJob again (their trainer does not start), and the Workload stays as our raise
  found it. Our controller's next pass must raise again (once per example);
- approve without our check (while deactivated, not yet flagged, no raise by hand since the last
  admission): our check taken off the
  ClusterQueue and the Workload made active: Kueue admits it with nothing raised, Trainer resumes
  the same JobSet, and its execution repeats the last one's A, J and JobSet. Detection, not
  prevention: our controller must flag the TrainJob foreign, naming each of its pods as started
  after spec.suspend was set false by another writer than a raise; the execution is the reset the
  flag reports. Then the Workload is deactivated and our check put back;
- deactivate (while running): the Workload deactivated (Kueue evicts it, the TrainJob is
  suspended, its pods stop);
- preempt (while running): a TrainJob of a higher WorkloadPriorityClass takes the quota, runs and
  ends, and Kueue admits ours again (our raise and approval again);
- raise by hand (while deactivated): an extra raise of A by hand (what a pass of ours that died before its
  approval leaves);
- restart (while running): the running execution fails (exit 3), JobSet restarts it (J + 1);
- delete the JobSet (while running, not yet flagged): deleted by hand; Trainer rebuilds it (J from
  0), its execution repeats an identity, and our controller flags the TrainJob foreign;
- fault, at any point: the leading replica's container SIGKILLed through the runtime (the kubelet
  restarts it, the standby takes the Lease), or kube-apiserver stopped and started again.

After every step (`@invariant`), on what the containers printed and what the cluster shows: the
identity rule (`check_identities`: every execution's epoch above every earlier one's unless the
TrainJob was flagged foreign before it ran; the rebuilt JobSet's execution is the reset the flag
reports); while admitted: our check Ready with "A raised to N", N our patch's A and the floor, the
raised-for marker naming this Workload, every live pod carrying N, and one "check ready" logged per
admission (nothing approved twice, nothing approved without its raise); while deactivated: the
TrainJob suspended and no pod left. Every admission is approved within
`checks.ADMISSION_BOUND_SECONDS` of its fault's end (`checks.admitted`), and its A is above every
earlier admission's and above every A a pod of ours was created with, whether it ran or not (Ready
only for an A no execution can have used).

The node's two CPUs hold one execution at a time, so a step waits for the cluster to settle (the
new execution's identity printed, or the pods gone) before the next one.

The search. In `make test` it is bounded by time, not by a count of examples: examples of up to
DISPATCH_FAULTS_STEPS steps (6) are started until DISPATCH_FAULTS_BUDGET seconds (150) have passed
since the first one began (the first example runs to its end; a later one under way then ends at
the step it is at, its checks done, so one long example cannot carry the search far past its
budget), or DISPATCH_FAULTS_EXAMPLES
(100) have run. Its seed is derived from the commit under test (`git rev-parse HEAD`), so one
commit always searches the same sequences of steps (landing is deterministic) and each new commit
searches new ones; DISPATCH_FAULTS_SEED=<seed> overrides it. The seed is printed at the start and
named in a failure's report, with the steps the failing example ran. The search stops at the
first failure and reports it as it happened: no example database, no shrinking, and no run of the
failing example once more (on a live cluster a race or a fault's timing decides a precondition, so
a second run need not take the same steps). To replay a failure: the same command with DISPATCH_FAULTS_SEED set to that seed (and
the same budget, or DISPATCH_FAULTS_BUDGET=0 with DISPATCH_FAULTS_EXAMPLES set to the failing
example's number: the same seed draws the same examples in the same order). `make faults-soak`
runs 20 examples of up to 10 steps with no time budget (DISPATCH_FAULTS_BUDGET=0).

The search's bias is the rules' order. Hypothesis's first example takes, at every step, the first
rule (in its order: the rules without arguments first, by name) whose precondition holds, so in
every run the first example is `deactivate`, `approve_after_an_unsuspend_by_hand` (the shortest
trace in which an approval would carry an A a pod was created with if the pass approved on the
raised-for marker alone), `deactivate`, `approve_without_our_check` (the shortest in which an
execution repeats the last one's identity with nothing to flag it but who unsuspended it),
then `raise_by_hand` twice (the TrainJob is left suspended: `approve_without_our_check` ends
with a deactivation). The examples after it draw the rules at random.
"""

from __future__ import annotations

import datetime
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, ClassVar

import hypothesis
import hypothesis.errors
import hypothesis.stateful
import hypothesis.strategies as st
import kubernetes.client

from controller import admission
from devcluster import harness, install, scenario as flow, stack as stack_mod
from devcluster.scenario import Execution, Scenario
from tests import namespaces
from tests.faults import checks
from toolkit import adapter, names, raising

log = logging.getLogger(__name__)
EXAMPLES = int(os.environ.get("DISPATCH_FAULTS_EXAMPLES", "100"))
STEPS = int(os.environ.get("DISPATCH_FAULTS_STEPS", "6"))
BUDGET = float(os.environ.get("DISPATCH_FAULTS_BUDGET", "150"))  # seconds; 0: no time budget
# Each execution runs until it is stopped (SIGTERM: exit 0) or takes the file /marks/fail (exit 3: a
# rank failure). `rm` succeeds for one execution only, so one rank fails per file the test writes.
COMMAND = ["/bin/sh", "-c",
           'env; trap "exit 0" TERM; while :; do rm /marks/fail 2>/dev/null && exit 3; sleep 0.2 & wait $!; done']
TRAINER_API = ("trainer.kubeflow.org", "v1alpha1")
# What our controller's flag says of a pod created after someone other than a raise unsuspended it.
RESUMED = "started after spec.suspend was set false by "
FAULTS = ("our controller killed", "kube-apiserver restarted")
APPROVAL_FAULTS = (
    None,
    "our controller killed before the raise",
    "our controller killed between the raise and the approval",
    "kube-apiserver restarted between the raise and the approval",
)


class FaultMachine(hypothesis.stateful.RuleBasedStateMachine):
    stack: ClassVar[stack_mod.Stack]

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []  # what this example has done, for its failure's report
        self.api = self.stack.plane.api_client()
        self.namespace = f"fault-sm-{uuid.uuid4().hex[:8]}"
        # Its default ServiceAccount may take a while: a step may have restarted kube-controller-manager
        # (the garbage collector's gap), which lists everything again before its ServiceAccount
        # controller runs.
        harness.create_namespace(self.api, self.namespace, timeout=120.0)
        flow.kueue_queues(self.api, suffix=self.namespace, namespace=self.namespace,
                          check_controller=admission.CONTROLLER_NAME)
        self.check = f"ac-{self.namespace}"
        log.info("example: namespace %s", self.namespace)
        self.marks = pathlib.Path(tempfile.mkdtemp(prefix="fault-sm-"))
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.sc = Scenario(self.stack, self.api, self.namespace)
        # Restarts are the machine's to choose: no failure policy ends the JobSet first.
        # 750m: a superseded execution's pod still terminating and the next one's fit the node's 2 CPUs
        # beside our controller's two pods and CoreDNS; the quota (1500m) still holds one at a time.
        self.sc.create_runtime(flow.runtime("sm", cpu="750m", max_restarts=100, host_dirs={flow.MARKS: self.marks}))
        # Scenario.start asks again while Trainer's or Kueue's webhook has not seen the runtime yet.
        self.sc.start("sm", queue="lq", job_id="fault.sm", command=COMMAND)
        self.resets: list[Execution] = []
        self.admissions: list[int] = []  # the A of each admission, in order
        self.created_with: set[int] = set()  # the A of every pod of ours seen created, run or not
        self.preemptors = 0
        self.running = False
        self.unsuspended_by_hand = False
        self.raised_by_hand = False  # since the last admission
        self._admitted(since=time.monotonic())

    def _step(self, step: str) -> None:
        log.info("step: %s", step)
        self.steps.append(step)

    # -- what every admission must show -----------------------------------------------------------

    def _admitted(self, *, since: float) -> None:
        """Admitted within the bound from SINCE, with A above every earlier admission's; the new
        execution's pods carry it and have printed their identity."""
        n = checks.admitted(self.sc, self.check, since=since)
        assert all(n > earlier for earlier in self.admissions), (n, self.admissions)
        # Ready only for an A no pod has been created with (controller/admission.py).
        assert all(n > used for used in self.created_with), (n, sorted(self.created_with))
        self.admissions.append(n)
        self.created_with.add(n)
        self.raised_by_hand = False
        pods = self.sc.new_pods()
        checks.carry(pods, n)
        for pod in pods:
            self.sc.run(pod)
        self.running = True

    def _set_active(self, active: bool) -> None:
        self.custom.patch_namespaced_custom_object(*flow.KUEUE_API, self.namespace, "workloads",
                                                   self.sc.workload()["metadata"]["name"], {"spec": {"active": active}})

    def _stopped(self) -> None:
        self.sc.wait("the TrainJob suspended and its pods gone",
                     lambda: self.sc.trainjob()["spec"].get("suspend") and not self.sc.pods())
        self.running = False

    # -- rules ------------------------------------------------------------------------------------

    @hypothesis.stateful.precondition(lambda self: not self.running)
    @hypothesis.stateful.rule(fault=st.sampled_from(APPROVAL_FAULTS))
    def approve(self, fault: str | None) -> None:
        self._step(f"approve ({fault or 'no fault'})")
        a = raising.counts(self.sc.trainjob()).current
        if fault is None:
            self._set_active(True)
        elif fault == "our controller killed before the raise":
            self.stack.ours.stop()
            self._set_active(True)
            checks.reserved_not_raised(self.sc, self.check, admission=a)
            self.stack.ours.start()
        else:
            with checks.approval_held(self.api, self.check, namespace=self.namespace):
                self._set_active(True)
                checks.raised_not_approved(self.sc, self.check, above=a)
                if fault.startswith("our controller"):
                    self.stack.ours.kill_leader()
                else:
                    self._restart_apiserver()
        self._admitted(since=time.monotonic())

    @hypothesis.stateful.precondition(lambda self: not self.running and not self.unsuspended_by_hand)
    @hypothesis.stateful.rule()
    def approve_after_an_unsuspend_by_hand(self) -> None:
        """The Workload made active again with our approval held open after our raise (as a Ready
        refused by a policy or a webhook, or a controller stopped between its two writes, leaves
        it); meanwhile a person unsuspends the TrainJob by hand (`kubectl patch --type merge -p
        '{"spec":{"suspend":false}}'`). Trainer creates pods with the raised A before Kueue suspends
        the TrainJob again (its Workload is not admitted), and the Workload stays as our raise
        found it. Once the hold ends, our controller's next pass must raise again: the approval's A
        is above every A a pod was created with (`_admitted`)."""
        self._step("approve_after_an_unsuspend_by_hand")
        self.unsuspended_by_hand = True
        a = raising.counts(self.sc.trainjob()).current
        with checks.approval_held(self.api, self.check, namespace=self.namespace):
            self._set_active(True)
            checks.raised_not_approved(self.sc, self.check, above=a)
            self.custom.patch_namespaced_custom_object(*TRAINER_API, self.namespace, "trainjobs", self.sc.name,
                                                       {"spec": {"suspend": False}}, field_manager="kubectl-patch")
            created: dict[str, int] = {}  # by pod UID: the A it was created with

            def suspended_again() -> bool:
                pods = self.sc.pods()
                for pod in pods:
                    meta = pod["metadata"]
                    found = (meta.get("annotations") or {}).get(names.ADMISSION_ANNOTATION)
                    if found is not None:
                        created[meta["uid"]] = int(found)
                return bool(self.sc.trainjob()["spec"].get("suspend")) and not pods

            self.sc.wait("Kueue to suspend the TrainJob again and its pods to go", suspended_again)
            self.created_with.update(created.values())
            self.sc.seen_pods.update(created)
            # No flag is required here: on this cluster those pods are suspended again before their
            # trainer starts (no execution), and our controller flags them only when it judges them
            # before Kueue's suspension (the resume rule reads who set spec.suspend false last).
            hypothesis.event(f"the resume by hand: {len(created)} pods created, "
                             f"{'flagged' if self.sc.foreign() else 'not flagged'}")
        self._admitted(since=time.monotonic())

    # Not after a raise by hand: a raise since the suspension makes the resume a new A, not a repeat.
    @hypothesis.stateful.precondition(lambda self: not self.running and not self.resets and not self.raised_by_hand)
    @hypothesis.stateful.rule()
    def approve_without_our_check(self) -> None:
        """Our check taken off the ClusterQueue, the Workload made active: Kueue admits it asking
        nobody, and Trainer resumes the same JobSet with the A of the last admission. Its execution
        repeats the last one's identity; our controller must flag each of its pods as started after
        a writer other than a raise set spec.suspend false. Then deactivated, our check put back."""
        self._step("approve_without_our_check")
        queue = f"cq-{self.namespace}"
        strategy = self.custom.get_cluster_custom_object(*flow.KUEUE_API, "clusterqueues", queue)["spec"][
            "admissionChecksStrategy"]
        self.custom.patch_cluster_custom_object(*flow.KUEUE_API, "clusterqueues", queue,
                                                {"spec": {"admissionChecksStrategy": None}})
        self._set_active(True)
        pods = self.sc.new_pods()
        carried = {int(p["metadata"]["annotations"][names.ADMISSION_ANNOTATION]) for p in pods}
        self.created_with.update(carried)
        if carried != {self.admissions[-1]}:
            # Our controller raised on the reservation before Kueue saw our check gone: a new A, no
            # repeat, nothing to flag. Its Ready may have landed too, while the Workload still
            # listed the check: then this admission is one of ours (one "check ready" more).
            # Deactivated again, our check put back.
            raised = max(carried)
            ours = [line for line in checks.ready_lines(self.stack, self.sc, expect=len(self.admissions) + 1)
                    if line.get("admission") == raised]
            if ours:
                self.admissions.append(raised)
            hypothesis.event("approve without our check: raised before Kueue saw the check gone, "
                             f"{'approved' if ours else 'not approved'} by our controller")
            for pod in pods:
                self.sc.run(pod)
            self._set_active(False)
            self._stopped()
            self.custom.patch_cluster_custom_object(*flow.KUEUE_API, "clusterqueues", queue,
                                                    {"spec": {"admissionChecksStrategy": strategy}})
            return
        self.resets.extend(self.sc.run(pod) for pod in pods)  # nothing raised: the repeat

        def flagged() -> bool:
            lines = [line for line in (self.sc.foreign() or "").split("\n") if RESUMED in line]
            return all(any(line.startswith(f"pod {p['metadata']['name']} ") for line in lines) for p in pods)

        self.sc.wait("each pod of the admission without our check flagged", flagged,
                     timeout=checks.ADMISSION_BOUND_SECONDS)
        self._set_active(False)
        self._stopped()
        self.custom.patch_cluster_custom_object(*flow.KUEUE_API, "clusterqueues", queue,
                                                {"spec": {"admissionChecksStrategy": strategy}})

    @hypothesis.stateful.precondition(lambda self: self.running)
    @hypothesis.stateful.rule()
    def deactivate(self) -> None:
        self._step("deactivate")
        self._set_active(False)
        self._stopped()

    @hypothesis.stateful.precondition(lambda self: self.running)
    @hypothesis.stateful.rule()
    def preempt(self) -> None:
        """A TrainJob of a higher priority takes the quota, runs and ends; Kueue admits ours again."""
        self._step("preempt")
        self.preemptors += 1
        high = Scenario(self.stack, self.api, self.namespace, service_account=False)
        high.start("sm", queue="lq", job_id=f"fault.high{self.preemptors}",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{self.namespace}"})
        self._stopped()
        assert checks.admitted(high, self.check, since=time.monotonic()) >= 1
        for pod in high.new_pods():
            assert high.run(pod, until_exit=True).exit_code == 0
        high.check_identities()
        self._admitted(since=time.monotonic())

    @hypothesis.stateful.precondition(lambda self: not self.running)
    @hypothesis.stateful.rule()
    def raise_by_hand(self) -> None:
        self._step("raise_by_hand")
        self.raised_by_hand = True
        before = raising.counts(self.sc.trainjob()).current
        raised = adapter.raise_admission(self.sc.client, namespace=self.namespace, name=self.sc.name)
        assert raised.admission == before + 1

    @hypothesis.stateful.precondition(lambda self: self.running)
    @hypothesis.stateful.rule()
    def restart(self) -> None:
        self._step("restart")
        [j] = {int(p["metadata"]["labels"][names.RESTART_LABEL]) for p in self.sc.pods()}
        (self.marks / "fail").touch()
        pods = self.sc.new_pods()
        assert {p["metadata"]["labels"][names.RESTART_LABEL] for p in pods} == {str(j + 1)}
        checks.carry(pods, self.admissions[-1])  # a JobSet restart raises nothing
        for pod in pods:
            self.sc.run(pod)

    @hypothesis.stateful.precondition(lambda self: self.running and not self.resets)
    @hypothesis.stateful.rule()
    def delete_jobset(self) -> None:
        self._step("delete_jobset")
        old = self.sc.wait("the JobSet UID recorded", lambda: (
            self.sc.trainjob()["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION))
        self.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", self.namespace, "jobsets",
                                                    self.sc.name, body={"propagationPolicy": "Background"})
        new = self.sc.wait("Trainer to build a new JobSet", lambda: (
            (js := self.sc.jobset()) and js["metadata"]["uid"] != old and js))
        if not self._orphans_collected(old, timeout=checks.ADMISSION_BOUND_SECONDS):
            # The garbage collector's gap (docs/e2e.md, "The fault state machine"): restarted, it
            # lists everything again and collects the orphan.
            hypothesis.event("the garbage collector missed the deleted JobSet")
            self.stack.plane.stop_component("kube-controller-manager")
            self.stack.plane.start_component("kube-controller-manager")
            assert self._orphans_collected(old, timeout=checks.ADMISSION_BOUND_SECONDS)
        # The rebuilt JobSet's pods race their own detection (test_trainer_rebuild.py): the reset.
        self.resets.extend(self.sc.run(pod) for pod in self.sc.new_pods())
        cause = f"JobSet UID {new['metadata']['uid']} is not the recorded {old}: J may have been reset"
        self.sc.wait("the foreign flag", lambda: cause in (self.sc.foreign() or "").split("\n"))

    def _orphans_collected(self, jobset_uid: str, *, timeout: float) -> bool:
        """Whether the Jobs of the deleted JobSet JOBSET_UID are gone within TIMEOUT. A Job left
        must be exactly the garbage collector's gap: owned by that UID, which no JobSet has now."""
        batch = kubernetes.client.BatchV1Api(self.api)

        def owned() -> list[str]:
            return [j.metadata.name for j in batch.list_namespaced_job(self.namespace).items
                    if any(r.uid == jobset_uid for r in j.metadata.owner_references or [])]
        try:
            self.sc.wait("the deleted JobSet's Jobs to be collected", lambda: not owned(), timeout=timeout)
        except AssertionError:
            assert owned() and (self.sc.jobset() or {})["metadata"]["uid"] != jobset_uid
            return False
        return True

    @hypothesis.stateful.rule(which=st.sampled_from(FAULTS))
    def fault(self, which: str) -> None:
        self._step(f"fault ({which})")
        if which == "our controller killed":
            self.stack.ours.kill_leader()
        else:
            self._restart_apiserver()

    def _restart_apiserver(self) -> None:
        """Stop and start kube-apiserver; return once one of our controller's pods, Ready, has
        renewed the Lease since: a leader that could not renew while the apiserver was away stops
        its work and campaigns again in its process, within `checks.LEADER_BACK_SECONDS` of the
        apiserver answering pods again (`checks.started_again`). Every bound after it is our
        controller's own."""
        self.stack.plane.stop_apiserver()
        checks.started_again(self.stack, "kube-apiserver")
        install.wait_leading(self.stack, timeout=checks.LEADER_BACK_SECONDS,
                             renewed_after=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0))

    # -- after every step -------------------------------------------------------------------------

    @hypothesis.stateful.invariant()
    def identities_hold(self) -> None:
        self.sc.check_identities(resets=self.resets)

    @hypothesis.stateful.invariant()
    def admission_as_approved(self) -> None:
        workload = self.sc.workload()
        entry = checks.check_entry(workload, self.check)
        tj = self.sc.trainjob()
        live = [p for p in self.sc.pods() if not p["metadata"].get("deletionTimestamp")]
        if self.running:
            n = self.admissions[-1]
            assert entry.get("state") == "Ready" and checks.condition(workload, "Admitted"), entry
            assert entry["message"] == f"A raised to {n}", entry
            assert raising.counts(tj) == raising.Counts(patch=n, floor=n), raising.counts(tj)
            assert checks.marker_uid(tj) == workload["metadata"]["uid"]
            checks.carry(live, n)
        else:
            assert entry.get("state") != "Ready" and tj["spec"].get("suspend") and not live, (entry, live)
        assert len(checks.ready_lines(self.stack, self.sc, expect=len(self.admissions))) == len(self.admissions)

    def teardown(self) -> None:
        """Delete the namespace and wait for its pods to go: the next example needs the node's CPUs."""
        try:
            namespaces.leave(self.api, [self.namespace], timeout=90)
        finally:
            self.api.close()
            shutil.rmtree(self.marks, ignore_errors=True)


def search_seed() -> int:
    """DISPATCH_FAULTS_SEED, else derived from the commit under test (its first 12 hex digits)."""
    given = os.environ.get("DISPATCH_FAULTS_SEED")
    if given:
        return int(given)
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pathlib.Path(__file__).parent, capture_output=True,
                          text=True, check=False)
    return int(done.stdout.strip()[:12] or "0", 16)


class SearchEnded(KeyboardInterrupt):
    """Ends the search: its time budget spent, or an example failed. A KeyboardInterrupt because
    hypothesis lets only an interrupt end a run without recording the example under way as a test
    case. Any other exception would count as a failure, and hypothesis would run the failing example
    once more to report it; on a live cluster that replay cannot be the same run (a race decides a
    precondition, a fault lands one step earlier), and hypothesis then reports its inconsistent data
    generation instead of the failure. So the failure is kept here and reported as it happened."""


class ExampleFailed(AssertionError):
    """An example of the search failed: which one, the steps it took, and (chained) what failed."""


class Budget:
    """The search's time budget and its first failure: a new example starts while the budget lasts
    (the first always does) and no example has failed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start: float | None = None
        self.started = 0
        self.failure: tuple[BaseException, list[str]] | None = None

    def elapsed(self) -> float:
        return 0.0 if self.start is None else time.monotonic() - self.start

    def spent(self) -> bool:
        return self.seconds > 0 and self.elapsed() >= self.seconds

    def admits_another(self) -> bool:
        if self.start is None:
            self.start = time.monotonic()
        if self.started and self.seconds > 0 and self.elapsed() >= self.seconds:
            return False
        self.started += 1
        return True


def test_the_fault_machine(stack: stack_mod.Stack) -> None:
    seed = search_seed()
    budget = Budget(BUDGET)
    print(f"fault machine search: seed {seed} (DISPATCH_FAULTS_SEED={seed} replays it), budget "
          f"{BUDGET:g} s, up to {EXAMPLES} examples of up to {STEPS} steps", flush=True)

    class Bounded(FaultMachine):
        def __init__(self) -> None:
            if not budget.admits_another():
                raise SearchEnded  # before the example touches the cluster
            log.info("example %d (seed %d), %.0f s into the search", budget.started, seed, budget.elapsed())
            self.steps = []
            try:
                super().__init__()
            except Exception as e:
                budget.failure = (e, ["(setting the example up)"])
                raise SearchEnded from e

        @hypothesis.stateful.invariant()
        def within_the_time_budget(self) -> None:
            # Last of the invariants (hypothesis runs them by name), so the step's checks have run.
            # After the first example, no step starts once the budget is spent: the example under
            # way ends at the step it is at, and one long example cannot carry the search minutes
            # past its budget (nor the test past its timeout).
            if budget.started > 1 and budget.spent():
                raise SearchEnded

        def teardown(self) -> None:
            # Called from hypothesis's `finally`: an exception under way is this example's failure,
            # unless it is hypothesis's own control flow (an example cut short, a BaseException).
            raised = sys.exc_info()[1]
            failed = isinstance(raised, Exception) and not isinstance(raised, hypothesis.errors.HypothesisException)
            try:
                super().teardown()
            finally:
                if failed:
                    assert raised is not None
                    budget.failure = (raised, self.steps)
                    raise SearchEnded from raised

    machine: Any = hypothesis.seed(seed)(type("FaultMachineOnTheStack", (Bounded,), {"stack": stack}))
    try:
        hypothesis.stateful.run_state_machine_as_test(machine, settings=hypothesis.settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
            suppress_health_check=list(hypothesis.HealthCheck)))
    except SearchEnded:
        pass
    finally:
        print(f"fault machine search: seed {seed}, {budget.started} examples in {budget.elapsed():.0f} s",
              flush=True)
    if budget.failure is not None:
        error, steps = budget.failure
        raise ExampleFailed(
            f"example {budget.started} of seed {seed} failed after the steps: {', '.join(steps) or '(none)'} "
            f"(replay: DISPATCH_FAULTS_SEED={seed} DISPATCH_FAULTS_BUDGET=0 DISPATCH_FAULTS_EXAMPLES="
            f"{budget.started}): {type(error).__name__}: {error}") from error
