"""The Kueue admission-check protocol, with the test acting as Kueue on real
Workload and AdmissionCheck objects and the controller as a real process
under its shipped RBAC."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from controller import admission, views, writes
from tests.adapter import kit
from tests.faults import checks
from tests.controller.conftest import wait_until
from toolkit import adapter, clusterconfig, kube, names, paths, raising

pytestmark = pytest.mark.cluster


def _check(admin: kube.Client) -> str:
    name = f"dispatch-{uuid.uuid4().hex[:8]}"
    kit.create_admission_check(admin, name)
    return name


def _state(admin, namespace, wl, check):
    return kit.check_entry(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)


def _ready(admin, namespace, wl, check, **wait):
    """Our check's entry once it is Ready."""
    return wait_until(lambda: (e := _state(admin, namespace, wl, check)).get("state") == "Ready" and e,
                      what="Ready", **wait)


def _refusals(ctl, namespace, wl):
    """The controller's log lines saying it left this Workload's check Pending."""
    where = f"{namespace}/{wl['metadata']['name']}"
    return [line for line in list(ctl.lines)
            if line.get("workload") == where and str(line.get("message", "")).startswith("not raised, check left Pending")]


def test_reserved_and_pending_is_raised_then_ready_and_every_readmission_raises_again(admin, namespace, start_controller):
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    wl = kit.create_workload(admin, tj)
    ctl = start_controller()

    # Active is kept true on our AdmissionCheck.
    wait_until(
        lambda: admission.condition_true(admin.get(paths.ADMISSION_CHECK, name=check), "Active"), what="Active"
    )

    for expected in (1, 2, 3):
        kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
        entry = _ready(admin, namespace, wl, check)
        assert entry["message"] == f"A raised to {expected}"
        tj_now = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
        assert raising.counts(tj_now) == raising.Counts(patch=expected, floor=expected)
        assert tj_now["spec"]["suspend"] is True  # Kueue, not us, unsuspends
        # Kueue evicts (preemption): the check goes back to Pending, no raise yet.
        kit.kueue_evict(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
        assert _state(admin, namespace, wl, check)["state"] == "Pending"

    status, body = ctl.get("/metrics")
    assert status == 200 and "dispatch_raises_total 3.0" in body


def test_an_evicted_workload_that_still_holds_quota_is_not_approved(admin, namespace, start_controller):
    """Kueue's eviction window: Evicted and the check Pending while the quota
    is still reserved. No raise and no Ready there; the next reservation
    raises exactly once."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    wl = kit.create_workload(admin, tj)
    ctl = start_controller()
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    _ready(admin, namespace, wl, check)
    kit.kueue_evict(admin, namespace=namespace, name=wl["metadata"]["name"], check=check, keep_quota=True)
    where = f"{namespace}/{wl['metadata']['name']}"
    wait_until(lambda: [x for x in list(ctl.lines) if x.get("workload") == where
                        and x.get("message") == "evicted, check left Pending until quota is reserved again"],
               what="the controller's eviction line")
    assert _state(admin, namespace, wl, check)["state"] == "Pending"
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).current == 1
    kit.kueue_evict(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    entry = _ready(admin, namespace, wl, check)
    assert entry["message"] == "A raised to 2"


def test_never_ready_without_the_raise(admin, namespace, start_controller):
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace, suspend=False)  # cannot be raised
    wl = kit.create_workload(admin, tj)
    ctl = start_controller()
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    # the controller saw the reserved Workload, could not raise, and said so
    refusal = wait_until(lambda: _refusals(ctl, namespace, wl), what="the controller's refusal")[0]
    assert refusal["level"] == "warning"
    assert refusal["message"] == (
        f"not raised, check left Pending: TrainJob {tj['metadata']['name']}: "
        "spec.suspend is false; A is only raised while the TrainJob is suspended"
    )
    assert _state(admin, namespace, wl, check)["state"] == "Pending"
    assert raising.counts(admin.get(paths.TRAINJOB, name=tj["metadata"]["name"], namespace=namespace)).current == 0
    kit.set_suspend(admin, namespace, tj["metadata"]["name"], True)
    entry = _ready(admin, namespace, wl, check, timeout=10)
    assert entry["message"] == "A raised to 1"


def test_a_crash_after_the_raise_does_not_raise_twice(admin, namespace, start_controller):
    """The first pass raised (marker written with the raise) and died before
    Ready; the next pass finds its marker and only sets Ready."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    wl = kit.create_workload(admin, tj)
    reserved = kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    writes.raise_for(admin, workload=reserved, trainjob=admin.get(paths.TRAINJOB, name=name, namespace=namespace),
                     fresh=True)
    start_controller()
    entry = _ready(admin, namespace, wl, check)
    assert entry["message"] == "A raised to 1"
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).current == 1


def test_a_crash_after_the_raise_then_a_changed_workload_raises_again(admin, namespace, start_controller):
    """The first pass raised for Workload version X and died before Ready;
    then Kueue evicted and reserved again (a new version). The marker no
    longer matches, so the next pass raises again: R grows by two, never
    repeats, and Ready names the new A."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    wl = kit.create_workload(admin, tj)
    first = kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    writes.raise_for(admin, workload=first, trainjob=admin.get(paths.TRAINJOB, name=name, namespace=namespace),
                     fresh=True)
    kit.kueue_evict(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    second = kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    assert admission.marker(second) != admission.marker(first)
    start_controller()
    entry = _ready(admin, namespace, wl, check)
    assert entry["message"] == "A raised to 2"
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert raising.counts(after) == raising.Counts(patch=2, floor=2)
    assert admission.raised_here(after, second)


def test_two_controllers_without_leader_election_still_raise_before_every_ready(admin, namespace, start_controller):
    """Leader election is the normal guard; this shows the protocol is safe
    without it: two processes race on 10 TrainJobs through 3 admissions."""
    check = _check(admin)
    jobs = [kit.create_trainjob(admin, namespace) for _ in range(10)]
    workloads = [kit.create_workload(admin, tj) for tj in jobs]
    start_controller(leader_elect=False)
    start_controller(leader_elect=False)
    last = {tj["metadata"]["name"]: 0 for tj in jobs}
    for _ in range(3):
        for wl in workloads:
            kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
        for tj, wl in zip(jobs, workloads):
            entry = _ready(admin, namespace, wl, check)
            a = raising.counts(admin.get(paths.TRAINJOB, name=tj["metadata"]["name"], namespace=namespace)).current
            approved = int(entry["message"].rsplit(" ", 1)[1])
            assert approved > last[tj["metadata"]["name"]] and a >= approved
            last[tj["metadata"]["name"]] = a
        for wl in workloads:
            kit.kueue_evict(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)


def test_leader_election_lets_one_replica_act_and_the_standby_takes_over(admin, namespace, start_controller):
    check = _check(admin)
    first = start_controller()
    second = start_controller(wait=False)
    # The standby is live and ready (a rollout and a drain need it so; ready a moment after its
    # health port answers, once it campaigns), and does not lead.
    wait_until(lambda: second.get("/readyz")[0] == 200, what="the standby ready")
    assert [second.get(p)[0] for p in ("/healthz", "/readyz", "/leaderz")] == [200, 200, 503]
    assert [first.get(p)[0] for p in ("/readyz", "/leaderz")] == [200, 200]
    assert first.stop() == 0  # SIGTERM: finish the step, exit 0
    second.wait_ready(timeout=20)
    tj = kit.create_trainjob(admin, namespace)
    wl = kit.create_workload(admin, tj)
    kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    entry = _ready(admin, namespace, wl, check)
    assert entry["message"] == "A raised to 1"


def _kueue_writes_the_workload_after_the_raise(client: kube.Client, admin: kube.Client, *, namespace: str,
                                               workload: str, also=None) -> None:
    """Slip a write of the Workload (a label, as any writer's update changes its resourceVersion)
    in right after the raise lands, before our Ready: the moment Kueue often takes. `also` runs
    there too."""
    patch = client.merge_patch

    def raise_then_kueue(res, body, **kw):
        written = patch(res, body, **kw)
        if res == paths.TRAINJOB:
            admin.merge_patch(paths.WORKLOAD, {"metadata": {"labels": {"touched": "yes"}}},
                              name=workload, namespace=namespace)
            if also is not None:
                also()
        return written

    client.merge_patch = raise_then_kueue  # type: ignore[method-assign]


def test_a_workload_write_between_the_raise_and_the_ready_costs_no_second_raise(admin, namespace,
                                                                                  controller_kubeconfig):
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        _kueue_writes_the_workload_after_the_raise(client, admin, namespace=namespace, workload=wl)
        outcome = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check})
    assert (outcome.action, outcome.admission) == ("ready", 1)
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 1"
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)) == raising.Counts(patch=1, floor=1)


def test_a_trainjob_started_and_stopped_between_the_raise_and_the_ready_is_raised_again(admin, namespace,
                                                                                         controller_kubeconfig):
    """The guard that can fail: unsuspended (an execution may have started with A = 1) and
    suspended again while the Workload was written. The A just raised may have been used: no
    Ready for it; the next pass raises to 2 and approves that."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)

    def started_and_stopped() -> None:
        kit.set_suspend(admin, namespace, name, False)
        kit.set_suspend(admin, namespace, name, True)

    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        _kueue_writes_the_workload_after_the_raise(client, admin, namespace=namespace, workload=wl,
                                                   also=started_and_stopped)
        first = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check})
    assert (first.action, first.admission) == ("stale", 1)
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["state"] == "Pending"
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        second = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check})
    assert (second.action, second.admission) == ("ready", 2)
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 2"


def test_a_ready_refused_after_the_raise_then_a_start_by_hand_is_never_approved_with_that_a(
        admin, api_client, namespace, start_controller):
    """Our raise lands and our Ready is refused (a real admission policy of the apiserver holds it,
    as any webhook or error could); meanwhile the TrainJob is started by hand and stopped again
    (an execution may have run with A = 1) and the Workload is not touched. When Ready is allowed
    again, it must not carry the A that execution may have used: the next pass raises to 2 and
    approves that."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)
    with checks.approval_held(api_client, check, namespace=namespace):
        start_controller()
        kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
        wait_until(lambda: raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).current == 1,
                   what="the raise")
        kit.set_suspend(admin, namespace, name, False)  # started by hand: its pods would carry A = 1
        kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")
        kit.set_suspend(admin, namespace, name, True)
        assert _state(admin, namespace, wl, check)["state"] == "Pending"
    entry = _ready(admin, namespace, wl, check, timeout=20)
    assert entry["message"] == "A raised to 2"
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)) == raising.Counts(patch=2,
                                                                                                        floor=2)


def _counting_writes(client: kube.Client) -> list[tuple[str, str]]:
    """(kind, the resourceVersion it is preconditioned on) of every merge patch CLIENT sends, in order."""
    sent: list[tuple[str, str]] = []
    patch = client.merge_patch

    def counted(res, body, **kw):
        sent.append((res.kind, (body.get("metadata") or {}).get("resourceVersion")))
        return patch(res, body, **kw)

    client.merge_patch = counted  # type: ignore[method-assign]
    return sent


def _cached(obj: dict, view) -> dict:
    """OBJ as the controller's cache holds it."""
    return view(obj)


def test_a_workload_written_between_the_raise_and_the_ready_costs_one_409_and_no_second_raise(
        admin, namespace, controller_kubeconfig):
    """Kueue writes the Workload right after our raise: the Ready preconditioned on the version the
    raise was for is refused (409), and the pass, having read the Workload and the TrainJob again
    (the TrainJob as the raise left it), writes Ready on the version Kueue left, with the same A."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    seen = kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    cached = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        _kueue_writes_the_workload_after_the_raise(client, admin, namespace=namespace, workload=wl)
        sent = _counting_writes(client)
        outcome = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check},
                                               seen=_cached(seen, views.workload_view),
                                               trainjob=_cached(cached, views.trainjob_view))
    assert (outcome.action, outcome.admission) == ("ready", 1)
    statuses = [version for kind, version in sent if kind == "Workload"]
    assert len(statuses) == 2 and statuses[0] == seen["metadata"]["resourceVersion"] != statuses[1]
    assert [kind for kind, _ in sent].count("TrainJob") == 1
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 1"
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)) == raising.Counts(patch=1, floor=1)


def test_an_admission_from_the_caches_costs_the_runtime_read_the_raise_and_the_ready(
        admin, namespace, controller_kubeconfig):
    """The pass from cached copies of the Workload and the TrainJob that are current: three
    requests in all, the runtime's read, the raise and the Ready, each write preconditioned on the
    copy it was computed from."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    seen = kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    cached = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        sent = _counting_writes(client)
        before = client.requests
        outcome = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check},
                                               seen=_cached(seen, views.workload_view),
                                               trainjob=_cached(cached, views.trainjob_view))
        requests = client.requests - before
    assert (outcome.action, outcome.admission, outcome.conflicts) == ("ready", 1, 0)
    assert requests == 3
    assert sent == [("TrainJob", cached["metadata"]["resourceVersion"]), ("Workload", seen["metadata"]["resourceVersion"])]
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 1"


def test_a_stale_cached_trainjob_is_refused_by_its_precondition_and_raised_from_a_fresh_read(
        admin, namespace, controller_kubeconfig):
    """The cached TrainJob is older than a raise another writer made (A = 1): the merge patch
    computed from it is refused (409), the TrainJob read once fresh and raised from that read to
    2. Without the precondition the copy's A + 1 = 1 would be written again (A repeated)."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    stale = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    adapter.raise_admission(admin, namespace=namespace, name=name)
    seen = kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        outcome = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check},
                                               seen=_cached(seen, views.workload_view),
                                               trainjob=_cached(stale, views.trainjob_view))
    assert (outcome.action, outcome.admission, outcome.conflicts) == ("ready", 2, 1)
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)) == raising.Counts(patch=2, floor=2)
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 2"


def test_a_writer_between_the_cached_read_and_the_raise_keeps_its_runtime_patch(
        admin, namespace, controller_kubeconfig):
    """Another manager adds its own runtime-patch entry between the copy the cache holds and our
    raise. A merge patch sends spec.runtimePatches whole: computed from the copy it would drop that
    entry, so it is refused (409) and computed again from a fresh read, which keeps both."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    seen = kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    cached = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    theirs = {"manager": "example.com/other", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": names.TRAINER_REPLICATED_JOB, "template": {"spec": {"template": {"metadata": {
            "annotations": {"example.com/team": "a"}}}}}}]}}}}

    def other_writer(tj: dict) -> tuple[dict, None]:
        tj["spec"]["runtimePatches"] = [*tj["spec"]["runtimePatches"], theirs]
        return tj, None

    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        patch = client.merge_patch

        def racing(res, body, **kw):
            if res == paths.TRAINJOB and not racing.done:  # type: ignore[attr-defined]
                racing.done = True  # type: ignore[attr-defined]
                admin.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=other_writer)
            return patch(res, body, **kw)

        racing.done = False  # type: ignore[attr-defined]
        client.merge_patch = racing  # type: ignore[method-assign]
        outcome = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check},
                                               seen=_cached(seen, views.workload_view),
                                               trainjob=_cached(cached, views.trainjob_view))
    assert (outcome.action, outcome.admission, outcome.conflicts) == ("ready", 1, 1)
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert [p["manager"] for p in after["spec"]["runtimePatches"]] == [
        p["manager"] for p in cached["spec"]["runtimePatches"]] + ["example.com/other"]
    assert raising.counts(after) == raising.Counts(patch=1, floor=1)


def test_a_crash_between_the_raise_and_the_ready_then_a_start_by_hand_is_raised_again_from_the_caches(
        admin, namespace, controller_kubeconfig):
    """A pass raised for this Workload version and died before its Ready; the TrainJob was then
    started by hand and stopped again. The cache still holds the TrainJob as the raise left it,
    which says "already raised": not trusted, the pass reads it fresh, finds its generation moved
    and raises to 2. Trusting the copy would approve A = 1, which the start may have used."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    seen = kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    writes.raise_for(admin, workload=seen, trainjob=admin.get(paths.TRAINJOB, name=name, namespace=namespace),
                     fresh=True)
    raised = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert admission.raised_here(raised, seen)
    kit.set_suspend(admin, namespace, name, False)
    kit.set_suspend(admin, namespace, name, True)
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        outcome = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check},
                                               seen=_cached(seen, views.workload_view),
                                               trainjob=_cached(raised, views.trainjob_view))
    assert (outcome.action, outcome.admission) == ("ready", 2)
    assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 2"


def test_a_stale_copy_of_the_workload_never_approves_an_a_already_used(admin, namespace, controller_kubeconfig):
    """The informer's copy can be any earlier version. Here: the copy of the first reservation,
    handed to a pass after that admission was approved with A = 1 and ran. While it runs the pass
    raises nothing and approves nothing (the TrainJob is not suspended); once it was evicted and
    Kueue reserved again, the pass from that old copy raises to 2 and approves 2, never 1. And a copy
    showing a reservation the Workload no longer has (evicted, quota released) approves nothing."""
    check = _check(admin)
    tj = kit.create_trainjob(admin, namespace)
    name, wl = tj["metadata"]["name"], kit.create_workload(admin, tj)["metadata"]["name"]
    old = kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
    with contextlib.closing(clusterconfig.load(kubeconfig=controller_kubeconfig)) as client:
        first = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check}, seen=old)
        assert (first.action, first.admission) == ("ready", 1)
        kit.set_suspend(admin, namespace, name, False)  # Kueue admits: an execution with A = 1
        running = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check}, seen=old)
        assert running.action == "refused"
        assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["message"] == "A raised to 1"
        kit.kueue_evict(admin, namespace=namespace, name=wl, check=check)
        kit.set_suspend(admin, namespace, name, True)
        evicted = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check}, seen=old)
        assert evicted.action == "stale"  # raised (harmless: A only grows), nothing approved
        assert kit.check_entry(admin, namespace=namespace, name=wl, check=check)["state"] == "Pending"
        kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
        again = admission.reconcile_workload(client, namespace=namespace, name=wl, ours={check}, seen=old)
    assert again.action == "ready" and again.admission is not None and again.admission > 1
    entry = kit.check_entry(admin, namespace=namespace, name=wl, check=check)
    assert entry["message"] == f"A raised to {again.admission}"
    assert raising.counts(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).current == again.admission
