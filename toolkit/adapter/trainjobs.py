"""What every operation reads and how it writes: the TrainJob, its JobSet, our annotations.

The adapter's operations (the package's other modules) share three things,
kept here so each is done one way:
- reading the TrainJob (`get_trainjob`: NotFound is a refusal naming it) and
  Trainer's one JobSet of it (`jobset_of`: owned by the TrainJob's UID, so a
  deleted predecessor's JobSet not yet collected is not taken for it), with
  J as that JobSet has it (`restarts_of`);
- writing our annotations (`write_annotations`): one
  `client.read_modify_write`, preconditioned on the resourceVersion it
  computed from (a 409 re-reads and recomputes, never re-sends), whose
  refusal by the apiserver (422) is `AnnotationsRefused`, one line saying how
  many bytes are ours (`history.BUDGET`) and how many in all;
- the refusal a user reads (`AdapterError`): one line naming the object and
  the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit import causes, history, kube, marks, paths

Obj = dict[str, Any]

# The Event source of the adapter's Events (a controller passes its own).
COMPONENT = "dispatch-adapter"


class AdapterError(Exception):
    """A refusal for the user: one line naming the object and the field."""


class AnnotationsRefused(AdapterError):
    """Our annotations could not be written: the apiserver refused them (422: all of the object's
    annotations pass its limit, ours kept within `history.BUDGET`), or ours alone would pass the
    budget. Retrying at once cannot help: a caller that loops backs off."""


def refused(*, namespace: str, name: str, trainjob: Obj | None, detail: str) -> AnnotationsRefused:
    """The refusal of our annotations on `trainjob` (as last read, or None), with the bytes they take."""
    annotations = ((trainjob or {}).get("metadata") or {}).get("annotations") or {}
    total = sum(causes.encoded(k) + causes.encoded(v) for k, v in annotations.items() if isinstance(v, str))
    return AnnotationsRefused(
        f"TrainJob {namespace}/{name}: annotations not written ({history.ours(annotations)} bytes of ours, budget "
        f"{history.BUDGET}; {total} bytes in all): {detail}")


def write_annotations(client: kube.Client, *, namespace: str, name: str,
                      compute: Callable[[Obj], tuple[Obj | None, Any]], **options: Any) -> tuple[Any, int]:
    """`client.read_modify_write` of a TrainJob for a write of our annotations, whose refusal by the
    apiserver (422) is `AnnotationsRefused`, one line, instead of an error retried as it was."""
    seen: list[Obj] = []

    def remember(trainjob: Obj) -> tuple[Obj | None, Any]:
        seen[:] = [trainjob]
        return compute(trainjob)

    try:
        return client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=remember, **options)
    except kube.Invalid as exc:
        raise refused(namespace=namespace, name=name, trainjob=seen[0] if seen else None,
                      detail=f"the apiserver refused: {exc.message}") from None


def generation(trainjob: Obj) -> int | None:
    """The TrainJob's metadata.generation, or None when it holds no count."""
    value = (trainjob.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def get_trainjob(client: kube.Client, *, namespace: str, name: str) -> Obj:
    try:
        return client.get(paths.TRAINJOB, name=name, namespace=namespace)
    except kube.NotFound:
        raise AdapterError(f"TrainJob {namespace}/{name} not found") from None


def restarts_of(jobset: Obj | None) -> int:
    """J as the JobSet has it now: its status.restarts (0 without a JobSet or before JobSet writes
    it; a value that is not a count reads as 0, as JobSet never writes one)."""
    value = ((jobset or {}).get("status") or {}).get("restarts")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def jobset_of(client: kube.Client, *, trainjob: Obj) -> Obj | None:
    """Trainer's one JobSet of the TrainJob (named like it and owned by its UID), if any. A JobSet
    of that name owned by another UID is a deleted predecessor's, not yet collected: not this one."""
    meta = trainjob["metadata"]
    try:
        jobset = client.get(paths.JOBSET, name=meta["name"], namespace=meta["namespace"])
    except kube.NotFound:
        return None
    return jobset if marks.owned_by(jobset, trainjob) else None

