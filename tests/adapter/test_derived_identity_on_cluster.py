"""A TrainJob made as the Kubeflow SDK makes it (no marks of ours), in a namespace that opts in, on
the Kueue plane: the admission policy wraps it at creation, our controller (a real process) raises A
for it at admission and gives it its identity in the same update, and Kueue admits it; its pods carry
A and the two prefixes the prologue reads. Deleted and made again under its name, it runs with
epochs above every epoch of the earlier one. One the policy could not wrap is Rejected by the check
with the policy's reason, and Kueue
deactivates it. Every condition and state read back is Kueue's, Trainer's or JobSet's."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from devcluster import scenario as flow, stack as stack_mod
from tests.adapter import policy
from tests.adapter.conftest import checked_queue
from toolkit import adapter, derive, history, identity, names, paths, raising

pytestmark = pytest.mark.cluster

WAIT_SECONDS = 90.0


def sdk_trainjob(name: str, *, runtime: str, command: list[str]) -> dict[str, Any]:
    """What `TrainerClient().train(...)` posts, with the queue label a Kueue user adds (Labels)."""
    return {"metadata": {"name": name, "labels": {names.KUEUE_QUEUE_LABEL: "lq"}},
            "spec": {"runtimeRef": {"name": runtime, "kind": "TrainingRuntime"},
                     "trainer": {"command": command, "numNodes": 1}}}


def check_entry(workload: dict[str, Any], check: str) -> dict[str, Any]:
    return next((e for e in (workload.get("status") or {}).get("admissionChecks") or [] if e["name"] == check), {})


def running_pods(sc: flow.Scenario) -> list[dict[str, Any]]:
    return [p for p in sc.pods() if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def epoch_of(pod: dict[str, Any]) -> int:
    """The epoch the prologue computes from what the pod carries (A, J and the epoch prefix)."""
    a = int(pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION])
    j = int(pod["metadata"]["labels"][names.RESTART_LABEL])
    return identity.epoch_from_prefix(prefix=pod["metadata"]["annotations"][names.EPOCH_PREFIX_ANNOTATION], r=a + j)


def test_an_sdk_trainjob_gets_an_identity_and_made_again_runs_above_it(kueue_stack: stack_mod.Stack) -> None:
    namespace = f"sdk-{uuid.uuid4().hex[:8]}"
    check = f"ac-{namespace}"
    with kueue_stack.plane.api_client() as api, policy.installed(api), \
            checked_queue(kueue_stack, api, namespace, labels=policy.OPTED_IN) as (sc, _):
        sc.name = "mnist"
        client = sc.client
        epochs = []
        for generation in (1, 2):
            made = client.create(paths.TRAINJOB, sdk_trainjob(sc.name, runtime="kueue",
                                                               command=["bash", "-c", "python train.py"]),
                                 namespace=namespace)
            assert derive.is_derived(made) and derive.needs_identity(made)
            # Admitted through our check: its pods run with the A the check raised (1, or 2 when a
            # pass found the Workload moved on and raised again: A only grows).
            pods = sc.wait(f"the TrainJob made for the {generation}. time admitted through our check",
                           lambda: (running := running_pods(sc)) and all(
                               p["metadata"]["annotations"].get(names.ADMISSION_ANNOTATION) == str(
                                   raising.counts(sc.trainjob()).floor) for p in running) and running,
                           timeout=WAIT_SECONDS)
            tj = sc.trainjob()
            a = raising.counts(tj).floor
            assert a >= 1 and raising.counts(tj) == raising.Counts(patch=a, floor=a)
            assert tj["metadata"]["annotations"][names.GENERATION_ANNOTATION] == str(generation)
            assert tj["metadata"]["annotations"][names.JOB_ID_ANNOTATION] == f"{namespace}.mnist.{generation}"
            assert check_entry(sc.workload(), check).get("message") == f"A raised to {a}"
            for pod in pods:
                annotations = pod["metadata"]["annotations"]
                assert annotations[names.TOKEN_PREFIX_ANNOTATION] == f"{namespace}.mnist.{generation}.0.0"
                epochs.append(epoch_of(pod))
                # What the controller records for it is what the pod saw.
                assert history.identity_of(tj, admission=a, restart=0)[0] == str(epoch_of(pod))
            counter = client.get(paths.CONFIG_MAP, name=names.GENERATIONS_CONFIGMAP, namespace=namespace)
            assert counter["data"] == {namespace: str(generation)}
            # A notebook run again: the TrainJob deleted and made again under its name.
            client.delete(paths.TRAINJOB, name=sc.name, namespace=namespace,
                          body={"propagationPolicy": "Foreground"})
            sc.wait("the TrainJob and its pods gone", lambda: not sc.pods() and not any(
                t["metadata"]["name"] == sc.name for t in client.list(paths.TRAINJOB, namespace=namespace)[0]))
        assert epochs[-1] > epochs[0] and min(e for e in epochs[1:]) > max(epochs[:1])

        # A TrainJob the policy could not wrap: Rejected by the check, with the policy's reason.
        refused = client.create(paths.TRAINJOB, sdk_trainjob("tune", runtime="kueue", command=["tune", "run"]),
                                namespace=namespace)
        sc.name = "tune"
        # Kueue deactivates a Workload whose check is Rejected, quoting the check's message.
        evicted = sc.wait("Kueue to deactivate it for our Rejected check", lambda: next((
            c for w in adapter.workloads_of(client, trainjob=refused)
            for c in (w.get("status") or {}).get("conditions") or []
            if c["type"] == "Evicted" and c["status"] == "True"
            and c["reason"] == "DeactivatedDueToAdmissionCheck"), None), timeout=WAIT_SECONDS)
        reason = derive.refusal(refused)
        assert reason is not None and reason.startswith(
            "not wrapped at creation: spec.trainer.command: [tune, run]")
        assert f'"{check}" ({reason})' in evicted["message"]
        assert not sc.pods()
