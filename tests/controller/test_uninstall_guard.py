"""The chart's uninstall guard (controller/uninstall_guard.py), run as its hook's Job runs it, against
the real apiserver with Kueue's CRDs: it refuses, naming the queue, while a ClusterQueue lists our
AdmissionCheck, changes nothing, and lets the uninstall go once no queue does."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import kubernetes.client

from controller import uninstall_guard
from devcluster import harness
from toolkit import admission_checks

KUEUE = ("kueue.x-k8s.io", "v1beta2")


def guard(plane: harness.ControlPlane) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller.uninstall_guard"], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)})


def test_the_guard_refuses_while_a_queue_lists_our_check_and_changes_nothing(
        control_plane: harness.ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    ours, theirs = f"ours-{suffix}", f"theirs-{suffix}"
    with control_plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        for name, controller in ((ours, admission_checks.CONTROLLER_NAME), (theirs, "example.com/other")):
            custom.create_cluster_custom_object(*KUEUE, "admissionchecks", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": name},
                "spec": {"controllerName": controller}})
        queues = {f"ours-only-{suffix}": strategy_of(ours), f"both-{suffix}": strategy_of(theirs, ours),
                  f"theirs-only-{suffix}": strategy_of(theirs)}
        for name, spec in queues.items():
            custom.create_cluster_custom_object(*KUEUE, "clusterqueues", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
                "spec": {"namespaceSelector": {}, **spec}})
        try:
            done = guard(control_plane)
            assert done.returncode == 1, done.stderr
            lines = done.stderr.splitlines()
            for name in (f"ours-only-{suffix}", f"both-{suffix}"):
                assert f"uninstall guard: ClusterQueue {name} lists {ours}: remove it from the queue first" in lines
            assert not [line for line in lines if f"theirs-only-{suffix}" in line]
            assert lines[-1].startswith("uninstall guard: refused, nothing changed")
            for name, spec in queues.items():  # nothing changed
                got = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", name)["spec"]
                assert {k: got.get(k) for k in spec} == spec

            for name in (f"ours-only-{suffix}", f"both-{suffix}"):
                custom.patch_cluster_custom_object(*KUEUE, "clusterqueues", name, {"spec": strategy_of(theirs)})
            done = guard(control_plane)
            assert done.returncode == 0, done.stderr
        finally:
            for name in queues:
                custom.delete_cluster_custom_object(*KUEUE, "clusterqueues", name)
            for name in (ours, theirs):
                custom.delete_cluster_custom_object(*KUEUE, "admissionchecks", name)


def strategy_of(*checks: str) -> dict[str, Any]:
    return {"admissionChecksStrategy": {"admissionChecks": [{"name": c} for c in checks]}}


def test_an_unfinished_workload_that_still_carries_our_check_is_counted() -> None:
    ours = [{"name": "dispatch-admission", "state": "Ready"}]
    workloads = [{"status": {"admissionChecks": ours}},
                 {"status": {"admissionChecks": ours, "conditions": [{"type": "Finished", "status": "True"}]}},
                 {"status": {"admissionChecks": ours, "conditions": [{"type": "Finished", "status": "False"}]}},
                 {"status": {"admissionChecks": [{"name": "other"}]}}, {}]
    assert uninstall_guard.blockers({"dispatch-admission"}, [], workloads) == [
        "2 unfinished Workload(s) still carry dispatch-admission in their status: wait until Kueue has removed it"]
    assert uninstall_guard.blockers(set(), [{"metadata": {"name": "q"}, "spec": strategy_of("x")}],
                                    workloads) == []


def test_a_cluster_it_cannot_reach_is_exit_2_in_one_line(tmp_path: os.PathLike[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "controller.uninstall_guard"], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "KUBECONFIG": f"{tmp_path}/missing"})
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("uninstall guard: cannot read the cluster: ")
