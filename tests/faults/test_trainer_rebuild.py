"""Trainer rebuilding the JobSet on its own: the JobSet is deleted by a controller, not a person.

The JobSet's owner reference is made to dangle (it names the TrainJob with another UID, as it would
after the TrainJob was recreated under the same name), so kube-controller-manager's garbage
collector deletes it, with its Jobs and pods; Trainer, which keeps one JobSet per TrainJob, builds a
new one, whose restarts start again at 0. Outcome: our controller flags the TrainJob foreign with
the exact cause `JobSet UID <new> is not the recorded <old>: J may have been reset`, and nothing is
stopped: the TrainJob stays unsuspended and the rebuilt JobSet's execution keeps running (it
repeats the first one's identity, which is what the flag reports). Plain mode.
"""

from __future__ import annotations

import uuid

import kubernetes.client

from devcluster import scenario as flow, stack as stack_mod
from devcluster.scenario import Scenario
from toolkit import adapter, names


def test_jobset_deleted_by_the_garbage_collector_is_flagged_and_nothing_is_stopped(
        stack: stack_mod.Stack, namespace: str) -> None:
    with stack.plane.api_client() as api:
        sc = Scenario(stack, api, namespace)
        sc.create_runtime(flow.runtime("rebuild"))
        sc.start("rebuild", env={"STAY": "1"})
        adapter.open_(sc.client, namespace=namespace, name=sc.name)
        before = [sc.run(pod) for pod in sc.new_pods()]
        old_uid = sc.wait("the JobSet UID to be recorded", lambda: (
            sc.trainjob()["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION))
        old = sc.jobset()
        assert old is not None and old["metadata"]["uid"] == old_uid
        sc.check_identities()

        [owner] = old["metadata"]["ownerReferences"]
        custom = kubernetes.client.CustomObjectsApi(api)
        custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", sc.name, {
            "metadata": {"ownerReferences": [{**owner, "uid": str(uuid.uuid4())}]}})
        new = sc.wait("the garbage collector to delete the JobSet and Trainer to build a new one", lambda: (
            (js := sc.jobset()) and js["metadata"]["uid"] != old_uid and js))
        assert adapter.restarts_of(new) == 0
        assert [o["uid"] for o in new["metadata"]["ownerReferences"]] == [sc.trainjob()["metadata"]["uid"]]
        rebuilt = [sc.run(pod) for pod in sc.new_pods()]
        cause = f"JobSet UID {new['metadata']['uid']} is not the recorded {old_uid}: J may have been reset"
        sc.wait("the foreign flag", lambda: cause in (sc.foreign() or "").split("\n"))
        # The reset the flag reports: the rebuilt JobSet's execution repeats the first one's identity.
        assert [(e.epoch, e.attempt) for e in rebuilt] == [(e.epoch, e.attempt) for e in before]
        sc.check_identities(resets=rebuilt)
        # Nothing stopped: still unsuspended, the rebuilt execution still running. (The first JobSet's
        # pods, deleted by the garbage collector with it, may still be terminating: not counted.)
        assert not sc.trainjob()["spec"].get("suspend")
        running = [pod for pod in sc.pods()
                   if (pod["metadata"].get("labels") or {}).get(names.JOBSET_UID_LABEL) == new["metadata"]["uid"]]
        assert running, sc.pods()
        for pod in running:
            assert not pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") == "Running", pod["status"]
        events = sc.events(names.FOREIGN_REASON)
        assert [e["message"] for e in events if e["message"] == cause] == [cause]
