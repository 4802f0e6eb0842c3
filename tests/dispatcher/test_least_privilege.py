"""The driver Job's pod and the rendered sidecar run with least privilege; the driver's security
settings are read and refused like every other setting.

The judge of least privilege is the apiserver: the driver's pod and a pod with the rendered sidecar are
admitted in a namespace that enforces the restricted Pod Security Standard, where the same pods loosened
are refused (tests/podsecurity.py). The pure tests pin how each setting reaches the pod."""

from __future__ import annotations

import kubernetes.client
import pytest

from dispatcher import backend, jobspec, settings
from tests import podsecurity
from toolkit import render

REQUIRED = {"TCAB_BACKEND_URL": "http://backend:8080", "TCAB_BACKEND_SERVICE_TOKEN": "svc-token-0123",
            "TCAB_DISPATCHER_DRIVER_IMAGE": "driver:1"}
CLAIM = backend.Claim(job_id="7f3a", token="tok-123", launch_request={})


def driver(env: dict[str, str]) -> tuple[dict[str, object], dict[str, object]]:
    pod = jobspec.job(CLAIM, settings.from_env({**REQUIRED, **env}))["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_the_driver_runs_non_root_without_privilege_under_the_runtime_default_seccomp_by_default() -> None:
    pod, container = driver({})
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True}
    assert "serviceAccountName" not in pod  # the namespace's default


def test_the_driver_s_user_root_permission_and_service_account_come_from_the_settings() -> None:
    pod, container = driver({"TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT": "false",
                             "TCAB_DISPATCHER_DRIVER_RUN_AS_USER": "1000",
                             "TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP": "1001",
                             "TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT": "tcab-driver"})
    assert container["securityContext"]["runAsNonRoot"] is False
    assert container["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["runAsGroup"] == 1001
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # never loosened by a setting
    assert pod["serviceAccountName"] == "tcab-driver"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT", "yes",
     "TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT='yes': expected true or false"),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_USER", "0",
     "TCAB_DISPATCHER_DRIVER_RUN_AS_USER=0: expected a whole number from 1 to 2147483647"),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_USER", "root",
     "TCAB_DISPATCHER_DRIVER_RUN_AS_USER='root': expected a whole number from 1 to 2147483647"),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP", "0",
     "TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP=0: expected a whole number from 1 to 2147483647"),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP", "wheel",
     "TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP='wheel': expected a whole number from 1 to 2147483647"),
    ("TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT", "Driver SA",
     "TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT='Driver SA': expected a DNS-1123 label "
     "(lowercase letters, digits and '-', at most 63)"),
])
def test_a_bad_driver_security_setting_is_one_line_naming_the_variable_and_the_bound(
        name: str, value: str, message: str) -> None:
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env({**REQUIRED, name: value})
    assert str(e.value) == message


def test_the_rendered_sidecar_runs_non_root_under_the_runtime_default_seccomp() -> None:
    context = render.sidecar_container(image="img:1")["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert (context["allowPrivilegeEscalation"], context["capabilities"]) == (False, {"drop": ["ALL"]})


def test_the_driver_s_pod_is_admitted_under_the_restricted_pod_security_standard_unless_allowed_root(
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    podsecurity.restricted(api_client, namespace, service_accounts=("tcab-driver",))
    pod, _ = driver({"TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT": "tcab-driver"})
    assert podsecurity.admit(api_client, namespace, pod) is None
    refusal = podsecurity.admit(api_client, namespace, podsecurity.loosened(pod))
    assert refusal is not None and "allowPrivilegeEscalation" in refusal, "the restricted level is enforced"
    as_root, _ = driver({"TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT": "false"})
    refusal = podsecurity.admit(api_client, namespace, as_root)
    assert refusal is not None and "runAsNonRoot" in refusal, "the one setting that loosens it, and only by its name"


def test_a_pod_with_the_rendered_sidecar_is_admitted_under_the_restricted_pod_security_standard(
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    podsecurity.restricted(api_client, namespace)
    trainer = {"name": "node", "image": "trainer:1", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"}}}
    sidecar = render.sidecar_container(image="img:1")
    pod = {"initContainers": [sidecar], "containers": [trainer],
           "volumes": [render.podinfo_volume(), render.sidecar_state_volume(), render.sidecar_token_volume()]}
    assert podsecurity.admit(api_client, namespace, pod) is None
    loose = {**pod, "initContainers": [{**sidecar, "securityContext": {**sidecar["securityContext"],
                                                                       "capabilities": {}}}]}
    refusal = podsecurity.admit(api_client, namespace, loose)
    assert refusal is not None and "dispatch-sidecar" in refusal, "the sidecar's own context is what admits it"
