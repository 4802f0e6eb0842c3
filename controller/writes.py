"""The admission check's two writes (`controller.admission` decides when): the raise of A on the
TrainJob, and our checks' state on the Workload.

Both are JSON merge patches carrying the resourceVersion of the copy they were computed from, so
either lands on exactly that version or is refused with a 409. That is what lets the copies come
from the informers' caches: a copy that lags is not trusted, it only costs a 409, and after a 409
the copy is read once, fresh, and the write computed again from it. What a raise writes is
`raising`'s (pure: `raised` computes A, `merge_patch_of` the patch); nothing here computes A.

Never trusted from a cache: "already raised". A cached TrainJob that carries this Workload
version's marker (`raised_here`) writes nothing, so nothing would prove it current; the raise
reads the TrainJob fresh and decides on that read (a TrainJob started and stopped since would have
moved its generation, and is raised again).

The marker a raise writes, in the same patch: `raised-for = <workload uid>/<workload rv>/<the
TrainJob's generation after the raise>` (one more than the generation read: a raise always
changes the spec).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit import adapter, admission_checks, derive, kube, names, paths, raising

Obj = dict[str, Any]

# 409s in a row a raise reads afresh after before it gives up (each is another writer's landed write).
MAX_CONFLICTS = 100


def marker(workload: Obj) -> str:
    """The Workload version a raise is for: "<uid>/<resourceVersion>"."""
    meta = workload["metadata"]
    return f"{meta['uid']}/{meta['resourceVersion']}"


def generation(trainjob: Obj) -> int | None:
    value = (trainjob.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def raised_for(workload: Obj, trainjob: Obj) -> str:
    """The raised-for marker a raise for this Workload version writes on TRAINJOB as read before
    the raise: the Workload's marker and the generation the raise's write gives the TrainJob."""
    return f"{marker(workload)}/{(generation(trainjob) or 0) + 1}"


def raised_here(trainjob: Obj, workload: Obj) -> bool:
    """The TrainJob was raised for this Workload version and nothing has changed its spec since
    (still suspended, at the generation that raise left): no execution has started with its A."""
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    found = generation(trainjob)
    return (raising.is_suspended(trainjob) and found is not None
            and annotations.get(names.RAISED_FOR_ANNOTATION) == f"{marker(workload)}/{found}")


def raise_for(client: kube.Client, *, workload: Obj, trainjob: Obj, fresh: bool,
              give: Callable[[Obj], Obj] | None = None) -> adapter.Raised:
    """Raise A on TRAINJOB for this Workload version, or find it raised for it already.

    `fresh`: TRAINJOB was just read from the apiserver; otherwise it is a cache's copy, which is
    only a starting point (see the module docstring). `give` is what else the raise writes (a
    derived TrainJob's identity, `adapter.identity_giver`). Raises `adapter.AdapterError` when a
    fresh read cannot be raised (not suspended, gone, at the bound)."""
    meta = trainjob["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    conflicts = 0
    while True:
        if not fresh and (raised_here(trainjob, workload) or not raising.is_suspended(trainjob)):
            trainjob, fresh = _read(client, namespace=namespace, name=name), True
            continue
        if raised_here(trainjob, workload):
            return adapter.Raised(raising.counts(trainjob).current, conflicts, written=False,
                                  generation=generation(trainjob))
        try:
            base = give(trainjob) if give is not None else trainjob
            after, admission = raising.raised(base, record=(names.RAISED_FOR_ANNOTATION,
                                                           raised_for(workload, trainjob)))
        except (raising.RaiseRefused, derive.DeriveError) as exc:
            raise adapter.AdapterError(str(exc)) from None
        try:
            written = client.merge_patch(paths.TRAINJOB, raising.merge_patch_of(trainjob, after), name=name,
                                         namespace=namespace, field_manager=names.RAISE_FIELD_MANAGER)
        except kube.NotFound:
            raise adapter.AdapterError(f"TrainJob {namespace}/{name} not found") from None
        except kube.Conflict:
            conflicts += 1
            if conflicts >= MAX_CONFLICTS:
                raise kube.TooManyConflicts(f"TrainJob {name}: {conflicts} conflicts in a row") from None
            trainjob, fresh = _read(client, namespace=namespace, name=name), True
            continue
        return adapter.Raised(admission, conflicts, written=True, generation=generation(written))


def _read(client: kube.Client, *, namespace: str, name: str) -> Obj:
    try:
        return client.get(paths.TRAINJOB, name=name, namespace=namespace)
    except kube.NotFound:
        raise adapter.AdapterError(f"TrainJob {namespace}/{name} not found") from None


def set_checks(client: kube.Client, workload: Obj, *, checks: list[str], state: str, message: str) -> Obj:
    """Our checks' entries set to STATE on the Workload's status: a merge patch of the whole
    admissionChecks list computed from WORKLOAD, preconditioned on its resourceVersion (a 409
    when the Workload moved on since). Returns the Workload as written."""
    meta = workload["metadata"]
    entries = admission_checks.with_checks(workload, checks=checks, state=state, message=message)["status"]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"]},
             "status": {"admissionChecks": entries["admissionChecks"]}}
    return client.merge_patch(paths.WORKLOAD, patch, name=meta["name"], namespace=meta["namespace"],
                              subresource="status")
