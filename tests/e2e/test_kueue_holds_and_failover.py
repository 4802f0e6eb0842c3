"""Kueue mode's holds, a hand-made stop or start around them, and our controller's failover, on
the real controllers and the real node.

A hold in Kueue mode is Kueue's own (the Workload's spec.active false, then true): Kueue evicts the
Workload, the pods stop, and the next admission goes through our check, which raises A. Anything
else that stops or starts an admitted execution brings its pods back with the same A and J, so
its epoch repeats; that is detected and flagged, never silent:

- `kubectl patch ... suspend:true` on an admitted TrainJob: Kueue unsuspends it again (its Workload
  is still admitted), and a new pod runs the stopped execution's epoch. The flag names the rule
  that saw it (r-repeat: a pod created after a pod of its execution was stopped, or pods on both
  sides of an unsuspend) and goes out before the new pod's trainer starts (the sidecar's first
  check holds the trainer back).
- `kubectl patch ... suspend:false` while the Workload is evicted (held): no admission raised A for
  what starts.

The patches are made as a person makes them, by the cluster's own kubectl (`--type merge`, field
manager "kubectl-patch").

Our controller runs as the release installs it: two replicas, one leading over the Lease. A
failover (the leader's pod deleted) hands the work to the standby, which acts only on synced caches,
so the TrainJobs it finds running are not flagged. A leader cut off from the apiserver (its pod's
packets to the apiserver dropped on the host, as a partition drops them; the apiserver keeps
running) steps down within the renew deadline of its last renewal, before the standby takes the
Lease, which happens within the lease duration.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from controller import settings as settings_mod
from devcluster import install, polling
from devcluster import scenario as flow
from devcluster import stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, history, names

E2E_KUEUE = True  # our controller runs (with Kueue) in this module's stack

STOPPED = "after a pod of it was stopped at "  # detect.resumed_after_stop
UNSUSPENDED = "before and after the unsuspend at "  # history.repeat_across_unsuspend
# The release's controller runs with the default election settings (its Deployment sets none).
ELECTION = settings_mod.Settings.from_env({})
# How long after a failover a standby that judged on unsynced caches would have flagged the
# TrainJobs it found running: its first passes over them are done well within this.
QUIET_SECONDS = 15.0


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[Scenario]:
    with stack.plane.api_client() as api:
        yield Scenario(stack, api, e2e_namespace)


def _kubectl(scenario: Scenario, *args: str) -> str:
    """The cluster's kubectl (built from the control plane's release) on the admin kubeconfig."""
    done = subprocess.run([str(install.kubectl(scenario.stack)), "--kubeconfig", str(scenario.stack.plane.kubeconfig),
                           *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _patch_suspend(scenario: Scenario, suspend: bool) -> None:
    """`kubectl patch trainjob NAME --type merge -p '{"spec":{"suspend":...}}'`."""
    _kubectl(scenario, "patch", "trainjob", scenario.name, "-n", scenario.namespace, "--type", "merge",
             "-p", json.dumps({"spec": {"suspend": suspend}}))


def _causes(scenario: Scenario) -> list[str]:
    return [line for line in (scenario.foreign() or "").split("\n") if line]


def _check_entry(scenario: Scenario, queues: str) -> dict[str, Any]:
    """Our AdmissionCheck's entry on the TrainJob's Workload."""
    entries = (scenario.workload().get("status") or {}).get("admissionChecks") or []
    return dict(next(e for e in entries if e["name"] == f"ac-{queues}"))


def _admission(pods: list[dict[str, Any]]) -> int:
    [a] = {int(p["metadata"]["annotations"][names.ADMISSION_ANNOTATION]) for p in pods}
    return a


def _verdicts(scenario: Scenario) -> dict[tuple[int, int], str]:
    """(A, J) -> the verdict our controller recorded for that execution in the TrainJob's history."""
    return {(e.a, e.j): e.verdict for e in history.of(scenario.trainjob()).executions}


def _evicted(scenario: Scenario) -> dict[str, Any] | None:
    """The Workload's Evicted condition while it is true, else None."""
    conditions = (scenario.workload().get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Evicted" and c["status"] == "True"), None)


def _held(scenario: Scenario) -> dict[str, Any]:
    """Hold through the adapter (Kueue mode: the Workload's spec.active false) and wait for Kueue's
    eviction, the TrainJob suspended and its pods gone; the Evicted condition."""
    assert adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert scenario.workload()["spec"]["active"] is False
    evicted = scenario.wait("Kueue to evict the deactivated Workload", lambda: _evicted(scenario))
    assert evicted["reason"] == "Deactivated", evicted
    scenario.wait("Kueue to suspend the TrainJob", lambda: scenario.trainjob()["spec"].get("suspend") is True)
    scenario.wait("the held execution's pods to go", lambda: not scenario.pods())
    return evicted


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def _trainer_started_at(pod: dict[str, Any]) -> str:
    """When the kubelet started the pod's trainer container (its first run: running now, ended,
    or ended and restarted), RFC 3339 to the second."""
    status = flow.container_status(pod, flow.TRAINER_CONTAINER) or {}
    for state in (status.get("lastState") or {}, status.get("state") or {}):
        for kind in ("terminated", "running"):
            if (state.get(kind) or {}).get("startedAt"):
                return str(state[kind]["startedAt"])
    raise AssertionError(f"pod {pod['metadata']['name']}: its trainer container has not started: {status}")


def test_a_suspend_by_hand_undone_by_kueue_is_flagged_before_the_new_pod_runs(scenario: Scenario,
                                                                               queues: str) -> None:
    scenario.create_runtime(flow.runtime("stopped", cpu="1"))
    scenario.start("stopped", queue="lq", env={"STAY": "1"})
    first_pods = scenario.new_pods()
    first = [scenario.run(pod) for pod in first_pods]
    a = _admission(first_pods)
    assert _check_entry(scenario, queues)["message"] == f"A raised to {a}"  # admitted through our check
    assert _causes(scenario) == []

    _patch_suspend(scenario, True)
    # Kueue starts the TrainJob again (its Workload is still admitted); the JobSet's pods come back.
    pods = scenario.new_pods()
    again = [scenario.run(pod) for pod in pods]
    assert [(e.epoch, e.attempt) for e in again] == [(e.epoch, e.attempt) for e in first]
    assert _admission(pods) == a  # no admission raised A: the same execution, resumed

    lines = scenario.wait("the resumed execution flagged", lambda: [c for c in _causes(scenario)
                                                                    if STOPPED in c or UNSUSPENDED in c])
    j = int(pods[0]["metadata"]["labels"][names.RESTART_LABEL])
    assert f"the execution A={a} J={j}, R {a + j}, has " in lines[0], lines
    assert _verdicts(scenario)[(a, j)] == "foreign: r-repeat"
    assert scenario.trainjob()["spec"]["suspend"] is False  # nothing stopped

    # The flag went out before the new pods' trainers started: its Warning Event's creation (the
    # apiserver's clock) against each trainer container's startedAt (the kubelet's; one host, one
    # clock). Both are stamped to the second, so "before" reads "not in a later second".
    events = scenario.events(names.FOREIGN_REASON)
    assert events, "the flag's Warning Event"
    flagged_at = min(_time(e["metadata"]["creationTimestamp"]) for e in events)
    for pod in pods:
        started_at = _trainer_started_at(scenario.pod(pod["metadata"]["name"]))
        assert flagged_at <= _time(started_at), (
            f"flagged at {flagged_at.isoformat()}, pod {pod['metadata']['name']}'s trainer started at {started_at}; "
            f"causes: {lines}")


def test_hold_then_release_in_kueue_mode_raises_admission_and_flags_nothing(scenario: Scenario,
                                                                            queues: str) -> None:
    scenario.create_runtime(flow.runtime("held", cpu="1"))
    scenario.start("held", queue="lq", env={"STAY": "1"})
    first_pods = scenario.new_pods()
    [first] = [scenario.run(pod) for pod in first_pods]
    a = _admission(first_pods)

    _held(scenario)
    entry = _check_entry(scenario, queues)
    assert entry["state"] == "Pending", entry  # Kueue reset our check at the eviction

    released = adapter.release(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert released.requeued == (scenario.workload()["metadata"]["name"],)
    pods = scenario.new_pods()
    [again] = [scenario.run(pod) for pod in pods]
    raised = _admission(pods)
    assert raised > a
    assert _check_entry(scenario, queues)["message"] == f"A raised to {raised}"
    assert int(again.epoch or 0) > int(first.epoch or 0)

    # Our controller has judged the new execution (its record is in the history) and found nothing.
    j = int(pods[0]["metadata"]["labels"][names.RESTART_LABEL])
    scenario.wait("the new execution recorded", lambda: (raised, j) in _verdicts(scenario))
    verdicts = _verdicts(scenario)
    assert set(verdicts.values()) == {"ok"}, verdicts
    assert scenario.foreign() is None
    assert scenario.events(names.FOREIGN_REASON) == []
    scenario.check_identities()


def test_an_unsuspend_by_hand_while_the_workload_is_evicted_is_flagged(scenario: Scenario, queues: str) -> None:
    scenario.create_runtime(flow.runtime("unheld", cpu="1"))
    scenario.start("unheld", queue="lq", env={"STAY": "1"})
    first_pods = scenario.new_pods()
    for pod in first_pods:
        scenario.run(pod)
    a, j = _admission(first_pods), int(first_pods[0]["metadata"]["labels"][names.RESTART_LABEL])
    assert _causes(scenario) == []
    evicted = _held(scenario)

    _patch_suspend(scenario, False)
    seen: dict[str, str] = {}  # every pod seen after the patch, and its phase

    def flagged() -> list[str]:
        seen.update({p["metadata"]["name"]: p["status"].get("phase") for p in scenario.pods()})
        return _causes(scenario)

    try:
        causes = scenario.wait("the unsuspend while held flagged", flagged, timeout=60.0)
    except AssertionError as e:
        raise AssertionError(f"{e}; evicted since {evicted['lastTransitionTime']}; pods seen after the patch: "
                             f"{seen}; the TrainJob's spec.suspend now: {scenario.trainjob()['spec'].get('suspend')}") from None
    # What started was the held execution (A and J unchanged: no admission raised A), judged foreign.
    assert scenario.wait("the execution's verdict", lambda: _verdicts(scenario).get((a, j), "").startswith("foreign: ")), (
        causes, _verdicts(scenario))
    assert _evicted(scenario) is not None  # still held: what ran was not admitted


def test_a_failover_with_three_running_trainjobs_flags_none(stack: stack_mod.Stack, e2e_namespace: str,
                                                            queues: str) -> None:
    with stack.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        coord = kubernetes.client.CoordinationV1Api(api)
        jobs = [Scenario(stack, api, e2e_namespace, service_account=i == 0) for i in range(3)]
        jobs[0].create_runtime(flow.runtime("three", cpu="300m"))
        for i, sc in enumerate(jobs):
            sc.start("three", queue="lq", job_id=f"e2e.three{i}", env={"STAY": "1"})
        running = {}
        for sc in jobs:
            pods = sc.new_pods()
            for pod in pods:
                sc.run(pod)
            running[sc.name] = sorted(p["metadata"]["uid"] for p in pods)
            assert sc.foreign() is None

        stack.ours.all_running()  # the standby is there to take over, as in production
        leader = stack.ours.leader()
        core.delete_namespaced_pod(leader, install.NAMESPACE)
        # The Lease is left to expire; then the standby, or the replica the Deployment made in the
        # deleted pod's place, takes it, whichever asks first.
        holder = jobs[0].wait("another replica to take the Lease", lambda: _holder(core, coord, but=leader),
                              timeout=ELECTION.lease_duration + 45.0)
        # /leaderz answers 200 only on the leader whose informers have all listed.
        jobs[0].wait("the new leader's /leaderz", lambda: _leaderz(holder), timeout=60.0)
        time.sleep(QUIET_SECONDS)

        for sc in jobs:
            assert sc.foreign() is None, (sc.name, sc.foreign())
            assert set(_verdicts(sc).values()) == {"ok"}, (sc.name, _verdicts(sc))
            assert sorted(p["metadata"]["uid"] for p in sc.pods()) == running[sc.name]  # left running
        stack.ours.all_running()  # the Deployment's new replica: a standby again for what follows


def _holder(core: kubernetes.client.CoreV1Api, coord: kubernetes.client.CoordinationV1Api, *,
            but: str) -> kubernetes.client.V1Pod | None:
    """The controller pod that holds the Lease, unless it is BUT (or none does)."""
    identity = _lease(coord).holder_identity or ""
    pods = core.list_namespaced_pod(install.NAMESPACE, label_selector=install.SELECTOR).items
    return next((p for p in pods if identity.startswith(p.metadata.name) and p.metadata.name != but), None)


def _leaderz(pod: kubernetes.client.V1Pod) -> bool:
    """POD's /leaderz answers 200 (asked from the host, as the kubelet probes it: not through the
    apiserver)."""
    [port] = [p.container_port for c in pod.spec.containers for p in c.ports or [] if p.name == "health"]
    try:
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{port}/leaderz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _lease(coord: kubernetes.client.CoordinationV1Api) -> kubernetes.client.V1LeaseSpec:
    return coord.read_namespaced_lease(install.LEASE, install.NAMESPACE, _request_timeout=5).spec


def _dropped(rule: list[str]) -> int:
    """Packets the INPUT rule RULE (as given to `iptables -I INPUT`) has dropped."""
    listed = subprocess.run(["iptables", "-S", "INPUT", "-v"], capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines():
        if all(part in line.split() for part in rule if not part.startswith("-")) and "DROP" in line:
            words = line.split()
            return int(words[words.index("-c") + 1])
    raise AssertionError(f"no such rule in INPUT: {rule}; {listed}")


def _log_lines(core: kubernetes.client.CoreV1Api, pod: str) -> list[dict[str, Any]]:
    """The JSON lines of POD's controller container, read through the kubelet (pods/log): the
    running instance's, and the one before it if the kubelet restarted it."""
    lines = []
    for previous in (True, False):
        try:
            text = core.read_namespaced_pod_log(pod, install.NAMESPACE, container="controller", previous=previous)
        except kubernetes.client.ApiException as e:
            if previous and e.status == 400:  # no earlier instance
                continue
            raise
        lines += [json.loads(line) for line in str(text).splitlines() if line.startswith("{")]
    return lines


def test_a_leader_cut_off_from_the_apiserver_steps_down_within_the_renew_deadline(stack: stack_mod.Stack) -> None:
    with stack.plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        coord = kubernetes.client.CoordinationV1Api(api)
        replicas = stack.ours.all_running()
        leader = stack.ours.leader()
        [standby] = [r for r in replicas if r != leader]
        cut_off = core.read_namespaced_pod(leader, install.NAMESPACE)
        address = cut_off.status.pod_ip
        server = urllib.parse.urlsplit(stack.plane.server)
        # The pod reaches the apiserver through the kubernetes Service: DNAT to the apiserver's address
        # on the node, delivered locally, so its packets pass INPUT with the pod's own source.
        rule = ["-s", f"{address}/32", "-d", f"{server.hostname}/32", "-p", "tcp", "-m", "tcp",
                "--dport", str(server.port), "-j", "DROP"]
        last = _lease(coord)
        subprocess.run(["iptables", "-I", "INPUT", *rule], check=True)
        try:
            cut = time.time()
            bound = ELECTION.lease_duration + 2 * ELECTION.retry_period + 1.0

            def taken_over() -> kubernetes.client.V1LeaseSpec | None:
                nonlocal last
                assert time.time() - cut < bound, (
                    f"the Lease still held by {last.holder_identity} {time.time() - cut:.1f} s after the cut "
                    f"(bound {bound:.0f} s: the lease duration, two retry periods, 1 s)")
                now = _lease(coord)
                if now.holder_identity.startswith(leader):
                    last = now  # the cut-off leader's last renewal, as the Lease keeps it
                    return None
                return now

            taken = polling.until("the Lease taken over", taken_over, timeout=bound + 5.0)
            assert taken.holder_identity.startswith(standby), taken.holder_identity
            assert not _leaderz(cut_off)  # it says so itself, asked from the host
            dropped = _dropped(rule)
            lines = polling.until("the cut-off leader's log to say it lost the lease", lambda: [
                line for line in _log_lines(core, leader)
                if str(line.get("message", "")).startswith("lost the lease") and _time(line["time"]).timestamp() >= cut],
                timeout=30.0)
        finally:
            subprocess.run(["iptables", "-D", "INPUT", *rule], check=True)
        assert dropped > 0  # the cut was real: the leader's packets to the apiserver were dropped
        lost_at = _time(lines[0]["time"])
        renewed_at = last.renew_time
        # Log times to the millisecond, the Lease's to the microsecond, one host's clock. The renew
        # deadline counts from the start of the last renewal that succeeded, which the Lease records;
        # 1 s covers the watchdog waking and idle workers stopping.
        assert (lost_at - renewed_at).total_seconds() <= ELECTION.renew_deadline + 1.0, (
            lines[0], renewed_at.isoformat())
        # It stopped acting before the standby began: no moment with two leaders at work.
        assert lost_at < taken.acquire_time, (lines[0], taken.acquire_time.isoformat())
        stack.ours.all_running()  # the cut-off replica campaigns again once it can reach the apiserver

