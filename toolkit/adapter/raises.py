"""The writes of A: `start` creates the TrainJob at A = 0, and every later A is the raise's.

- Every write that changes A goes through `raise_admission`: one update
  preconditioned on the resourceVersion it was computed from (the rules are
  `toolkit.raising`'s); a 409 is re-read and recomputed, never re-sent.
- Start never changes an existing TrainJob: the name is a function of the
  job and submission, so AlreadyExists means "already started". It creates
  the rendered TrainJob suspended with A = 0, after checking its runtime on
  the cluster (`check_runtime`, `toolkit.runtime_check`'s rules).
- The runtime is checked again before every admission (open, release, and
  the controller's admission check): a (Cluster)TrainingRuntime can be
  edited after start, and a JobSet rebuilt later uses the edited one.
  Whether a failed rank may be replaced is the request's, recorded by start
  on the TrainJob (`ALLOW_RANK_RESTART_ANNOTATION`) so every later check
  applies the same rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from toolkit import derive, kube, names, paths, raising, runtime_check
from toolkit.adapter import trainjobs

Obj = dict[str, Any]

# Which Workload admission the last raise was for (see controller.admission).
RAISED_FOR_ANNOTATION = names.RAISED_FOR_ANNOTATION
# Written by start when the request allows a failed rank to be replaced
# (docs/toolkit.md), so the runtime's later checks apply the same rule.
ALLOW_RANK_RESTART_ANNOTATION = f"{names.DOMAIN}/allow-rank-restart"


@dataclasses.dataclass(frozen=True)
class Raised:
    admission: int  # A after the update (or as found, when nothing was written)
    conflicts: int  # 409s re-read and recomputed
    written: bool = True
    jobset_reset: str | None = None  # a JobSet UID mismatch seen (and flagged) before the raise
    generation: int | None = None  # the TrainJob's metadata.generation after the write (or as found)
    # Kueue mode's release: the Workloads set spec.active true (A untouched: the check raises it
    # at their next admission).
    requeued: tuple[str, ...] = ()


def raise_admission(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    unsuspend: bool = False,
    first: Obj | None = None,
    give: Callable[[Obj], Obj] | None = None,
) -> Raised:
    """Raise A on the TrainJob (`raising`) and return the A written: `toolkit open`'s and
    `release`'s raise (the admission check writes its own, `controller.writes`).

    `first` is a copy already read to start from (a 409 reads afresh). `give(trainjob)` is what
    else the same update writes (a derived TrainJob's identity, `generations.giver`), applied to
    every fresh read before the raise.
    """

    def compute(trainjob: Obj) -> tuple[Obj | None, Raised]:
        if give is not None:
            try:
                trainjob = give(trainjob)
            except derive.DeriveError as exc:
                raise trainjobs.AdapterError(str(exc)) from None
        try:
            new, admission = raising.raised(trainjob, unsuspend=unsuspend)
        except raising.RaiseRefused as exc:
            raise trainjobs.AdapterError(str(exc)) from None
        return new, Raised(admission, 0)

    written: list[Obj] = []
    try:
        result, conflicts = client.read_modify_write(
            paths.TRAINJOB, name=name, namespace=namespace, compute=compute, first=first,
            field_manager=names.RAISE_FIELD_MANAGER, on_written=written.append,
        )
    except kube.NotFound:
        raise trainjobs.AdapterError(f"TrainJob {namespace}/{name} not found") from None
    if written:
        result = dataclasses.replace(result, generation=trainjobs.generation(written[0]))
    return dataclasses.replace(result, conflicts=conflicts)


@dataclasses.dataclass(frozen=True)
class Started:
    namespace: str
    name: str
    created: bool


def _runtime(client: kube.Client, *, namespace: str, ref: Obj) -> Obj:
    kind = ref.get("kind") or "ClusterTrainingRuntime"
    name = ref.get("name") or ""
    try:
        if kind == "TrainingRuntime":
            return client.get(paths.TRAINING_RUNTIME, name=name, namespace=namespace)
        return client.get(paths.CLUSTER_TRAINING_RUNTIME, name=name)
    except kube.NotFound:
        raise trainjobs.AdapterError(f"spec.runtimeRef: {kind} {name!r} not found on the cluster") from None


def check_runtime(client: kube.Client, *, trainjob: Obj, allow_rank_restart: bool | None = None) -> None:
    """The runtime requirements (docs/toolkit.md) against the runtime the TrainJob names, read now: a
    (Cluster)TrainingRuntime can be edited after start, and a JobSet rebuilt
    later uses the edited one. `trainjobs.AdapterError` names the field and the value.
    `allow_rank_restart` None: as start recorded it on the TrainJob."""
    meta = trainjob.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if allow_rank_restart is None:
        allow_rank_restart = (meta.get("annotations") or {}).get(ALLOW_RANK_RESTART_ANNOTATION) == "true"
    runtime = _runtime(client, namespace=namespace, ref=(trainjob.get("spec") or {}).get("runtimeRef") or {})
    refusals = runtime_check.check(runtime, allow_rank_restart=allow_rank_restart)
    if refusals:
        raise trainjobs.AdapterError(
            f"runtime {runtime['metadata']['name']}: " + "; ".join(str(r) for r in refusals)
        )


def start(
    client: kube.Client,
    *,
    trainjob: Obj,
    allow_rank_restart: bool = False,
) -> Started:
    """Create the rendered TrainJob suspended with A = 0, after checking its
    runtime on the cluster. An existing TrainJob of that name is left as is."""
    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        client.get(paths.TRAINJOB, name=name, namespace=namespace)
        return Started(namespace, name, created=False)
    except kube.NotFound:
        pass
    check_runtime(client, trainjob=trainjob, allow_rank_restart=allow_rank_restart)
    if allow_rank_restart:
        trainjob = {**trainjob, "metadata": {**meta, "annotations": {
            **(meta.get("annotations") or {}), ALLOW_RANK_RESTART_ANNOTATION: "true"}}}
    if not raising.is_suspended(trainjob) or raising.patch_admission(trainjob) != 0:
        raise trainjobs.AdapterError(
            f"TrainJob {name}: must be rendered with spec.suspend true and admission 0 in our runtime patch"
        )
    try:
        client.create(paths.TRAINJOB, trainjob, namespace=namespace)
    except kube.AlreadyExists:
        return Started(namespace, name, created=False)
    except kube.Invalid as exc:
        raise trainjobs.AdapterError(f"TrainJob {name}: refused by the apiserver: {exc.message}") from None
    return Started(namespace, name, created=True)
