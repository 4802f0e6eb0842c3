"""The controller's settings: one table, one parser, for the environment and
the CLI alike.

Each setting is one row of `TABLE`: its field, its environment variable
(`DISPATCH_CONTROLLER_<FIELD>`), its CLI option, its type and bounds, its
help. `Settings.from_env` reads the environment through `parse`, and
`toolkit controller` (controller/cli.py) builds its options from the
same rows and hands their raw text to `from_env`, which parses it with the
same `parse`. So a value means the same thing from either side, and a value
refused on one side is refused on the other with the same one line, naming
the variable or the option and the bound (`SettingsError`). The CLI never
reads the environment itself (no click `envvar=`): two readers with two
rule books is what this module exists to prevent.

Precedence: a CLI option > the environment (empty counts as unset) > the
default. renew_deadline and retry_period, unless set, follow the lease
duration. The kubeconfig path, unset here, falls back to $KUBECONFIG; without
it, to the pod's ServiceAccount where KUBERNETES_SERVICE_HOST is set, else to
~/.kube/config (`kube.load`).

Pure: the standard library only, no Kubernetes I/O. The whole-number and
boolean readings are the ones all three processes share (toolkit.envparse).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from toolkit import admission_checks, envparse, formats

CONTROLLER_NAME = admission_checks.CONTROLLER_NAME
ENV_PREFIX = "DISPATCH_CONTROLLER_"

_HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")


class SettingsError(ValueError):
    """A setting the controller cannot run with: one line naming it and the bound."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One setting. `kind`: int (whole number within `bounds`), bool,
    dns-label, dns-subdomain, host (an IP address or a host name), name (any
    text without whitespace, at most 253 characters) or path (any text)."""

    field: str
    kind: str
    default: Any
    help: str
    bounds: tuple[int, int] | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.field.upper()

    @property
    def option(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def help_text(self) -> str:
        """The option's help: what it is, its variable, bounds and default."""
        parts = [f"env {self.env}"]
        if self.bounds:
            parts.append(f"{self.bounds[0]} to {self.bounds[1]}")
        if self.default not in (None, ""):
            parts.append(f"default {str(self.default).lower() if self.kind == 'bool' else self.default}")
        return f"{self.help} ({'; '.join(parts)})."

    @property
    def expected(self) -> str:
        if self.kind == "int":
            assert self.bounds is not None
            return f"expected a whole number from {self.bounds[0]} to {self.bounds[1]}"
        return {
            "bool": "expected true or false",
            "dns-label": "expected a DNS-1123 label (lowercase letters, digits and '-', at most 63)",
            "dns-subdomain": "expected a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)",
            "host": "expected an IP address or a host name",
            "name": "expected text without whitespace, at most 253 characters",
            "path": "expected a path",
        }[self.kind]


# The table. Order is the CLI's --help order.
TABLE: tuple[Spec, ...] = (
    Spec("kubeconfig", "path", None, "Kubeconfig path (unset: $KUBECONFIG; without it, the pod's ServiceAccount "
         "where KUBERNETES_SERVICE_HOST is set, else ~/.kube/config)"),
    Spec("context", "name", None, "Kubeconfig context (unset: the kubeconfig's current one)"),
    Spec("namespace", "dns-label", "", "Watch only this namespace (unset: every namespace)"),
    Spec("controller_name", "name", CONTROLLER_NAME, "AdmissionCheck spec.controllerName to serve"),
    Spec("leader_elect", "bool", True, "Campaign for the Lease before acting"),
    Spec("lease_name", "dns-subdomain", "dispatch-controller", "Name of the Lease"),
    Spec("lease_namespace", "dns-label", "dispatch-system", "Namespace of the Lease"),
    Spec("lease_duration", "int", 15, "Lease duration in seconds", (3, 3600)),
    Spec("renew_deadline", "int", None, "Leader renew deadline in seconds: a leader whose last renewal started "
         "longer ago stops its work (unset: 2/3 of the lease duration)", (1, 3600)),
    Spec("retry_period", "int", None, "Leader election retry period in seconds, also the longest a Lease call "
         "waits for its answer (at most half the renew deadline; unset: 2, or 1 under a 6 s lease)", (1, 3600)),
    Spec("health_port", "int", 8080, "Port of the probes /healthz and /readyz (plain HTTP); 0 picks one",
         (0, 65535)),
    Spec("health_host", "host", "0.0.0.0", "Address the probes bind to"),
    Spec("metrics_port", "int", 8443, "Port of /metrics (HTTPS; a bearer token the apiserver authenticates and "
         "authorizes for get on /metrics); 0 picks one", (0, 65535)),
    Spec("metrics_host", "host", "0.0.0.0", "Address /metrics binds to"),
    Spec("metrics_cert_dir", "path", None, "Directory holding tls.crt and tls.key for /metrics "
         "(unset: a self-signed certificate made at start)"),
    Spec("workers", "int", 4, "Reconcile workers", (1, 64)),
)
BY_FIELD = {spec.field: spec for spec in TABLE}


def parse(spec: Spec, raw: str, *, source: str) -> Any:
    """`raw` as the setting's type, or SettingsError naming `source` (the
    variable or the option) and the bound."""
    text = raw.strip()
    if spec.kind == "int":
        assert spec.bounds is not None
        low, high = spec.bounds
        try:
            return envparse.whole(text, low=low, high=high)
        except envparse.Malformed:
            raise SettingsError(f"{source}={raw!r}: {spec.expected}") from None
        except envparse.OutOfRange as e:
            raise SettingsError(f"{source}={e.value}: {spec.expected}") from None
    if spec.kind == "bool":
        try:
            return envparse.boolean(text.lower())
        except envparse.Malformed:
            raise SettingsError(f"{source}={raw!r}: {spec.expected}") from None
    ok = {
        "dns-label": lambda: formats.dns_label(raw),
        "dns-subdomain": lambda: formats.dns_subdomain(raw),
        "host": lambda: _is_ip(raw) or (len(raw) <= 253 and bool(_HOSTNAME.fullmatch(raw))),
        "name": lambda: len(raw) <= 253 and raw.isprintable() and not any(c.isspace() for c in raw),
        "path": lambda: "\0" not in raw,
    }[spec.kind]()
    if not ok:
        raise SettingsError(f"{source}={raw!r}: {spec.expected}")
    return raw


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check(spec: Spec, value: Any, *, source: str) -> Any:
    """A typed value given by a caller (not text): held to the same bounds."""
    if isinstance(value, str):
        return parse(spec, value, source=source)
    if spec.kind == "bool" and isinstance(value, bool):
        return value
    if spec.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return parse(spec, str(value), source=source)
    raise SettingsError(f"{source}={value!r}: {spec.expected}")


@dataclasses.dataclass(frozen=True)
class Settings:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str = ""  # "" watches every namespace
    controller_name: str = CONTROLLER_NAME
    leader_elect: bool = True
    lease_name: str = "dispatch-controller"
    lease_namespace: str = "dispatch-system"
    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2
    health_port: int = 8080
    # Every interface, as a pod's probes need; a test or a laptop binds loopback.
    health_host: str = "0.0.0.0"
    metrics_port: int = 8443
    metrics_host: str = "0.0.0.0"
    metrics_cert_dir: str | None = None
    workers: int = 4

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: Any) -> Settings:
        """Precedence: `options` (the CLI's, raw text or typed; None is not
        given) > `env` (default os.environ; empty is unset) > defaults."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        unknown = set(options) - set(BY_FIELD)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        for spec in TABLE:
            given = options.get(spec.field)
            raw = env.get(spec.env)
            if given is not None:
                values[spec.field] = check(spec, given, source=spec.option)
                sources[spec.field] = spec.option
            elif raw is not None and raw != "":
                values[spec.field] = parse(spec, raw, source=spec.env)
                sources[spec.field] = spec.env
        lease = values.get("lease_duration", cls.lease_duration)
        # The client library's bounds: lease > renew > 1.2 x retry.
        values.setdefault("renew_deadline", max(2, lease * 2 // 3))
        values.setdefault("retry_period", 1 if lease < 6 else 2)
        settings = cls(**values)
        if settings.renew_deadline >= settings.lease_duration:
            raise SettingsError(
                f"{sources.get('renew_deadline', BY_FIELD['renew_deadline'].env)}={settings.renew_deadline}: "
                f"must be less than the lease duration ({settings.lease_duration} s, {_both('lease_duration')})"
            )
        if settings.renew_deadline <= 1.2 * settings.retry_period:
            raise SettingsError(
                f"{sources.get('retry_period', BY_FIELD['retry_period'].env)}={settings.retry_period}: "
                f"1.2 times it must be less than the renew deadline ({settings.renew_deadline} s, "
                f"{_both('renew_deadline')})"
            )
        return settings


def _both(field: str) -> str:
    spec = BY_FIELD[field]
    return f"{spec.env} or {spec.option}"


def env_var(field: str) -> str:
    return BY_FIELD[field].env
