"""The generation counter of TrainJobs made without a StartRequest (`toolkit.derive`).

One ConfigMap, `names.GENERATIONS_CONFIGMAP`, in the controller's own namespace, one key per
training namespace: it outlives every TrainJob and every training namespace, so a TrainJob made
again under an old name, even in a namespace deleted and made again, gets a G above every G handed
out there before.

`giver` is what both admissions (the check's, `toolkit open`'s) call before their raise: for a
TrainJob that needs an identity it claims G and answers what writes it with the raise.

`claim` raises a namespace's counter by one and answers the new G. The raise is an update
preconditioned on the version it was computed from (the first one a create, which a concurrent
create answers with AlreadyExists): two claims never answer one G. A claim whose G is never
written (the TrainJob's raise then fails) leaves a gap, which costs nothing: G only has to grow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit import derive, kube, names, paths
from toolkit.adapter import trainjobs

# Conflicting writes a claim retries before giving up (each is another claim that landed).
CLAIM_ATTEMPTS = 50


def claim(client: kube.Client, *, counter_namespace: str, namespace: str) -> int:
    """Raise NAMESPACE's counter and answer its new G (refused in one line at the bound, or on a
    counter value the controller did not write)."""
    for _ in range(CLAIM_ATTEMPTS):
        try:
            current = client.get(paths.CONFIG_MAP, name=names.GENERATIONS_CONFIGMAP, namespace=counter_namespace)
        except kube.NotFound:
            generation, data = _next(None, namespace)
            try:
                client.create(paths.CONFIG_MAP, {"metadata": {"name": names.GENERATIONS_CONFIGMAP}, "data": data},
                              namespace=counter_namespace)
                return generation
            except kube.AlreadyExists:
                continue  # another claim made it first: raise the one it made
        generation, data = _next(current.get("data"), namespace)
        try:
            client.replace(paths.CONFIG_MAP, {**current, "data": data})
            return generation
        except kube.Conflict:
            continue
    raise trainjobs.AdapterError(f"ConfigMap {counter_namespace}/{names.GENERATIONS_CONFIGMAP}: "
                                 f"{CLAIM_ATTEMPTS} conflicting writes in a row; try again")


def _next(data: dict[str, str] | None, namespace: str) -> tuple[int, dict[str, str]]:
    try:
        return derive.next_generation(data, namespace)
    except derive.DeriveError as exc:
        raise trainjobs.AdapterError(str(exc)) from None


def giver(client: kube.Client, trainjob: dict[str, Any], *,
          counter_namespace: str) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """For a TrainJob the admission policy wrapped and nothing has given an identity yet: claim its
    namespace's next G now, and answer what writes it with the raise (`raise_admission`'s `give`).
    A read that finds an identity already given (a concurrent admission's) keeps that one: a G
    once written never changes. None for every other TrainJob."""
    if not derive.needs_identity(trainjob):
        return None
    generation = claim(client, counter_namespace=counter_namespace, namespace=trainjob["metadata"]["namespace"])

    def give(tj: dict[str, Any]) -> dict[str, Any]:
        return derive.with_identity(tj, generation=generation) if derive.needs_identity(tj) else tj

    return give
