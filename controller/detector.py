"""Reset detection against the cluster (docs/adapter.md), both modes: what the controller's
workers call for a JobSet, a trainer pod or a sidecar's report, and what it writes.

Three inputs, one output. The inputs are the JobSet of one of our TrainJobs
(its UID is recorded the first time it is seen; a different one later is a
reset of J), a pod of our trainer replicated job (judged by `pod_rules`: the
admission annotation must be there and not below the floor, and its
execution must not repeat one recorded), and a sidecar's Warning Event with
reason `names.SIDECAR_VIOLATION_REASON` on a TrainJob (the sidecar cannot
update the TrainJob, by design, so it reports and we record). The output is
`adapter.flag_foreign`: the cause detail on the TrainJob and a Warning
Event. The rules themselves are `toolkit.detect`, shared with the sidecar.

A sidecar's report is a hint, never evidence (`sidecar_reports`): on a report
the controller re-reads the evidence itself (the TrainJob's floor, the named
pod's admission annotation and restart label if that pod is one of this
TrainJob's, the JobSet's UID and the pod's JobSet UID label against the
recorded one) and flags only what that re-read confirms. The claim is kept
beside the confirmed cause, on the same line (`<cause> (confirmed by the
controller; the sidecar reported: <claim>)`), so the foreign annotation keeps
its one-cause-a-line contract; the first claim of a cause is kept, later
reports of the same cause add nothing. A report the re-read does not confirm
flags nothing: it is logged as "sidecar report unconfirmed" and counted
(`dispatch_sidecar_reports_total{outcome}`).

What this must never do: stop, suspend, delete or otherwise change the
workload. It only writes the TrainJob's jobset-uid, foreign and history
annotations.

No flag from a stale cache: the informer's copy of a pod can be older than
the floor read fresh for it (a pod of the previous execution, seen late
across a raise, still looks live there). So a pod is flagged only after a
fresh read of that pod shows the violation too; the informer's copy only
says where to look.

Every trainer pod seen (live or ended) is also recorded in the TrainJob's
execution history (`toolkit.history`, through `adapter.record_execution`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from toolkit import adapter, admission_checks, detect, history, kube, marks, names, paths, raising
from controller import pod_rules, sidecar_reports

Obj = dict[str, Any]
log = logging.getLogger(__name__)

COMPONENT = "dispatch-controller"


class Detector:
    def __init__(self, client: kube.Client, *, metrics: Any = None, clock: Callable[[], str] = detect.now,
                 ours: Callable[[], set[str] | None] | None = None) -> None:
        self.client = client
        self.metrics = metrics
        self.clock = clock  # the time recorded in the history
        # The names of the AdmissionChecks whose controllerName is ours (the controller keeps them);
        # None while they are not known yet (its cache has not synced).
        self.ours = ours if ours is not None else (lambda: admission_checks.ours(client))

    def _admitted(self, pod: Obj, trainjob: Obj) -> bool | None:
        """Kueue mode, when the resume rule needs it: the TrainJob's Workload admitted through our
        check now (a list of the namespace's Workloads); None when the rule does not need it."""
        labels = trainjob["metadata"].get("labels") or {}
        writer = raising.unsuspended_at(trainjob)
        if names.KUEUE_QUEUE_LABEL not in labels or not marks.is_live(pod) or writer is None:
            return None
        ours = self.ours()
        if ours is None:
            return None
        workloads, _ = self.client.list(paths.WORKLOAD, namespace=trainjob["metadata"]["namespace"])
        return pod_rules.admitted_by(workloads, trainjob, ours=ours, unsuspended=writer[1])

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
            trainjob = self.client.get(paths.TRAINJOB, name=name, namespace=namespace)
        except kube.NotFound:
            return None
        return trainjob if marks.is_ours(trainjob) else None

    def jobset(self, jobset: Obj) -> bool:
        meta = jobset["metadata"]
        if meta.get("deletionTimestamp"):
            return False
        name = marks.owner_trainjob(jobset)
        trainjob = None if name is None else self._trainjob(meta["namespace"], name)
        if name is None or trainjob is None or not marks.owned_by(jobset, trainjob):
            return False  # not ours, or a deleted predecessor's of the same name
        violation = adapter.record_jobset_uid(self.client, namespace=meta["namespace"], name=name, uid=meta["uid"],
                                              first=trainjob)
        if violation is None:
            return False
        return self._flag(namespace=meta["namespace"], name=name, violation=violation)

    def pod(self, pod: Obj) -> bool:
        """Judge a trainer pod (the rules that depend on it running, from a
        fresh read of it before any flag), record the JobSet UID it names if
        none is recorded yet, and record its execution in the history."""
        meta = pod["metadata"]
        namespace = meta["namespace"]
        name = (meta.get("labels") or {}).get(names.JOBSET_NAME_LABEL)
        if not name or not marks.is_trainer(pod):
            return False
        trainjob = self._trainjob(namespace, name)
        if trainjob is None:
            return False
        pod_jobset = (meta.get("labels") or {}).get(names.JOBSET_UID_LABEL)
        annotations = trainjob["metadata"].get("annotations") or {}
        if pod_jobset and not annotations.get(names.JOBSET_UID_ANNOTATION) and not pod_rules.exempt(pod, trainjob):
            # The first JobSet may be seen through its pods first (the
            # JobSet's own event can be merged away by a quick delete and
            # recreate, the pods' cannot: each pod is its own key): record
            # it, so that a later JobSet is compared with it.
            adapter.record_jobset_uid(self.client, namespace=namespace, name=name, uid=pod_jobset)
            trainjob = self._trainjob(namespace, name) or trainjob
        admitted = self._admitted(pod, trainjob)
        found = pod_rules.judge(pod, trainjob, admitted=admitted)
        if marks.is_live(pod) and any(v.rule in pod_rules.LIVE_RULES for v in found):
            # The cache may be behind the floor just read: judge the pod as it is now. (An ended
            # pod is judged by what never changes: its creation time and its A.)
            fresh = self._one(paths.POD, namespace=namespace, name=meta["name"])
            found = pod_rules.judge(fresh, trainjob, admitted=admitted) if fresh is not None else []
            pod = fresh if fresh is not None else pod
        flagged = False
        for violation in found:
            flagged = self._flag(namespace=namespace, name=name, violation=violation) or flagged
        verdict = f"foreign: {found[0].rule}" if found else "ok"
        observation = history.from_pod(pod, trainjob, now=self.clock(), verdict=verdict)
        if observation is not None:
            # The unsuspend read now is kept with it: its earliest time, should a later write of the
            # same manager move its managedFields time (history.with_unsuspend).
            observation = dataclasses.replace(observation, unsuspend=raising.unsuspend_seen(trainjob))
            adapter.record_execution(self.client, namespace=namespace, name=name, observation=observation,
                                     first=None if flagged else trainjob)
        return flagged

    def _one(self, res: paths.Resource, *, namespace: str, name: str) -> Obj | None:
        """A fresh read by name. A list with a name selector, not a get: the
        controller's Role lists and watches pods and JobSets, never gets them."""
        items, _ = self.client.list(res, namespace=namespace, field_selector=f"metadata.name={name}")
        return items[0] if items else None

    def event(self, event: Obj) -> bool:
        """A sidecar's report: a hint to re-read the evidence, which alone decides."""
        if event.get("reason") != names.SIDECAR_VIOLATION_REASON or event.get("type") != "Warning":
            return False
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "TrainJob":
            return False
        namespace, name = event["metadata"]["namespace"], involved.get("name")
        if not name or (involved.get("namespace") or namespace) != namespace:
            return False
        trainjob = self._trainjob(namespace, name)
        if trainjob is None:
            return False
        if involved.get("uid") and involved["uid"] != trainjob["metadata"].get("uid"):
            return False  # a report about an earlier TrainJob of the same name
        claim = sidecar_reports.claim_text(event)
        pod_name = sidecar_reports.claimed_pod(event)
        pod = self._one(paths.POD, namespace=namespace, name=pod_name) if pod_name else None
        jobset = self._one(paths.JOBSET, namespace=namespace, name=name)
        found = sidecar_reports.confirmed(trainjob=trainjob, pod=pod, jobset=jobset)
        rule = sidecar_reports.claimed_rule(claim)
        matching = [v for v in found if v.rule == rule]
        flagged = False
        causes = ((trainjob["metadata"].get("annotations") or {}).get(names.FOREIGN_ANNOTATION) or "").split("\n")
        for violation in found:
            if violation in matching:
                prefix = f"{violation.detail} {sidecar_reports.CONFIRMED}"
                if any(cause.startswith(prefix) for cause in causes):
                    # One claim kept per cause: more reports of it (every pod's
                    # sidecar, or a flood of forged ones) add no line or Event.
                    continue
                violation = detect.Violation(violation.rule, f"{prefix} {claim})")
            flagged = self._flag(namespace=namespace, name=name, violation=violation) or flagged
        # Logged and counted last, once everything this report caused is written.
        if matching:
            self._count("confirmed")
        else:
            log.warning("sidecar report unconfirmed", extra={
                "trainjob": f"{namespace}/{name}", "event": event["metadata"].get("name"), "pod": pod_name,
                "claim": claim, "claimed_rule": rule, "pod_found": pod is not None,
                "confirmed_rules": [v.rule for v in found]})
            self._count("unconfirmed")
        return flagged

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.sidecar_report(outcome)
