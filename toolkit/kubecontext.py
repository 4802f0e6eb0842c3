"""Which namespace a command means when none is given: kubectl's rule.

The order, first answer wins:
1. `-n/--namespace` (or its environment twin `DISPATCH_NAMESPACE`);
2. the `namespace` of the kubeconfig context in use (`--context`, else the
   current context), from the same kubeconfig the client loads (`--kubeconfig`,
   else `$KUBECONFIG`, which may list several files, else ~/.kube/config);
3. in a pod without a kubeconfig, the pod's own namespace (the
   ServiceAccount's `namespace` file), as `toolkit.clusterconfig.load` then
   uses the pod's credentials;
4. `default`.

A kubeconfig that cannot be read gives `default` here: loading the client
from it fails next, with the one-line error that names the file.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT = "default"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def context_namespace(contexts: list[dict[str, Any]], current: dict[str, Any] | None,
                      context: str | None) -> str | None:
    """Pure: the namespace of the named context (or the current one), if it sets one."""
    chosen = current if context is None else next((c for c in contexts if c.get("name") == context), None)
    value = ((chosen or {}).get("context") or {}).get("namespace")
    return str(value) if value else None


def namespace(*, given: str | None, kubeconfig: str | None, context: str | None) -> str:
    """The namespace a command acts in (see the module docstring)."""
    if given:
        return given
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        from kubernetes.config import kube_config  # the client's own reader (merges KUBECONFIG's list)

        try:
            contexts, current = kube_config.list_kube_config_contexts(
                config_file=path or os.path.expanduser("~/.kube/config"))
        except Exception:  # noqa: BLE001 - any unreadable kubeconfig: the client load reports it
            return DEFAULT
        return context_namespace(contexts, current, context) or DEFAULT
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            return f.read().strip() or DEFAULT
    except OSError:
        return DEFAULT
