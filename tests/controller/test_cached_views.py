"""What the admission check's caches keep (`views.trainjob_view`, `views.workload_view`) is enough
for its writes: a raise computed from the cached TrainJob and sent as a merge patch leaves the
TrainJob as the raise of the whole object would (the history moved along, every other manager's
runtime patch kept), and the cached Workload decides and sets our check as the whole one does."""

from __future__ import annotations

import copy

from controller import admission, views, writes
from tests import mergepatch
from toolkit import history, names, raising

WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
    "metadata": {"name": "wl", "namespace": "ns", "uid": "wl-uid", "resourceVersion": "7",
                 "managedFields": [{"manager": "kueue", "operation": "Update"}]},
    "spec": {"podSets": [{"name": "node", "count": 4, "template": {"spec": {"containers": [{"name": "node"}]}}}]},
    "status": {
        "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "m",
                        "lastTransitionTime": "2026-12-07T10:00:00Z"}],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "node", "count": 4}]},
        "admissionChecks": [{"name": "ours", "state": "Pending", "message": "", "lastTransitionTime": "t",
                             "podSetUpdates": [{"name": "node", "labels": {"a": "b"}}]},
                            {"name": "theirs", "state": "Ready", "message": "ok", "lastTransitionTime": "t"}],
    },
}


def _trainjob() -> dict:
    entry = raising.patch_entry(4)
    theirs = {"manager": "example.com/other", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": {"annotations": {"x": "y"}}}}}}]}}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "ns", "uid": "tj-uid", "resourceVersion": "12", "generation": 5,
                     "labels": {names.KUEUE_QUEUE_LABEL: "lq"},
                     "annotations": {names.FLOOR_ANNOTATION: "4", history.MINIMUM_ANNOTATION: "9"},
                     "managedFields": [
                         {"manager": names.RAISE_FIELD_MANAGER, "operation": "Update", "time": "2026-12-07T09:00:00Z",
                          "fieldsV1": {"f:metadata": {"f:annotations": {}}}},
                         {"manager": "kubectl", "operation": "Update", "time": "2026-12-07T09:30:00Z",
                          "fieldsV1": {"f:spec": {"f:suspend": {}}}}]},
        "spec": {"suspend": True, "runtimeRef": {"name": "r", "kind": "ClusterTrainingRuntime"},
                 "trainer": {"image": "i", "command": ["x" * 1000]}, "runtimePatches": [theirs, entry]},
        "status": {"conditions": [{"type": "Suspended", "status": "True"}]},
    }


def test_a_raise_from_the_cached_trainjob_writes_what_the_raise_of_the_whole_one_writes():
    whole = _trainjob()
    cached = views.trainjob_view(whole)
    assert "trainer" not in cached["spec"] and "status" not in cached
    assert [e["manager"] for e in cached["metadata"]["managedFields"]] == [names.RAISE_FIELD_MANAGER]
    mark = (names.RAISED_FOR_ANNOTATION, writes.raised_for(WORKLOAD, cached))
    from_cache, a = raising.raised(cached, record=mark)
    from_whole, b = raising.raised(whole, record=mark)
    assert a == b == 9  # the adoption's minimum, taken and removed
    written = mergepatch.applied(whole, raising.merge_patch_of(cached, from_cache))
    assert written == from_whole
    assert raising.last_raise(cached) == raising.last_raise(whole) == (4, "2026-12-07T09:00:00Z")
    assert list(history.of(written).floors) == [(4, "2026-12-07T09:00:00Z")]


def test_the_cached_trainjob_is_ours_and_owned_as_the_whole_one_is():
    whole = _trainjob()
    cached = views.trainjob_view(whole)
    owned = {**WORKLOAD, "metadata": {**WORKLOAD["metadata"], "ownerReferences": [
        {"apiVersion": f"{names.TRAINER_GROUP}/v1alpha1", "kind": "TrainJob", "name": "tj", "uid": "tj-uid"}]}}
    seen = views.workload_view(owned)
    assert admission._usable(cached, seen, owner="tj") and admission._usable(whole, owned, owner="tj")


def test_the_cached_workload_decides_and_keeps_every_check_entry_whole():
    cached = views.workload_view(WORKLOAD)
    assert "spec" not in cached and "managedFields" not in cached["metadata"]
    assert admission.pending_checks(cached, {"ours", "theirs"}) == admission.pending_checks(WORKLOAD, {"ours", "theirs"}) == ["ours"]
    assert cached["status"]["admissionChecks"] == WORKLOAD["status"]["admissionChecks"]
    assert cached["status"]["admission"] == {"clusterQueue": "cq"}
    evicted = copy.deepcopy(WORKLOAD)
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted"})
    assert admission.in_eviction_window(views.workload_view(evicted))
    assert admission.pending_checks(views.workload_view(evicted), {"ours"}) == []
