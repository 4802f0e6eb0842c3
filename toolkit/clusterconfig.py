"""A client for the cluster a process or a command means: the kubeconfig given, else $KUBECONFIG,
else (no path at all) the pod's ServiceAccount where KUBERNETES_SERVICE_HOST is set, and
~/.kube/config elsewhere.

The order is kubectl's, and `toolkit.kubecontext` reads the namespace by the same one, so a
command's cluster and its default namespace come from the same file. The configuration library
raises several unrelated types for one user mistake (a missing file, a context that is not
there, a malformed YAML); they all come out of here as one `ConfigError` whose message names
where it looked, so a command answers with one line and a daemon refuses to start with it.
What it returns is a `toolkit.kube.Client`, over the configuration's own TLS, proxy and
credential settings.
"""

from __future__ import annotations

import os

import kubernetes.client
import kubernetes.config

from toolkit import kube


class ConfigError(Exception):
    """No usable cluster configuration (kubeconfig or in-cluster)."""


def load(*, kubeconfig: str | None = None, context: str | None = None, pool_size: int = 32,
         retries: int = 5) -> kube.Client:
    """A client from the kubeconfig path given, else $KUBECONFIG, else (no
    path at all) the pod's ServiceAccount where KUBERNETES_SERVICE_HOST is set
    and ~/.kube/config elsewhere; `pool_size` connections (one per worker and
    watch the caller runs)."""
    configuration = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        if path or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration
            )
        else:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
    except (kubernetes.config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        # The config library raises several unrelated types for one user mistake.
        where = path or ("in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else "~/.kube/config")
        raise ConfigError(f"cannot load a cluster config from {where}: {exc}") from None
    configuration.connection_pool_maxsize = pool_size
    return kube.Client(kubernetes.client.ApiClient(configuration), retries=retries)
