"""The sidecar's settings: read from the environment in one place, typed, with
named defaults. Each variable is a row of `TABLE`, read by the table
machinery all three processes share (toolkit.envtable); docs/sidecar.md
carries the table as `envtable.markdown` writes it.

Precedence: the variable (empty counts as unset) > the default. For the API
endpoint and credentials, first match wins:
  1. DISPATCH_SIDECAR_API_SERVER + _TOKEN_FILE + _CA_FILE, all three or none
     (tests, and clusters that mount the token somewhere else);
  2. in-cluster: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT and the
     service-account files under /var/run/secrets/kubernetes.io/serviceaccount.
There is deliberately no kubeconfig reader: a kubeconfig is YAML, and a YAML
parser is a dependency and an import the sidecar would pay for in every pod.
The explicit trio is what a token kubeconfig holds (server, CA, bearer token).
The in-cluster pair is read only when the trio is unset.

A bad value is refused with one line naming the variable and the bound
(`SettingsError`), never a traceback; `main` prints it and exits 2.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping

from toolkit import envparse, envtable, names

ENV_PREFIX = "DISPATCH_SIDECAR_"
SERVICE_ACCOUNT_DIR = names.SERVICE_ACCOUNT_DIR

SettingsError = envtable.SettingsError


_PORT = envtable.whole(1, 65535)


def _server(raw: str) -> tuple[str, int]:
    """https://HOST[:PORT] with no path; HOST may be a bracketed IPv6 address."""
    rest = raw.removeprefix("https://")
    if rest == raw or not rest or "/" in rest.rstrip("/"):
        raise envtable.Invalid()
    rest = rest.rstrip("/")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.removeprefix(":")
    elif rest.count(":") == 1:
        host, _, port = rest.partition(":")
    else:
        host, port = rest, ""
    try:
        number: int = _PORT.parse(port) if port else 443
    except envtable.Invalid:
        host = ""
    if not host:
        raise envtable.Invalid("expected https://HOST[:PORT], PORT from 1 to 65535")
    return host, number


SERVER = envtable.Kind("server", "https://HOST[:PORT] with no path", _server)


def _row(name: str, field: str, kind: envtable.Kind, help: str, *, default: object, shown: str | None = None
         ) -> envtable.Setting:
    return envtable.Setting(ENV_PREFIX + name, field, kind, help, default=default, shown=shown)


# The fields of `Settings`, then the endpoint's (`endpoint`), in the docs' order (docs/sidecar.md, "Settings").
SETTINGS = (
    _row("PODINFO_DIR", "podinfo_dir", envtable.PATH, "The Downward API volume.", default="/etc/dispatch/podinfo"),
    _row("INTERVAL_SECONDS", "interval_seconds", envtable.seconds(0.01, 86400), "Between successful checks.",
         default=300.0),
    _row("TIMEOUT_SECONDS", "timeout_seconds", envtable.seconds(0.01, 600), "Per request.", default=5.0),
    _row("BACKOFF_BASE_SECONDS", "backoff_base_seconds", envtable.seconds(0.01, 3600),
         "First retry after a failed check (the upper half jittered).", default=1.0),
    _row("BACKOFF_MAX_SECONDS", "backoff_max_seconds", envtable.seconds(0.01, 86400),
         "The backoff cap; at least the base.", default=60.0),
    _row("MAX_CHECKS", "max_checks", envtable.whole(0, 10**9),
         "Tests and bench only: exit 0 after this many verdicts; 0 = never.", default=0),
    _row("STARTED_FILE", "started_file", envtable.PATH,
         "Written once the first check has run, whatever its outcome: the pod's startupProbe waits for it "
         "(toolkit/render.py), so the trainer starts after that check.", default="", shown="none"),
)
ENDPOINT = (
    _row("API_SERVER", "api_server", SERVER, "The apiserver; with _TOKEN_FILE and _CA_FILE, all three or none.",
         default=""),
    _row("TOKEN_FILE", "token_file", envtable.PATH, "A bearer-token file, re-read at every check (projected "
         "tokens rotate).", default=""),
    _row("CA_FILE", "ca_file", envtable.PATH, "The apiserver's CA file.", default=""),
    envtable.Setting("KUBERNETES_SERVICE_HOST", "host", envtable.TEXT,
                     "The apiserver inside the cluster, used with the ServiceAccount's token and ca.crt "
                     "(/var/run/secrets/kubernetes.io/serviceaccount) when the trio is unset.",
                     default="", shown="set by the kubelet"),
    envtable.Setting("KUBERNETES_SERVICE_PORT", "port", _PORT, "Its port.", default=443),
)
TABLE = SETTINGS + ENDPOINT
_DEFAULT = {s.field: s.default for s in SETTINGS}


# Named tuples, not dataclasses: dataclasses imports inspect (ast, dis, tokenize...), ~1.7 MB of
# RSS in every pod (bench/sidecar).
class Endpoint(collections.namedtuple("Endpoint", "host port token_file ca_file source")):
    """Where the apiserver is and how to authenticate: a bearer token file
    (re-read before every check, since projected tokens rotate) and a CA file."""

    __slots__ = ()
    host: str
    port: int
    token_file: str
    ca_file: str
    source: str  # "env" or "in-cluster", for the start log line


class Settings(collections.namedtuple("Settings", ["endpoint", *_DEFAULT], defaults=tuple(_DEFAULT.values()))):
    """The sidecar's settings, typed; the defaults are the table's."""

    __slots__ = ()
    endpoint: Endpoint
    podinfo_dir: str
    interval_seconds: float
    timeout_seconds: float
    backoff_base_seconds: float
    backoff_max_seconds: float
    max_checks: int  # test and bench only: stop after this many verdicts (0: never)
    started_file: str  # "" for none


def endpoint(env: Mapping[str, str]) -> Endpoint:
    trio = ENDPOINT[:3]
    if any(envparse.get(env, s.name) is not None for s in trio):
        missing = ", ".join(s.name for s in trio if envparse.get(env, s.name) is None)
        if missing:
            raise SettingsError(f"{missing}: must be set too when any of {ENV_PREFIX}API_SERVER, "
                                "_TOKEN_FILE, _CA_FILE is set")
        (host, port), token_file, ca_file = (envtable.value(s, env) for s in trio)
        return Endpoint(host=host, port=port, token_file=token_file, ca_file=ca_file, source="env")
    host, port = (envtable.value(s, env) for s in ENDPOINT[3:])
    if not host:
        raise SettingsError("KUBERNETES_SERVICE_HOST: not set (not in a pod?); "
                            f"set {ENV_PREFIX}API_SERVER, _TOKEN_FILE and _CA_FILE instead")
    return Endpoint(host=host, port=port, token_file=f"{SERVICE_ACCOUNT_DIR}/token",
                    ca_file=f"{SERVICE_ACCOUNT_DIR}/ca.crt", source="in-cluster")


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    values = envtable.read(SETTINGS, env)
    base, ceiling = values["backoff_base_seconds"], values["backoff_max_seconds"]
    if ceiling < base:
        raise SettingsError(f"{ENV_PREFIX}BACKOFF_MAX_SECONDS={ceiling:g}: must be at least "
                            f"{ENV_PREFIX}BACKOFF_BASE_SECONDS={base:g}")
    return Settings(endpoint=endpoint(env), **values)
