"""Reset detection against the cluster (DESIGN.md §7), both modes.

Three inputs, one output. The inputs are the JobSet of one of our TrainJobs
(its UID is recorded the first time it is seen; a different one later is a
reset of J), a pod of our trainer replicated job (the admission annotation
must be there and not below the floor), and a sidecar's Warning Event with
reason `names.SIDECAR_VIOLATION_REASON` on a TrainJob (the sidecar cannot
update the TrainJob, by design, so it reports and we record). The output is
`adapter.flag_foreign`: the cause detail on the TrainJob and a Warning
Event. The rules themselves are `toolkit.detect`, shared with the sidecar.

What this must never do: stop, suspend, delete or otherwise change the
workload. It only writes the TrainJob's jobset-uid and foreign annotations.

Pods that are terminating or finished are not checked: after a preemption
the old execution's pods linger while the floor is raised for the next
one, and they are not a reset.
"""

from __future__ import annotations

import logging
from typing import Any

from toolkit import adapter, detect, kube, names, raising

Obj = dict[str, Any]
log = logging.getLogger(__name__)

REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPONENT = "dispatch-controller"


def is_ours(trainjob: Obj | None) -> bool:
    """A TrainJob we started: it carries our runtime-patch entry."""
    if not trainjob:
        return False
    return any(
        p.get("manager") == names.PATCH_MANAGER for p in (trainjob.get("spec") or {}).get("runtimePatches") or []
    )


def owner_trainjob(obj: Obj) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "TrainJob" and str(ref.get("apiVersion", "")).startswith(f"{names.TRAINER_GROUP}/"):
            return str(ref.get("name"))
    return None


def pod_violation(pod: Obj, trainjob: Obj) -> detect.Violation | None:
    """Pure: the §7 pod rule for a pod of our trainer job, or None."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    labels = meta.get("labels") or {}
    if labels.get(REPLICATED_JOB_LABEL) != names.TRAINER_REPLICATED_JOB:
        return None
    annotations = meta.get("annotations") or {}
    return detect.pod(
        pod_name=str(meta.get("name")),
        admission=annotations.get(names.ADMISSION_ANNOTATION),
        restart=labels.get(names.RESTART_LABEL),
        floor=raising.counts(trainjob).floor,
    )


class Detector:
    def __init__(self, client: kube.Client, *, metrics: Any = None) -> None:
        self.client = client
        self.metrics = metrics

    def _flag(self, *, namespace: str, name: str, violation: detect.Violation) -> bool:
        new = adapter.flag_foreign(
            self.client, namespace=namespace, name=name, violation=violation, component=COMPONENT
        )
        if new:
            log.warning("flagged foreign: %s", violation.detail, extra={"trainjob": f"{namespace}/{name}", "rule": violation.rule})
            if self.metrics is not None:
                self.metrics.foreign(violation.rule)
        return new

    def _trainjob(self, namespace: str, name: str) -> Obj | None:
        try:
            trainjob = self.client.get(kube.TRAINJOB, name=name, namespace=namespace)
        except kube.NotFound:
            return None
        return trainjob if is_ours(trainjob) else None

    def jobset(self, jobset: Obj) -> bool:
        meta = jobset["metadata"]
        if meta.get("deletionTimestamp"):
            return False
        name = owner_trainjob(jobset)
        if name is None or self._trainjob(meta["namespace"], name) is None:
            return False
        violation = adapter.record_jobset_uid(self.client, namespace=meta["namespace"], name=name, uid=meta["uid"])
        if violation is None:
            return False
        return self._flag(namespace=meta["namespace"], name=name, violation=violation)

    def pod(self, pod: Obj) -> bool:
        meta = pod["metadata"]
        name = (meta.get("labels") or {}).get(names.JOBSET_NAME_LABEL)
        if not name:
            return False
        trainjob = self._trainjob(meta["namespace"], name)
        if trainjob is None:
            return False
        violation = pod_violation(pod, trainjob)
        if violation is None:
            return False
        return self._flag(namespace=meta["namespace"], name=name, violation=violation)

    def event(self, event: Obj) -> bool:
        """A sidecar's report: its message is the cause detail."""
        if event.get("reason") != names.SIDECAR_VIOLATION_REASON or event.get("type") != "Warning":
            return False
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "TrainJob":
            return False
        namespace, name = involved.get("namespace") or event["metadata"]["namespace"], involved.get("name")
        trainjob = self._trainjob(namespace, name)
        if trainjob is None:
            return False
        if involved.get("uid") and involved["uid"] != trainjob["metadata"].get("uid"):
            return False  # a report about an earlier TrainJob of the same name
        violation = detect.Violation("sidecar", str(event.get("message") or "sidecar reported a violation"))
        return self._flag(namespace=namespace, name=name, violation=violation)
