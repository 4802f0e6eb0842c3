"""Resets are detected, not prevented (DESIGN.md §7), on the real controllers:
a JobSet deleted by hand is rebuilt by Trainer with restarts 0, and our
controller flags the TrainJob foreign with the exact cause; our runtime patch
rewritten lower does not lower the next raise (the floor holds); a pod that
runs below the floor is flagged too, by the controller's own pod check and
by the real sidecar verifier run for that pod (kwok runs no containers, so
the test runs the sidecar process itself, with the pod's own metadata as
its Downward API files and a token of the shipped sidecar Role), whose
Event the controller turns into the foreign flag. Plain mode, with our
controller running.

Every pod is executed, the rebuilt JobSet's and the below-floor ones too:
they repeat the first execution's identity, which is what the flag is for.
The identity rule holds before the flag; the below-floor repeat ran with the
flag already raised; the rebuilt JobSet's repeat races its own detection, so
the test shows it repeats and that the flag follows.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import kubernetes.client
import kubernetes.utils
import pytest
import yaml

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from tests.sidecar import test_sidecar_cluster as sidecar_kit
from toolkit import adapter, kube, names, raising

REPO = pathlib.Path(__file__).resolve().parents[2]

E2E_KUEUE = True  # read by the stack fixture: Kueue and our controller run too


@pytest.fixture
def scenario(stack: stack_mod.Stack, e2e_namespace: str) -> Iterator[Scenario]:
    with stack.plane.api_client() as api:
        yield Scenario(stack, api, e2e_namespace)


def _rewrite_patch(scenario: Scenario, admission: int) -> None:
    """What an outsider could do while the TrainJob is suspended: set our patch's A by hand."""
    def compute(trainjob: dict) -> tuple[dict, None]:
        patches = [p for p in trainjob["spec"].get("runtimePatches") or [] if p.get("manager") != names.PATCH_MANAGER]
        trainjob["spec"]["runtimePatches"] = [*patches, raising.patch_entry(admission)]
        return trainjob, None
    scenario.client.read_modify_write(kube.TRAINJOB, name=scenario.name, namespace=scenario.namespace,
                                      compute=compute)


def test_jobset_deleted_by_hand_is_flagged_foreign_and_the_floor_holds(scenario: Scenario) -> None:
    scenario.create_runtime(flow.runtime("resets"))
    scenario.start("resets")
    adapter.open_(scenario.client, namespace=scenario.namespace, name=scenario.name)
    for pod in scenario.new_running_pods():
        scenario.run(pod)
    old_uid = scenario.wait("the JobSet UID to be recorded", lambda: (
        scenario.trainjob()["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION))
    assert old_uid == (scenario.jobset() or {})["metadata"]["uid"]
    before = list(scenario.executions)
    assert not any(scenario.flag_at_run)
    scenario.check_identities()  # everything before the flag

    kubernetes.client.CustomObjectsApi(scenario.api).delete_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", scenario.namespace, "jobsets", scenario.name,
        body={"propagationPolicy": "Background"})
    new = scenario.wait("Trainer to build a new JobSet", lambda: (
        (js := scenario.jobset()) and js["metadata"]["uid"] != old_uid and js))
    assert int((new.get("status") or {}).get("restarts") or 0) == 0
    # The rebuilt JobSet's pods run as soon as they are Running, as a kubelet
    # would run them, whether or not the controller has flagged the TrainJob
    # yet: nothing prevents a reset, it is detected.
    rebuilt = [scenario.run(pod) for pod in scenario.new_running_pods()]
    cause = f"JobSet UID {new['metadata']['uid']} is not the recorded {old_uid}: J may have been reset"
    scenario.wait("the foreign flag", lambda: cause in (scenario.foreign() or "").split("\n"))
    status = adapter.status(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert status.foreign and cause in (status.foreign_cause or "")
    # The reset the flag exists for: with J back at 0 and A unchanged, the
    # rebuilt JobSet's execution repeats the first one's identity exactly.
    assert [(e.epoch, e.attempt) for e in rebuilt] == [(e.epoch, e.attempt) for e in before]

    # Our patch rewritten lower while held: the next raise still goes above the floor.
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the pods to go", lambda: not scenario.pods())
    _rewrite_patch(scenario, 0)
    raised = adapter.release(scenario.client, namespace=scenario.namespace, name=scenario.name)
    assert raised.admission == 2  # max(patch 0, floor 1) + 1
    for pod in scenario.new_running_pods():
        assert pod["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "2"
        scenario.run(pod)

    # A pod below the floor (patch lowered, unsuspended without a raise) is reported.
    adapter.hold(scenario.client, namespace=scenario.namespace, name=scenario.name)
    scenario.wait("the pods to go", lambda: not scenario.pods())
    _rewrite_patch(scenario, 1)

    def unsuspend(trainjob: dict) -> tuple[dict, None]:
        trainjob["spec"]["suspend"] = False
        return trainjob, None
    scenario.client.read_modify_write(kube.TRAINJOB, name=scenario.name, namespace=scenario.namespace,
                                      compute=unsuspend)
    below = scenario.new_running_pods()
    assert all(p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] == "1" for p in below)
    # Run too: R = 1 + 0 repeats the first execution again, and this time the
    # flag (from the JobSet reset) was raised before it ran.
    for pod in below:
        result = scenario.run(pod)
        assert (result.epoch, result.attempt) == (before[0].epoch, before[0].attempt)
        assert cause in (scenario.flag_at_run[-1] or "").split("\n")
    for pod in below:
        text = f"pod {pod['metadata']['name']} has admission 1, below the floor 2: A may have been lowered"
        scenario.wait("the below-floor report", lambda text=text: text in (scenario.foreign() or ""))
    # Before the flag, strictly increasing and distinct; every repeat after it
    # ran flagged, except the rebuilt JobSet's, whose flag is asserted above.
    scenario.check_identities(resets=rebuilt)

    # The real sidecar of one below-floor pod reports it; the controller turns
    # its Event into the flag (the cause carries the sidecar's own wording).
    pod = below[0]
    seen = _run_sidecar(scenario, pod, tmp=scenario.stack.plane.log_dir / f"sidecar-{pod['metadata']['name']}")
    # Below the floor, and (the JobSet was recreated above) not the recorded JobSet.
    assert (seen["verdict"], set(seen["rules"])) == ("violation", {"below-floor", "jobset-uid"}), seen
    mark = f"[seen by the sidecar of pod={pod['metadata']['name']}"
    scenario.wait("the sidecar's report to become the flag", lambda: mark in (scenario.foreign() or ""))


def _run_sidecar(scenario: Scenario, pod: dict, *, tmp: pathlib.Path) -> dict:
    """One check of the real sidecar for `pod`, under the shipped sidecar Role;
    returns its verdict line."""
    for path in sorted((REPO / "deployments/k8s/base/sidecar").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] in ("Role", "RoleBinding"):
            kubernetes.utils.create_from_dict(scenario.api, doc, namespace=scenario.namespace)
    meta = pod["metadata"]
    podinfo = sidecar_kit.write_podinfo(tmp / "podinfo", pod=meta["name"], namespace=meta["namespace"],
                                        labels=meta.get("labels") or {}, annotations=meta.get("annotations") or {})
    kubeconfig = yaml.safe_load(pathlib.Path(scenario.stack.plane.mint_kubeconfig(
        namespace=scenario.namespace, service_account=names.SIDECAR_SERVICE_ACCOUNT)).read_text())
    token = tmp / "token"
    token.write_text(kubeconfig["users"][0]["user"]["token"])
    env = {
        "PATH": os.environ["PATH"],
        "DISPATCH_SIDECAR_PODINFO_DIR": str(podinfo),
        "DISPATCH_SIDECAR_API_SERVER": kubeconfig["clusters"][0]["cluster"]["server"],
        "DISPATCH_SIDECAR_TOKEN_FILE": str(token),
        "DISPATCH_SIDECAR_CA_FILE": kubeconfig["clusters"][0]["cluster"]["certificate-authority"],
        "DISPATCH_SIDECAR_MAX_CHECKS": "1",
        "DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS": "0.2",
    }
    proc = subprocess.run([sys.executable, "-m", "sidecar"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr  # a violation is reported, never an exit status
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    verdicts = [line for line in lines if line.get("msg") == "verdict"]
    assert verdicts, proc.stderr
    return verdicts[-1]
