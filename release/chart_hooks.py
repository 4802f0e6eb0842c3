"""The chart's one hook, which the manifests have no counterpart of: the uninstall guard.

`helm uninstall` runs it before it deletes anything (`helm.sh/hook: pre-delete`): a Job of the
controller's image running `python -m controller.uninstall_guard`, which fails while a ClusterQueue
still lists our AdmissionCheck or a Workload still carries it, so that an uninstall never leaves
queues waiting for ever on a check nobody answers (docs/install.md, "Uninstalling"). It reads, and
changes nothing; its ServiceAccount and read-only ClusterRole are hooks too, made before the Job
(a lower weight) and deleted with it once it succeeds. A Job that failed stays, with its log, until
the next `helm uninstall` replaces it.

The objects are made here from the controller's Deployment of the release (its image, its pod's
and container's securityContext), so release/chart.py templates them as it templates the others.
"""

from __future__ import annotations

import copy
from typing import Any

NAME = "dispatch-uninstall-guard"
COMMAND = ["/usr/bin/python3.11", "-S", "-E", "-B", "-m", "controller.uninstall_guard"]
KUEUE_GROUP = "kueue.x-k8s.io"


def _hook(weight: int) -> dict[str, str]:
    return {"helm.sh/hook": "pre-delete", "helm.sh/hook-weight": str(weight),
            "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}


def uninstall_guard(deployment: dict[str, Any], container: dict[str, Any]) -> list[dict[str, Any]]:
    """The guard's ServiceAccount, ClusterRole, ClusterRoleBinding and Job, beside DEPLOYMENT (the
    controller's, whose CONTAINER runs the controller image)."""
    namespace = deployment["metadata"]["namespace"]
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "uninstall-guard",
              "app.kubernetes.io/part-of": "dispatch-k8s"}

    def meta(weight: int, *, namespaced: bool = True) -> dict[str, Any]:
        return {"name": NAME, **({"namespace": namespace} if namespaced else {}), "labels": dict(labels),
                "annotations": _hook(weight)}

    pod = deployment["spec"]["template"]["spec"]
    guard = {"name": "guard", "image": container["image"], "command": COMMAND,
             "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
             "securityContext": copy.deepcopy(container.get("securityContext") or {})}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(-10)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(-10, namespaced=False),
         "rules": [{"apiGroups": [KUEUE_GROUP], "resources": ["admissionchecks", "clusterqueues", "workloads"],
                    "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": meta(-10, namespaced=False),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(0),
         "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 120,
                  "template": {"metadata": {"labels": dict(labels)},
                               "spec": {"serviceAccountName": NAME, "restartPolicy": "Never",
                                        "securityContext": copy.deepcopy(pod.get("securityContext") or {}),
                                        "containers": [guard]}}}},
    ]
