"""Runtime requirements (docs/toolkit.md) against a (Cluster)TrainingRuntime.

Why: a kubelet restarting a container in place, or a Job replacing a failed
pod, starts a new execution that raises neither A nor J, so two executions
would share one R. The trainer job (the replicated job `node`) must
therefore make every replacement a JobSet restart (J + 1) or a re-admission
(A + 1):

- always refused:
  - the node pod template's `restartPolicy` other than `Never` (absent
    counts: JobSet's defaulting would set OnFailure);
  - the node Job's `backoffLimit` other than `0` (absent counts: the Job
    default is 6);
  - a node container's own `restartPolicy` other than `Never`, or
    `restartPolicyRules` (Kubernetes' container restart rules restart a
    container in place even in a `Never` pod);
- refused unless `allow_rank_restart` (a failed rank replaced without a
  JobSet restart; field names from JobSet v0.12.0 and Kubernetes batch/v1):
  - a `spec.template.spec.failurePolicy.rules[]` entry that applies to
    `node` (no `targetReplicatedJobs`, or one naming `node`) with action
    `RestartJob` or `RestartJobAndIgnoreMaxRestarts`;
  - `failurePolicy.restartStrategy: InPlaceRestart`;
  - `backoffLimitPerIndex` set on the node Job, whatever its value;
  - a `podFailurePolicy.rules[]` entry with action `Ignore` (an ignored
    failure is replaced without counting).

- always refused, because Trainer gives the TrainJob's `spec.trainer` (our
  command, the prologue and its `DISPATCH_K8S_*` env) only to the replicated
  job labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, and
  our runtime patch and the prologue's inputs target `node`:
  - `node` without that label (its pods would run the image's own command:
    no prologue, no `DISPATCH_EPOCH`);
  - another replicated job with that label.

Each refusal names the field path and the value found, or that it is
absent. Pure: the input is a decoded document and is never modified.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from toolkit import names

KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
RANK_RESTART_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
IN_PLACE_RESTART = "InPlaceRestart"

JOBSET_SPEC = "spec.template.spec"
NODE = f"{JOBSET_SPEC}.replicatedJobs[{names.TRAINER_REPLICATED_JOB}]"
NODE_JOB_SPEC = f"{NODE}.template.spec"
NODE_POD_SPEC = f"{NODE_JOB_SPEC}.template.spec"
# Trainer's label naming the replicated job that gets the TrainJob's spec.trainer.
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_STEP = "trainer"
TRAINER_STEP_LABELS = {ANCESTOR_LABEL: TRAINER_STEP}  # what `node`'s template must carry


@dataclasses.dataclass(frozen=True)
class Refusal:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_ABSENT = object()


def found(value: object) -> str:
    if value is _ABSENT:
        return "found absent"
    return f"found {json.dumps(value)}"


def _get(doc: object, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping) or key not in doc:
            return _ABSENT
        doc = doc[key]
    return doc


def node_job(runtime: Mapping[str, Any]) -> Any:
    """The replicated job `node`, or None when there is none."""
    rjobs = _get(runtime, "spec", "template", "spec", "replicatedJobs")
    if not isinstance(rjobs, list):
        return None
    for rjob in rjobs:
        if isinstance(rjob, Mapping) and rjob.get("name") == names.TRAINER_REPLICATED_JOB:
            return rjob
    return None


def describe(runtime: object) -> str:
    """`Kind/name` of a runtime document, for messages."""
    kind = _get(runtime, "kind")
    name = _get(runtime, "metadata", "name")
    return f"{kind if isinstance(kind, str) else '?'}/{name if isinstance(name, str) else '?'}"


def trainer_step(runtime: Mapping[str, Any]) -> list[Refusal]:
    """The replicated job Trainer gives spec.trainer to must be `node`, and only `node`."""
    out: list[Refusal] = []
    rjobs = _get(runtime, "spec", "template", "spec", "replicatedJobs")
    for rjob in rjobs if isinstance(rjobs, list) else []:
        if not isinstance(rjob, Mapping):
            continue
        name = rjob.get("name")
        step = _get(rjob, "template", "metadata", "labels", ANCESTOR_LABEL)
        where = f"{JOBSET_SPEC}.replicatedJobs[{name}].template.metadata.labels[{ANCESTOR_LABEL}]"
        if name == names.TRAINER_REPLICATED_JOB and step != TRAINER_STEP:
            out.append(Refusal(where, f"must be {TRAINER_STEP}: Trainer gives the TrainJob's command, the "
                                      f"prologue and its env only to the replicated job so labelled, {found(step)}"))
        elif name != names.TRAINER_REPLICATED_JOB and step == TRAINER_STEP:
            out.append(Refusal(where, f"must not be {TRAINER_STEP}: the prologue's inputs and our runtime patch "
                                      f"target {names.TRAINER_REPLICATED_JOB}, {found(step)}"))
    return out


def check(runtime: object, *, allow_rank_restart: bool = False) -> list[Refusal]:
    """Every refusal of the requirements above for this runtime; empty when it is acceptable."""
    if not isinstance(runtime, Mapping):
        return [Refusal("(document)", f"must be a mapping, found {type(runtime).__name__}")]
    kind = _get(runtime, "kind")
    if kind not in KINDS:
        return [Refusal("kind", f"must be ClusterTrainingRuntime or TrainingRuntime, {found(kind)}")]
    rjob = node_job(runtime)
    if rjob is None:
        return [Refusal(NODE, "the trainer's replicated job must exist, found absent")]

    out: list[Refusal] = trainer_step(runtime)
    job_spec = _get(rjob, "template", "spec")
    pod_spec = _get(job_spec, "template", "spec")

    policy = _get(pod_spec, "restartPolicy")
    if policy != "Never":
        out.append(Refusal(f"{NODE_POD_SPEC}.restartPolicy", f"must be Never, {found(policy)}"))
    backoff = _get(job_spec, "backoffLimit")
    if backoff != 0 or isinstance(backoff, bool):
        out.append(Refusal(f"{NODE_JOB_SPEC}.backoffLimit", f"must be 0, {found(backoff)}"))
    containers = _get(pod_spec, "containers")
    for i, container in enumerate(containers if isinstance(containers, list) else []):
        label = container.get("name", i) if isinstance(container, Mapping) else i
        where = f"{NODE_POD_SPEC}.containers[{label}]"
        own = _get(container, "restartPolicy")
        if own is not _ABSENT and own != "Never":
            out.append(Refusal(f"{where}.restartPolicy", f"must be absent or Never (in-place restart), {found(own)}"))
        rules = _get(container, "restartPolicyRules")
        if rules is not _ABSENT and rules:
            out.append(Refusal(f"{where}.restartPolicyRules", f"must be absent (in-place restart), {found(rules)}"))

    if allow_rank_restart:
        return out

    failure = _get(runtime, "spec", "template", "spec", "failurePolicy")
    rules = _get(failure, "rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        action = _get(rule, "action")
        targets = _get(rule, "targetReplicatedJobs")
        if targets is not _ABSENT and not isinstance(targets, list):
            out.append(Refusal(f"{JOBSET_SPEC}.failurePolicy.rules[{i}].targetReplicatedJobs",
                               f"must be a list of replicated job names, {found(targets)}"))
            continue
        applies = targets is _ABSENT or not targets or names.TRAINER_REPLICATED_JOB in targets
        if action in RANK_RESTART_ACTIONS and applies:
            out.append(
                Refusal(
                    f"{JOBSET_SPEC}.failurePolicy.rules[{i}].action",
                    f"must not replace a failed rank without a JobSet restart "
                    f"(set allowRankRestart to permit it), {found(action)}",
                )
            )
    strategy = _get(failure, "restartStrategy")
    if strategy == IN_PLACE_RESTART:
        out.append(
            Refusal(
                f"{JOBSET_SPEC}.failurePolicy.restartStrategy",
                f"must not restart pods in place (set allowRankRestart to permit it), {found(strategy)}",
            )
        )
    per_index = _get(job_spec, "backoffLimitPerIndex")
    if per_index is not _ABSENT and per_index is not None:
        out.append(
            Refusal(
                f"{NODE_JOB_SPEC}.backoffLimitPerIndex",
                f"must be absent: it replaces a failed rank (set allowRankRestart to permit it), {found(per_index)}",
            )
        )
    pod_rules = _get(job_spec, "podFailurePolicy", "rules")
    for i, rule in enumerate(pod_rules if isinstance(pod_rules, list) else []):
        action = _get(rule, "action")
        if action == "Ignore":
            out.append(
                Refusal(
                    f"{NODE_JOB_SPEC}.podFailurePolicy.rules[{i}].action",
                    f"must not be Ignore: an ignored failure is replaced (set allowRankRestart to permit it), "
                    f"{found(action)}",
                )
            )
    return out
