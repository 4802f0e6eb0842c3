"""A test's namespaces removed once it is done with them: their pods deleted with a grace of 1 s
(nothing in them is judged any more), the namespaces deleted, and the pods waited for until the
kubelet has torn them down, so that the next test's pods have the node's CPUs. A grace above 0
keeps each pod object until the kubelet has stopped its containers (0 would remove it from the
API at once, the containers still running). The namespaces themselves go on their own."""

from __future__ import annotations

from collections.abc import Iterable

import kubernetes.client

from tests import waiting


def leave(api: kubernetes.client.ApiClient, namespaces: Iterable[str], *, timeout: float) -> None:
    core = kubernetes.client.CoreV1Api(api)
    names = list(namespaces)
    for namespace in names:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=1)
        core.delete_namespace(namespace)
    waiting.until(f"the pods of {', '.join(names)} to be gone",
                  lambda: not any(core.list_namespaced_pod(n).items for n in names), timeout=timeout)
