"""The driver Job's pod and the rendered sidecar run with least privilege (pure: the rendered dicts);
the driver's security settings are read and refused like every other setting."""

from __future__ import annotations

import pytest

from dispatcher import backend, jobspec, settings
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
                             "TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT": "tcab-driver"})
    assert container["securityContext"]["runAsNonRoot"] is False
    assert container["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # never loosened by a setting
    assert pod["serviceAccountName"] == "tcab-driver"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT", "yes", "TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT='yes' is not true or false"),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_USER", "0", "TCAB_DISPATCHER_DRIVER_RUN_AS_USER=0 is outside 1..2147483647"),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_USER", "root",
     "TCAB_DISPATCHER_DRIVER_RUN_AS_USER='root' is not an integer in 1..2147483647"),
    ("TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT", "Driver SA",
     "TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT='Driver SA' is not a DNS label (lowercase, digits, '-', at most 63)"),
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
