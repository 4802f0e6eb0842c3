"""Settings come from the environment only: defaults, precedence, refusals."""

from __future__ import annotations

import pytest

from sidecar import settings

IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
TRIO = {"DISPATCH_SIDECAR_API_SERVER": "https://127.0.0.1:6443", "DISPATCH_SIDECAR_TOKEN_FILE": "/t",
        "DISPATCH_SIDECAR_CA_FILE": "/c"}


def test_defaults_in_a_pod() -> None:
    s = settings.from_env(IN_CLUSTER)
    assert s == settings.Settings(endpoint=settings.Endpoint(
        host="10.96.0.1", port=443, token_file="/var/run/secrets/kubernetes.io/serviceaccount/token",
        ca_file="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", source="in-cluster"))
    assert (s.podinfo_dir, s.interval_seconds, s.timeout_seconds) == ("/etc/dispatch/podinfo", 300.0, 5.0)
    assert (s.backoff_base_seconds, s.backoff_max_seconds, s.max_checks) == (1.0, 60.0, 0)


def test_the_explicit_trio_wins_over_in_cluster() -> None:
    e = settings.from_env({**IN_CLUSTER, **TRIO}).endpoint
    assert (e.host, e.port, e.token_file, e.ca_file, e.source) == ("127.0.0.1", 6443, "/t", "/c", "env")


@pytest.mark.parametrize(("server", "host", "port"), [
    ("https://api.example", "api.example", 443),
    ("https://[::1]:6443", "::1", 6443),
    ("https://[fd00::1]", "fd00::1", 443),
    ("https://h:1/", "h", 1),
])
def test_server_forms(server: str, host: str, port: int) -> None:
    e = settings.from_env({**TRIO, "DISPATCH_SIDECAR_API_SERVER": server}).endpoint
    assert (e.host, e.port) == (host, port)


def test_ipv6_service_host() -> None:
    e = settings.from_env({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}).endpoint
    assert (e.host, e.port) == ("fd00::1", 6443)


def test_every_setting_is_read() -> None:
    s = settings.from_env({**IN_CLUSTER, "DISPATCH_SIDECAR_PODINFO_DIR": "/p",
                           "DISPATCH_SIDECAR_INTERVAL_SECONDS": "30", "DISPATCH_SIDECAR_TIMEOUT_SECONDS": "2.5",
                           "DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS": "0.5",
                           "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS": "10", "DISPATCH_SIDECAR_MAX_CHECKS": "3"})
    assert (s.podinfo_dir, s.interval_seconds, s.timeout_seconds, s.backoff_base_seconds,
            s.backoff_max_seconds, s.max_checks) == ("/p", 30.0, 2.5, 0.5, 10.0, 3)


def test_empty_means_default() -> None:
    assert settings.from_env({**IN_CLUSTER, "DISPATCH_SIDECAR_INTERVAL_SECONDS": ""}).interval_seconds == 300.0


@pytest.mark.parametrize(("env", "names"), [
    ({}, "KUBERNETES_SERVICE_HOST"),
    ({**IN_CLUSTER, "KUBERNETES_SERVICE_PORT": "http"}, "KUBERNETES_SERVICE_PORT"),
    ({"DISPATCH_SIDECAR_API_SERVER": "https://h"}, "DISPATCH_SIDECAR_TOKEN_FILE, DISPATCH_SIDECAR_CA_FILE"),
    ({**TRIO, "DISPATCH_SIDECAR_API_SERVER": "http://h"}, "DISPATCH_SIDECAR_API_SERVER"),
    ({**TRIO, "DISPATCH_SIDECAR_API_SERVER": "https://h/api"}, "DISPATCH_SIDECAR_API_SERVER"),
    ({**TRIO, "DISPATCH_SIDECAR_API_SERVER": "https://h:70000"}, "DISPATCH_SIDECAR_API_SERVER"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_INTERVAL_SECONDS": "0"}, "DISPATCH_SIDECAR_INTERVAL_SECONDS"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_INTERVAL_SECONDS": "nan"}, "DISPATCH_SIDECAR_INTERVAL_SECONDS"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_INTERVAL_SECONDS": "5m"}, "DISPATCH_SIDECAR_INTERVAL_SECONDS"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_TIMEOUT_SECONDS": "-1"}, "DISPATCH_SIDECAR_TIMEOUT_SECONDS"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_BACKOFF_BASE_SECONDS": "10",
      "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS": "5"}, "DISPATCH_SIDECAR_BACKOFF_MAX_SECONDS"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_MAX_CHECKS": "-1"}, "DISPATCH_SIDECAR_MAX_CHECKS"),
    ({**IN_CLUSTER, "DISPATCH_SIDECAR_MAX_CHECKS": "１"}, "DISPATCH_SIDECAR_MAX_CHECKS"),
])
def test_bad_values_are_one_line_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(settings.SettingsError) as raised:
        settings.from_env(env)
    assert str(raised.value).startswith(names)
    assert "\n" not in str(raised.value)
