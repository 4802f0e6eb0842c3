"""The fault suite's checker, and the one moment it holds open.

After each fault the suite asserts, on what the containers printed and what the cluster shows:
- the identity rule (`Scenario.check_identities`): per TrainJob every execution's epoch is above
  every earlier one (and its token new), unless the TrainJob was flagged foreign before the
  repeating execution ran;
- no admission stays pending more than ADMISSION_BOUND_SECONDS after the fault ends (`admitted`);
- no Workload approved without its raise (`admitted`): our check Ready says "A raised to N", N is
  the A in our runtime patch and the floor, the TrainJob's raised-for marker names this Workload,
  and every pod of the execution carries exactly that A (`carry`);
- nothing approved twice: our controllers' logs hold one "check ready" per admission (`ready_lines`).

The moment "our raise has landed, our approval has not" lasts a few milliseconds in a healthy
controller: too short to aim a fault at. `approval_held` holds it open with a real part of the
apiserver, a ValidatingAdmissionPolicy that refuses any update setting this check Ready. Our
controller raises (the raise is a TrainJob update, not refused), its Ready is refused, and it
retries with the raise already marked. A fault injected then hits exactly that state; the policy is
removed once the fault ends, and what the controller does next is the outcome measured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, names, raising

# How long an admission may stay pending once a fault has ended. Covers a takeover by the standby
# (the lease's 15 s duration plus its 2 s retry period) and the relists after an apiserver or etcd
# restart (the informers' backoff is at most 10 s).
ADMISSION_BOUND_SECONDS = 30.0
# How long our controller may take to lead again after an apiserver restart: a replica that lost
# the Lease while the apiserver was away campaigns again in its process (no container restart,
# so no kubelet back-off): the lease's 15 s, the relists (their backoff at most 10 s), margin.
LEADER_BACK_SECONDS = 60.0
# How long a line our controller printed may take to reach the suite through the kubelet.
LOG_DELAY_SECONDS = 5.0

_VAP = ("admissionregistration.k8s.io", "v1")


def started_again(stack: stack_mod.Stack, component: str) -> float:
    """Start a stopped part of the control plane again; the moment the fault ended, from which the
    bounds count: the part answers, and pods reach the apiserver through the kubernetes Service
    again. After an apiserver restart that takes up to about 30 s more (kube-proxy's own watch
    backs off while the apiserver is away and programs the Service's endpoint only once it lists
    again): the platform's recovery, not our controller's."""
    stack.plane.start_component(component)
    stack.plane.wait_service()
    return time.monotonic()


def _policy(check: str) -> tuple[dict[str, Any], dict[str, Any]]:
    ready = f'exists(c, c.name == "{check}" && c.state == "Ready")'
    expression = (f"!(has(object.status) && has(object.status.admissionChecks) && "
                  f"object.status.admissionChecks.{ready}) || "
                  f"(has(oldObject.status) && has(oldObject.status.admissionChecks) && "
                  f"oldObject.status.admissionChecks.{ready})")
    name = f"hold-{check}"
    policy = {
        "apiVersion": "/".join(_VAP), "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["kueue.x-k8s.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
                "resources": ["workloads/status"]}]},
            "validations": [{"expression": expression, "message": f"approval of {check} held by the fault suite"}],
        },
    }
    binding = {
        "apiVersion": "/".join(_VAP), "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


def _probe(custom: kubernetes.client.CustomObjectsApi, namespace: str, check: str) -> bool:
    """True once the policy refuses our check going Ready on a Workload of NAMESPACE's own (a
    server-side dry run: nothing is stored)."""
    name = f"hold-probe-{check}"
    try:
        workload = custom.get_namespaced_custom_object(*flow.KUEUE_API, namespace, "workloads", name)
    except kubernetes.client.ApiException as e:
        if e.status != 404:
            raise
        workload = custom.create_namespaced_custom_object(*flow.KUEUE_API, namespace, "workloads", {
            "apiVersion": "/".join(flow.KUEUE_API), "kind": "Workload", "metadata": {"name": name},
            "spec": {"queueName": "no-such-queue", "podSets": [{"name": "main", "count": 1, "template": {
                "spec": {"containers": [{"name": "c", "image": "none"}], "restartPolicy": "Never"}}}]}})
    workload.setdefault("status", {})["admissionChecks"] = [{
        "name": check, "state": "Ready", "message": "probe", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    try:
        custom.replace_namespaced_custom_object_status(*flow.KUEUE_API, namespace, "workloads", name, workload,
                                                       dry_run="All")
    except kubernetes.client.ApiException as e:
        if "held by the fault suite" in str(e.body):
            return True
        if e.status == 409:  # Kueue wrote the probe meanwhile: read it again
            return False
        raise
    return False


@contextlib.contextmanager
def approval_held(api: kubernetes.client.ApiClient, check: str, *, namespace: str) -> Iterator[None]:
    """While inside, no update may set CHECK Ready (see the module docstring). Entered once the
    apiserver enforces it, as a dry run on a Workload of NAMESPACE's own shows."""
    reg = kubernetes.client.AdmissionregistrationV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    policy, binding = _policy(check)
    reg.create_validating_admission_policy(policy)
    reg.create_validating_admission_policy_binding(binding)
    try:
        deadline = time.monotonic() + 30
        while not _probe(custom, namespace, check):
            assert time.monotonic() < deadline, "the policy holding the approval was not enforced in 30 s"
            time.sleep(0.2)
        yield
    finally:
        reg.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        reg.delete_validating_admission_policy(policy["metadata"]["name"])


def workload(sc: Scenario) -> dict[str, Any] | None:
    """SC's Workload, or None while Kueue has not made it yet."""
    listed = sc.custom.list_namespaced_custom_object(*flow.KUEUE_API, sc.namespace, "workloads")
    uid = sc.trainjob()["metadata"]["uid"]
    owned = [w for w in listed["items"] if any(r.get("uid") == uid for r in w["metadata"].get("ownerReferences") or [])]
    assert len(owned) <= 1, [w["metadata"]["name"] for w in owned]
    return dict(owned[0]) if owned else None


def check_entry(workload: dict[str, Any], check: str) -> dict[str, Any]:
    """Our check's entry in the Workload's status ({} before Kueue lists it)."""
    return next((e for e in (workload.get("status") or {}).get("admissionChecks") or [] if e["name"] == check), {})


def condition(workload: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (workload.get("status") or {}).get("conditions") or [])


def marker_uid(trainjob: dict[str, Any]) -> str | None:
    mark = (trainjob["metadata"].get("annotations") or {}).get(adapter.RAISED_FOR_ANNOTATION)
    return mark.split("/")[0] if mark else None


def reserved_not_raised(sc: Scenario, check: str, *, admission: int) -> dict[str, Any]:
    """Wait for the Workload to hold a reservation with CHECK Pending while A is still ADMISSION."""
    def seen() -> dict[str, Any] | None:
        wl = workload(sc)
        if wl and condition(wl, "QuotaReserved") and check_entry(wl, check).get("state") == "Pending":
            assert raising.counts(sc.trainjob()).current == admission, "raised while no controller ran"
            return wl
        return None
    return dict(sc.wait("a reservation waiting on our check", seen))


def raised_not_approved(sc: Scenario, check: str, *, above: int) -> dict[str, Any]:
    """Wait for the moment our raise for the Workload's reservation has landed (A above ABOVE, the
    raised-for marker naming this Workload) while CHECK is still Pending; returns the Workload.
    Fails if the check is Ready: the moment was meant to be held open (`approval_held`)."""
    def seen() -> dict[str, Any] | None:
        wl = workload(sc)
        if wl is None:
            return None
        assert check_entry(wl, check).get("state") != "Ready", f"approved although held: {check_entry(wl, check)}"
        tj = sc.trainjob()
        if (condition(wl, "QuotaReserved") and marker_uid(tj) == wl["metadata"]["uid"]
                and raising.counts(tj).current > above):
            return wl
        return None
    return dict(sc.wait("our raise to land while the approval is held", seen))


def admitted(sc: Scenario, check: str, *, since: float, bound: float = ADMISSION_BOUND_SECONDS) -> int:
    """Wait (at most BOUND from SINCE, the fault's end) for the Workload to be admitted with CHECK
    Ready; assert the approval carries its raise; return that A."""
    def seen() -> dict[str, Any] | None:
        wl = workload(sc)
        if wl is None:
            return None
        entry = check_entry(wl, check)
        return wl if entry.get("state") == "Ready" and condition(wl, "Admitted") else None
    wl = sc.wait(f"admission within {bound}s of the fault's end", seen, timeout=max(0.0, since + bound - time.monotonic()))
    waited = time.monotonic() - since
    assert waited <= bound, f"admitted {waited:.1f}s after the fault ended, bound {bound}s"
    message = check_entry(wl, check)["message"]
    assert message.startswith("A raised to "), message
    n = int(message.removeprefix("A raised to "))
    tj = sc.trainjob()
    assert raising.counts(tj) == raising.Counts(patch=n, floor=n), (message, raising.counts(tj))
    assert marker_uid(tj) == wl["metadata"]["uid"], "approved without a raise marked for this Workload"
    return n


def carry(pods: list[dict[str, Any]], admission: int) -> None:
    """Every pod of the execution carries the A its approval names."""
    seen = {p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for p in pods}
    assert seen == {str(admission)}, (seen, admission)


def ready_lines(stack: stack_mod.Stack, sc: Scenario, *, expect: int = 1) -> list[dict[str, Any]]:
    """Every "check ready" our controller's pods (any replica, any restart) logged for SC's Workload,
    each with the pod that logged it as "process". The logs reach us through the kubelet a moment
    after the write: waits up to LOG_DELAY_SECONDS for EXPECT of them, then as long again for any
    more (a second approval must not be missed)."""
    workload = f"{sc.namespace}/{sc.workload()['metadata']['name']}"

    def found() -> list[dict[str, Any]]:
        return [{**record, "process": pod} for pod, record in stack.ours.logbook.lines()
                if record.get("message") == "check ready" and record.get("workload") == workload]

    deadline = time.monotonic() + LOG_DELAY_SECONDS
    while len(found()) < expect and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(LOG_DELAY_SECONDS / 5)
    return found()
