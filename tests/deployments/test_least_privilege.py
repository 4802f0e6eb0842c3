"""Every shipped Deployment runs its containers with least privilege: non-root, the runtime's default
seccomp profile, no privilege escalation, every capability dropped (the pod's securityContext or the
container's own, the container's winning, as the kubelet applies them)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

BASE = pathlib.Path(__file__).resolve().parents[2] / "deployments" / "k8s" / "base"


def deployments() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(BASE.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment":
                found.append((f"{path.relative_to(BASE)}:{doc['metadata']['name']}", doc))
    return found


def test_the_dispatcher_and_the_controller_are_both_shipped() -> None:
    assert {d["metadata"]["name"] for _, d in deployments()} >= {"tcab-dispatcher", "dispatch-controller"}


@pytest.mark.parametrize(("where", "doc"), deployments(), ids=[w for w, _ in deployments()])
def test_every_container_runs_with_least_privilege(where: str, doc: dict[str, Any]) -> None:
    pod = doc["spec"]["template"]["spec"]
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        own = container.get("securityContext") or {}
        effective = {**(pod.get("securityContext") or {}), **own}
        assert (effective.get("seccompProfile") or {}).get("type") == "RuntimeDefault", where
        assert effective.get("runAsNonRoot") is True, where
        assert own.get("allowPrivilegeEscalation") is False, where
        assert (own.get("capabilities") or {}).get("drop") == ["ALL"], where
        assert not (own.get("capabilities") or {}).get("add"), where
