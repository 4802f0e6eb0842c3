"""RBAC is enforced: a service account bound to a narrow Role gets 403 outside it."""

from __future__ import annotations

import time

import kubernetes.client
import kubernetes.config
import pytest

from devcluster import harness

pytestmark = pytest.mark.cluster


def test_service_account_with_narrow_role_is_forbidden_outside_it(
        control_plane: harness.ControlPlane | harness.ExistingCluster,
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "read-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    })
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    })
    kubeconfig = control_plane.mint_kubeconfig(namespace=namespace, service_account="reader")

    with kubernetes.config.new_client_from_config(config_file=kubeconfig) as client:
        core = kubernetes.client.CoreV1Api(client)
        # The authorizer reads RBAC from an informer: allow it to catch up.
        deadline = time.monotonic() + 15
        while True:
            try:
                core.list_namespaced_config_map(namespace)
                break
            except kubernetes.client.ApiException as e:
                if e.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        forbidden = {
            "another resource": lambda: core.list_namespaced_secret(namespace),
            "another verb": lambda: core.create_namespaced_config_map(namespace, {"metadata": {"name": "x"}}),
            "another namespace": lambda: core.list_namespaced_config_map("default"),
        }
        for what, call in forbidden.items():
            with pytest.raises(kubernetes.client.ApiException) as caught:
                call()
            assert caught.value.status == 403, what
            assert f"system:serviceaccount:{namespace}:reader" in caught.value.body, what
