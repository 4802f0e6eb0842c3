"""The controller's settings: one table, read from the environment and the
command line alike by the table machinery all three processes share
(toolkit.envtable).

Each setting is one row of `TABLE`: its variable (`DISPATCH_CONTROLLER_<FIELD>`),
its field, its CLI option (`--<field>`), its kind and bounds, its help.
`Settings.from_env` reads the rows, and `toolkit controller`
(controller/cli.py) builds its options from the same rows and hands their raw
text to `from_env`, which parses it by the same rows. So a value means the
same thing from either side, and a value refused on one side is refused on
the other with the same one line, naming the variable or the option and the
bound (`SettingsError`). The CLI never reads the environment itself (no click
`envvar=`): two readers with two rule books is what this module exists to
prevent. docs/adapter.md carries the table as `envtable.markdown` writes it.

Precedence: a CLI option > the environment (empty counts as unset) > the
default. renew_deadline and retry_period, unless set, follow the lease
duration, and the two bounds between the three are checked here. The
kubeconfig path, unset here, falls back to $KUBECONFIG; without it, to the
pod's ServiceAccount where KUBERNETES_SERVICE_HOST is set, else to
~/.kube/config (`kube.load`).

Pure: the standard library only, no Kubernetes I/O.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from toolkit import admission_checks, envtable, formats, names

CONTROLLER_NAME = admission_checks.CONTROLLER_NAME
ENV_PREFIX = "DISPATCH_CONTROLLER_"

_HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")

SettingsError = envtable.SettingsError


def _row(field: str, kind: envtable.Kind, help: str, *, default: Any = None, shown: str | None = None
         ) -> envtable.Setting:
    """A row of the table: the variable DISPATCH_CONTROLLER_<FIELD>, the option --<field>."""
    return envtable.Setting(ENV_PREFIX + field.upper(), field, kind, help, default=default, shown=shown,
                            option="--" + field.replace("_", "-"))


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return len(text) <= 253 and bool(_HOSTNAME.fullmatch(text))
    return True


# The controller's own kinds; the rest are the table machinery's (toolkit.envtable).
HOST = envtable.text("host", "an IP address or a host name", _is_host)
NAME = envtable.text("name", "text without whitespace, at most 253 characters",
                     lambda raw: len(raw) <= 253 and raw.isprintable() and not any(c.isspace() for c in raw))
DNS_SUBDOMAIN = envtable.text("dns-subdomain", "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', "
                              "at most 253)", formats.dns_subdomain)
_SECONDS = envtable.whole(1, 3600)
_PORT = envtable.whole(0, 65535)

# The table. Order is the CLI's --help order and the docs' (docs/adapter.md, "The controller's settings").
TABLE: tuple[envtable.Setting, ...] = (
    _row("kubeconfig", envtable.PATH, "Kubeconfig path",
         shown="`$KUBECONFIG`; without it, the pod's ServiceAccount where `KUBERNETES_SERVICE_HOST` is set, "
               "else `~/.kube/config`"),
    _row("context", NAME, "Kubeconfig context", shown="the kubeconfig's current context"),
    _row("namespace", envtable.DNS_LABEL, "Watch only this namespace", default="", shown="every namespace"),
    _row("controller_name", NAME, "AdmissionCheck spec.controllerName to serve", default=CONTROLLER_NAME),
    _row("leader_elect", envtable.BOOLEAN, "Campaign for the Lease before acting", default=True),
    _row("lease_name", DNS_SUBDOMAIN, "Name of the Lease", default="dispatch-controller"),
    _row("lease_namespace", envtable.DNS_LABEL, "Namespace of the Lease, and of the generation counter of "
         "TrainJobs made without a StartRequest: the controller's own", default=names.CONTROLLER_NAMESPACE),
    _row("lease_duration", envtable.whole(3, 3600), "Lease duration in seconds", default=15),
    _row("renew_deadline", _SECONDS, "Leader renew deadline in seconds: a leader whose last renewal started "
         "longer ago stops its work; less than the lease duration", shown="2/3 of the lease duration (10)"),
    _row("retry_period", _SECONDS, "Leader election retry period in seconds, also the longest a Lease call "
         "waits for its answer; 1.2 times it less than the renew deadline", shown="2, or 1 under a 6 s lease"),
    _row("health_port", _PORT, "Port of the probes /healthz and /readyz (plain HTTP); 0 picks one", default=8080),
    _row("health_host", HOST, "Address the probes bind to", default="0.0.0.0"),
    _row("metrics_port", _PORT, "Port of /metrics (HTTPS; a bearer token the apiserver authenticates and "
         "authorizes for get on /metrics); 0 picks one", default=8443),
    _row("metrics_host", HOST, "Address /metrics binds to", default="0.0.0.0"),
    _row("metrics_cert_dir", envtable.PATH, "Directory holding tls.crt and tls.key for /metrics",
         shown="a self-signed certificate made at start"),
    _row("max_connections", envtable.whole(4, 4096), "Most connections each of the two ports (probes, /metrics) "
         "holds at once; one more closes the oldest that has not sent its request yet, or is refused when "
         "every one has", default=64),
    _row("connection_seconds", envtable.whole(1, 300), "Longest a connection to either port lasts, TLS "
         "handshake, request and answer included; then it is closed", default=10),
    _row("token_reviews_per_minute", envtable.whole(1, 60000), "TokenReviews of bearer tokens /metrics has "
         "no decision for, per minute (a burst of a sixth of it); beyond it such a request gets 429 without "
         "a review. A token once allowed is reviewed again outside this budget", default=60),
    _row("workers", envtable.whole(1, 64), "Reconcile workers", default=4),
)
BY_FIELD = {spec.field: spec for spec in TABLE}
_DEFAULT: dict[str, Any] = {spec.field: spec.default for spec in TABLE}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The controller's settings, typed; the defaults are the table's."""

    kubeconfig: str | None = _DEFAULT["kubeconfig"]
    context: str | None = _DEFAULT["context"]
    namespace: str = _DEFAULT["namespace"]  # "" watches every namespace
    controller_name: str = _DEFAULT["controller_name"]
    leader_elect: bool = _DEFAULT["leader_elect"]
    lease_name: str = _DEFAULT["lease_name"]
    lease_namespace: str = _DEFAULT["lease_namespace"]
    lease_duration: int = _DEFAULT["lease_duration"]
    renew_deadline: int = 10  # derived from the lease duration (from_env): these two under the default one
    retry_period: int = 2
    health_port: int = _DEFAULT["health_port"]
    # Every interface, as a pod's probes need; a test or a laptop binds loopback.
    health_host: str = _DEFAULT["health_host"]
    metrics_port: int = _DEFAULT["metrics_port"]
    metrics_host: str = _DEFAULT["metrics_host"]
    metrics_cert_dir: str | None = _DEFAULT["metrics_cert_dir"]
    max_connections: int = _DEFAULT["max_connections"]
    connection_seconds: int = _DEFAULT["connection_seconds"]
    token_reviews_per_minute: int = _DEFAULT["token_reviews_per_minute"]
    workers: int = _DEFAULT["workers"]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: Any) -> Settings:
        """Precedence: `options` (the CLI's, raw text or typed; None is not
        given) > `env` (default os.environ; empty is unset) > defaults."""
        values: dict[str, Any] = envtable.read(TABLE, os.environ if env is None else env, options=options)
        lease = values["lease_duration"]
        # The client library's bounds: lease > renew > 1.2 x retry.
        if values["renew_deadline"] is None:
            values["renew_deadline"] = max(2, lease * 2 // 3)
        if values["retry_period"] is None:
            values["retry_period"] = 1 if lease < 6 else 2
        settings = cls(**values)

        def source(field: str) -> str:
            spec = BY_FIELD[field]
            return str(spec.option) if options.get(field) is not None else spec.name

        if settings.renew_deadline >= settings.lease_duration:
            raise SettingsError(
                f"{source('renew_deadline')}={settings.renew_deadline}: "
                f"must be less than the lease duration ({settings.lease_duration} s, {_both('lease_duration')})"
            )
        if settings.renew_deadline <= 1.2 * settings.retry_period:
            raise SettingsError(
                f"{source('retry_period')}={settings.retry_period}: "
                f"1.2 times it must be less than the renew deadline ({settings.renew_deadline} s, "
                f"{_both('renew_deadline')})"
            )
        return settings


def _both(field: str) -> str:
    spec = BY_FIELD[field]
    return f"{spec.name} or {spec.option}"


def env_var(field: str) -> str:
    return BY_FIELD[field].name
