"""The apiserver as the judge of least privilege: Pod Security Admission at the `restricted` level.

`restricted(api, namespace)` labels a namespace so the apiserver enforces the restricted Pod Security
Standard there (non-root, no privilege escalation, every capability dropped, the RuntimeDefault or a
Localhost seccomp profile, only the safe volume types). `admit` sends a pod with `dryRun=All` (admission
runs, nothing is stored) and answers the apiserver's refusal, or None when it admitted the pod.
`loosened` is the same pod with one container's `allowPrivilegeEscalation` taken away: a test admits
the pod under test and sees the loosened one refused, so it proves the level is enforced in the
namespace, not merely that nothing refused.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes.client

Obj = dict[str, Any]


def restricted(api: kubernetes.client.ApiClient, namespace: str, *, service_accounts: tuple[str, ...] = ()) -> None:
    """Enforce the restricted level in `namespace`, and make the ServiceAccounts the pods name."""
    core = kubernetes.client.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}})
    for name in service_accounts:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})


def admit(api: kubernetes.client.ApiClient, namespace: str, pod_spec: Obj, *, name: str = "least-privilege") -> str | None:
    """None when the apiserver admits a pod of `pod_spec` (dry run), else its refusal's message."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}
    try:
        kubernetes.client.CoreV1Api(api).create_namespaced_pod(namespace, body, dry_run="All")
    except kubernetes.client.ApiException as e:
        if e.status != 403:
            raise
        return str(json.loads(e.body).get("message", e.body))
    return None


def loosened(pod_spec: Obj) -> Obj:
    """`pod_spec` with its first container allowed to escalate privileges."""
    loose = copy.deepcopy(pod_spec)
    loose["containers"][0].setdefault("securityContext", {})["allowPrivilegeEscalation"] = True
    return loose
