"""Watches behave as a client of a real apiserver sees them: resume and 410 Gone."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest

from devcluster import harness

pytestmark = pytest.mark.cluster


def first_events(response: Any, count: int) -> list[dict[str, Any]]:
    """Read `count` events from a raw watch response, then close it."""
    events: list[dict[str, Any]] = []
    try:
        buffer = b""
        for chunk in response.stream(1024, decode_content=True):
            buffer += chunk
            while b"\n" in buffer and len(events) < count:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    events.append(json.loads(line))
            if len(events) >= count:
                break
    finally:
        response.release_conn()
        response.close()
    return events


def test_watch_resumes_after_a_resource_version(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    seen = core.create_namespaced_config_map(namespace, {"metadata": {"name": "a"}})
    for name in ("b", "c"):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}})

    response = core.list_namespaced_config_map(
        namespace, watch=True, resource_version=seen.metadata.resource_version,
        timeout_seconds=20, _preload_content=False, _request_timeout=30)
    events = first_events(response, 2)

    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b"), ("ADDED", "c")]


def test_watch_from_a_compacted_resource_version_is_410_gone(
        control_plane: harness.ControlPlane | harness.ExistingCluster,
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    expired = control_plane.expired_resource_version(namespace=namespace)
    core = kubernetes.client.CoreV1Api(api_client)
    try:
        response = core.list_namespaced_pod_template(
            namespace, watch=True, resource_version=expired,
            timeout_seconds=20, _preload_content=False, _request_timeout=30)
    except kubernetes.client.ApiException as e:  # some servers refuse before streaming
        assert e.status == 410
        return
    events = first_events(response, 1)
    assert events, f"a watch from resourceVersion {expired} ended with no event, not 410 Gone"
    [event] = events
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] in ("Expired", "Gone")
