"""Kueue mode's hold is Kueue's own: `adapter.hold` sets the TrainJob's Workload spec.active
false, and the real Kueue manager evicts it (Deactivated), suspends the TrainJob and resets our
check to Pending; `adapter.release` sets it true, and the re-admission goes through our check,
whose controller (a real process) raises A. Nothing here writes what Kueue, Trainer or JobSet
write: every condition and state read back is theirs.

The plane is the Kueue plane of tests/adapter (conftest.py: Trainer's, JobSet's and Kueue's
webhooks change how every TrainJob and pod is admitted, which the session plane's suites must not
see), with kwok's simulated node for the pods: the claim is about the Workload, the TrainJob and A, not about a
container. The refusals (no Workload yet; the held execution still running) are tested on the
session plane, where no Kueue runs, so that no Workload appears unless the test makes it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from click.testing import CliRunner

from devcluster import objects, scenario as flow, stack as stack_mod
from tests import waiting
from tests.adapter import kit
from tests.adapter.conftest import checked_queue
from toolkit import adapter, cli, kube, names, paths, raising

pytestmark = pytest.mark.cluster

WAIT_SECONDS = 90.0


def _conditions(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (workload.get("status") or {}).get("conditions") or []}


def _entry(workload: dict[str, Any], check: str) -> dict[str, Any]:
    return next((e for e in (workload.get("status") or {}).get("admissionChecks") or [] if e["name"] == check), {})


def _workload(sc: flow.Scenario) -> dict[str, Any] | None:
    """The one Workload Kueue made for the TrainJob, once it has made it."""
    found = adapter.workloads_of(sc.client, trainjob=sc.trainjob())
    assert len(found) <= 1, [w["metadata"]["name"] for w in found]
    return found[0] if found else None


def _admitted_with(sc: flow.Scenario, check: str, a: int) -> dict[str, Any] | None:
    """The Workload once Kueue has admitted it through our check with A = `a` and unsuspended the
    TrainJob, and its pods run with that A; else None."""
    wl = _workload(sc)
    if wl is None or _conditions(wl).get("Admitted", {}).get("status") != "True":
        return None
    if (_entry(wl, check).get("state"), _entry(wl, check).get("message")) != ("Ready", f"A raised to {a}"):
        return None
    if sc.trainjob()["spec"].get("suspend"):
        return None
    running = [p for p in sc.pods() if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    if not running or {p["metadata"]["annotations"].get(names.ADMISSION_ANNOTATION) for p in running} != {str(a)}:
        return None
    return wl


def test_hold_deactivates_the_workload_and_release_readmits_it_through_the_check_with_a_raised(
        kueue_stack: stack_mod.Stack) -> None:
    namespace = f"hold-{uuid.uuid4().hex[:8]}"
    check = f"ac-{namespace}"
    with kueue_stack.plane.api_client() as api, checked_queue(kueue_stack, api, namespace) as (sc, _):
        sc.start("kueue", queue="lq", env={"STAY": "1"})
        client, name = sc.client, sc.name

        # Admitted through our check: A = 1 on the Workload's check, the TrainJob and the pods.
        wl = sc.wait("admission through our check with A 1", lambda: _admitted_with(sc, check, 1),
                     timeout=WAIT_SECONDS)
        workload = wl["metadata"]["name"]
        assert raising.counts(sc.trainjob()) == raising.Counts(patch=1, floor=1)

        # Hold: the Workload's spec.active false, nothing of the TrainJob written by us.
        before = sc.trainjob()["metadata"]["resourceVersion"]
        assert adapter.hold(client, namespace=namespace, name=name) is True
        assert sc.workload()["spec"]["active"] is False
        # Kueue evicts it as deactivated, resets our check and suspends the TrainJob.
        evicted = sc.wait("Kueue to evict the deactivated Workload and suspend the TrainJob", lambda: (
            (w := _workload(sc)) and _conditions(w).get("Evicted", {}).get("status") == "True"
            and _conditions(w).get("QuotaReserved", {}).get("status") == "False"
            and sc.trainjob()["spec"].get("suspend") is True and w))
        condition = _conditions(evicted)["Evicted"]
        assert condition["reason"] == "Deactivated", condition
        assert _entry(evicted, check).get("state") == "Pending", evicted["status"]
        held = sc.trainjob()
        assert held["metadata"]["resourceVersion"] != before  # Kueue's suspend, not ours
        assert raising.counts(held) == raising.Counts(patch=1, floor=1)  # A untouched by the hold
        sc.wait("the held execution's pods to stop",
                lambda: not adapter.live_pods(client, namespace=namespace, name=name))
        assert adapter.status(client, namespace=namespace, name=name).state == adapter.HELD
        assert adapter.hold(client, namespace=namespace, name=name) is False  # already held

        # Release: spec.active true and nothing else; the check raises A at the re-admission.
        released = adapter.release(client, namespace=namespace, name=name)
        assert (released.requeued, released.written, released.admission) == ((workload,), False, 1)
        assert sc.workload()["spec"]["active"] is True
        again = sc.wait("re-admission through our check with A 2", lambda: _admitted_with(sc, check, 2),
                        timeout=WAIT_SECONDS)
        assert again["metadata"]["uid"] == wl["metadata"]["uid"]  # the same Workload, admitted again
        tj = sc.trainjob()
        assert raising.counts(tj) == raising.Counts(patch=2, floor=2)
        assert tj["metadata"]["annotations"][names.FLOOR_ANNOTATION] == "2"
        assert adapter.status(client, namespace=namespace, name=name).state == "running"


# -- the refusals, on the session plane (no Kueue runs there) --------------------------------


@pytest.fixture
def admin(api_client: Any) -> kube.Client:
    return kube.from_api_client(api_client)


def _queued_trainjob(admin: kube.Client, namespace: str, *, suspend: bool = True) -> dict[str, Any]:
    """A TrainJob of ours in Kueue mode (its queue label), suspended unless told otherwise."""
    body = kit.trainjob_body(f"tj-{uuid.uuid4().hex[:6]}", suspend=suspend)
    body["metadata"]["labels"] = {names.KUEUE_QUEUE_LABEL: "lq"}
    kit.ensure_runtime(admin, namespace)
    return objects.once_the_runtime_is_seen(lambda: admin.create(paths.TRAINJOB, body, namespace=namespace))


def test_hold_release_and_open_refuse_in_one_line_while_kueue_has_no_workload_for_it(
        control_plane: Any, admin: kube.Client, namespace: str) -> None:
    tj = _queued_trainjob(admin, namespace, suspend=False)
    name = tj["metadata"]["name"]
    runner = CliRunner()
    env = {"KUBECONFIG": control_plane.kubeconfig}
    not_queued = (f"TrainJob {namespace}/{name}: not yet queued by Kueue: no Workload owned by it; "
                  "in Kueue mode hold and release act on its Workload, so try again once Kueue has made it")
    for command in ("hold", "release"):
        done = runner.invoke(cli.root, [command, "-n", namespace, name], env=env, prog_name="toolkit")
        assert (done.exit_code, done.stdout, done.stderr) == (1, "", f"toolkit {command}: {not_queued}\n")
    opened = runner.invoke(cli.root, ["open", "-n", namespace, name], env=env, prog_name="toolkit")
    assert (opened.exit_code, opened.stdout) == (1, "")
    assert opened.stderr == (f"toolkit open: TrainJob {namespace}/{name} is in Kueue mode (label "
                             f"{names.KUEUE_QUEUE_LABEL}): Kueue admits it through the admission check, which "
                             "raises A; open is plain mode's\n")
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert after["metadata"]["resourceVersion"] == tj["metadata"]["resourceVersion"]  # nothing written
    assert after["spec"]["suspend"] is False


def test_release_refuses_while_kueue_has_not_suspended_it_or_its_pods_still_run(
        admin: kube.Client, namespace: str) -> None:
    tj = _queued_trainjob(admin, namespace, suspend=False)
    name = tj["metadata"]["name"]
    wl = kit.create_workload(admin, tj)["metadata"]["name"]
    held = adapter.holding(admin, namespace=namespace, name=name)
    assert held == adapter.Held(True, (wl,))
    assert admin.get(paths.WORKLOAD, name=wl, namespace=namespace)["spec"]["active"] is False
    assert admin.get(paths.TRAINJOB, name=name, namespace=namespace)["spec"]["suspend"] is False  # Kueue's to do

    with pytest.raises(adapter.AdapterError) as refused:
        adapter.release(admin, namespace=namespace, name=name)
    assert str(refused.value) == (f"TrainJob {namespace}/{name}: Kueue has not yet suspended it after the hold "
                                  f"(Workload {wl} spec.active false); release once it is suspended")

    kit.set_suspend(admin, namespace, name, True)  # as Kueue does after the eviction; its pod not yet stopped
    pod = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1")["metadata"]["name"]
    with pytest.raises(adapter.AdapterError) as refused:
        adapter.release(admin, namespace=namespace, name=name)
    assert str(refused.value) == (f"TrainJob {namespace}/{name}: pod {pod} of the held execution still running; "
                                  "release once the hold has stopped them (they would run below the raised floor)")
    assert admin.get(paths.WORKLOAD, name=wl, namespace=namespace)["spec"]["active"] is False
    assert adapter.status(admin, namespace=namespace, name=name).state == adapter.HELD

    kit.delete_pod(admin, namespace=namespace, pod=pod)
    waiting.until("the pod to be gone", lambda: not adapter.live_pods(admin, namespace=namespace, name=name),
                  timeout=15)
    released = adapter.release(admin, namespace=namespace, name=name)
    assert (released.requeued, released.written) == ((wl,), False)
    tj_now = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert tj_now["spec"]["suspend"] is True and raising.counts(tj_now).floor is None  # no raise, no unsuspend
    assert admin.get(paths.WORKLOAD, name=wl, namespace=namespace)["spec"]["active"] is True
    with pytest.raises(adapter.AdapterError, match=r"is not held: no Workload of it has spec.active false$"):
        adapter.release(admin, namespace=namespace, name=name)
