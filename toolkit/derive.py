"""The identity of a TrainJob made without a StartRequest (docs/adapter.md, "TrainJobs made by the
SDK or kubectl").

In a namespace that opts in, the admission policy `dispatch-identity` wraps such a TrainJob at
creation and marks it derived (`names.DERIVED_ANNOTATION`); its trainer reads the two prefixes
through the Downward API from pod-template annotations that do not exist yet. The admission check
gives it its identity with its first raise, in the same preconditioned update:

    G        = the namespace's generation counter, raised by one for this TrainJob
    N        = 0, attempt = 0
    job id   = <namespace>.<name>.<G>
    written  = the TrainJob annotations `toolkit start` writes (job id, generation, submission,
               attempt), and the prefixes in our runtime-patch entry's pod-template annotations
               (`names.EPOCH_PREFIX_ANNOTATION`, `names.TOKEN_PREFIX_ANNOTATION`)

The rule this keeps: a TrainJob deleted and made again under the same name (a notebook run
again) gets a G above every G the namespace handed out before, so each of its epochs
(G x 10^12 + R, R < 10^6) is above every epoch of the earlier one, and its attempt tokens differ
(G is in the job id). The counter outlives every TrainJob and the namespace itself (it is kept in
the controller's namespace, one key per namespace), and is raised by a preconditioned update
before G is written, so two TrainJobs never get one G. A G once written is never changed: the
check gives an identity only to a TrainJob that has none.

Until that raise the pod-template annotations are absent: the kubelet gives the prologue an empty
token prefix, and the prologue refuses to run (exit 125). A trainer never runs without its
identity.

Pure: plain dicts in, new dicts out; standard library and the core only.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from toolkit import identity, names

Obj = dict[str, Any]

# The message the check sets Rejected with is the annotation's, bounded and on one line.
REFUSAL_MAX = 512
_COUNTER = re.compile(r"0|[1-9][0-9]{0,6}")


class DeriveError(ValueError):
    """No identity can be given; the message names the value and the bound."""


def _annotations(trainjob: Obj) -> dict[str, Any]:
    return (trainjob.get("metadata") or {}).get("annotations") or {}


def is_derived(trainjob: Obj) -> bool:
    """Wrapped at creation by the admission policy."""
    return names.DERIVED_ANNOTATION in _annotations(trainjob)


def needs_identity(trainjob: Obj) -> bool:
    """Derived, and not given its identity yet."""
    return is_derived(trainjob) and names.JOB_ID_ANNOTATION not in _annotations(trainjob)


def refusal(trainjob: Obj) -> str | None:
    """Why the admission policy could not wrap this TrainJob, as one bounded line; None if it
    was not refused."""
    value = _annotations(trainjob).get(names.REFUSED_ANNOTATION)
    if value is None:
        return None
    text = " ".join(str(value).split()) or "refused by the admission policy dispatch-identity"
    if len(text) > REFUSAL_MAX:
        text = text[: REFUSAL_MAX - 3] + "..."
    return f"not wrapped at creation: {text}"


def job_id(*, namespace: str, name: str, generation: int) -> str:
    return f"{namespace}.{name}.{generation}"


def next_generation(data: dict[str, str] | None, namespace: str) -> tuple[int, dict[str, str]]:
    """The namespace's next G and the counter's data with it recorded. A value the controller
    did not write (not a canonical decimal) is refused rather than guessed at."""
    data = dict(data or {})
    current = data.get(namespace, "0")
    if not _COUNTER.fullmatch(current):
        raise DeriveError(f"ConfigMap {names.GENERATIONS_CONFIGMAP} key {namespace}: {current!r} is not a generation "
                          f"(0 to {identity.MAX_GENERATION})")
    generation = int(current) + 1
    if generation > identity.MAX_GENERATION:
        raise DeriveError(f"namespace {namespace}: the generation counter reached its bound {identity.MAX_GENERATION}")
    data[namespace] = str(generation)
    return generation, data


def _our_pod_annotations(trainjob: Obj) -> dict[str, Any] | None:
    """The pod-template annotations of our runtime-patch entry (the `node` replicated job), or None."""
    for entry in (trainjob.get("spec") or {}).get("runtimePatches") or []:
        if not isinstance(entry, dict) or entry.get("manager") != names.PATCH_MANAGER:
            continue
        jobs = (((entry.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
            "replicatedJobs") or []
        for job in jobs:
            if isinstance(job, dict) and job.get("name") == names.TRAINER_REPLICATED_JOB:
                pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {})
                annotations = (pod.get("metadata") or {}).get("annotations")
                return annotations if isinstance(annotations, dict) else None
    return None


def pod_annotation(trainjob: Obj, key: str) -> str | None:
    """What our runtime patch gives the trainer pods as annotation KEY."""
    value = (_our_pod_annotations(trainjob) or {}).get(key)
    return value if isinstance(value, str) else None


def with_identity(trainjob: Obj, *, generation: int) -> Obj:
    """A copy of a derived TrainJob carrying the identity for G (see the module docstring)."""
    meta = trainjob.get("metadata") or {}
    jid = job_id(namespace=str(meta.get("namespace")), name=str(meta.get("name")), generation=generation)
    epoch_prefix = identity.epoch_prefix(generation=generation, submission=0)
    token_prefix = identity.token_prefix(job_id=jid, submission=0, attempt=0)
    out = copy.deepcopy(trainjob)
    out.setdefault("metadata", {}).setdefault("annotations", {}).update({
        names.JOB_ID_ANNOTATION: jid,
        names.GENERATION_ANNOTATION: str(generation),
        names.SUBMISSION_ANNOTATION: "0",
        names.ATTEMPT_ANNOTATION: "0",
    })
    pod = _our_pod_annotations(out)
    if pod is None:
        raise DeriveError(f"TrainJob {meta.get('namespace')}/{meta.get('name')}: spec.runtimePatches has no entry of "
                          f"{names.PATCH_MANAGER} for replicated job {names.TRAINER_REPLICATED_JOB}")
    pod[names.EPOCH_PREFIX_ANNOTATION] = epoch_prefix
    pod[names.TOKEN_PREFIX_ANNOTATION] = token_prefix
    return out
