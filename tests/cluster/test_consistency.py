"""Optimistic concurrency is the apiserver's: a stale resourceVersion is a 409."""

from __future__ import annotations

import kubernetes.client
import pytest

pytestmark = pytest.mark.cluster


def test_update_with_stale_resource_version_is_409(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    created = core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    stale = created.metadata.resource_version

    fresh = core.replace_namespaced_config_map(
        "cm", namespace, {"metadata": {"name": "cm", "resourceVersion": stale}, "data": {"a": "2"}})
    assert fresh.metadata.resource_version != stale

    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.replace_namespaced_config_map(
            "cm", namespace, {"metadata": {"name": "cm", "resourceVersion": stale}, "data": {"a": "3"}})
    assert caught.value.status == 409
    assert core.read_namespaced_config_map("cm", namespace).data == {"a": "2"}
