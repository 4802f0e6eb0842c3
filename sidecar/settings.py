"""The sidecar's settings: read from the environment in one place, typed, with
named defaults (the table in docs/sidecar.md is this module in prose).

Precedence for the API endpoint and credentials, first match wins:
  1. DISPATCH_SIDECAR_API_SERVER + _TOKEN_FILE + _CA_FILE, all three or none
     (tests, and clusters that mount the token somewhere else);
  2. in-cluster: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT and the
     service-account files under /var/run/secrets/kubernetes.io/serviceaccount.
There is deliberately no kubeconfig reader: a kubeconfig is YAML, and a YAML
parser is a dependency and an import the sidecar would pay for in every pod.
The explicit trio is what a token kubeconfig holds (server, CA, bearer token).

A bad value is refused with one line naming the variable and the bound
(`SettingsError`), never a traceback; `main` prints it and exits 2. The
values are read by the parsers all three processes share (toolkit.envparse);
the error texts are the sidecar's own.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping

from toolkit import envparse, names

ENV_PREFIX = "DISPATCH_SIDECAR_"
SERVICE_ACCOUNT_DIR = names.SERVICE_ACCOUNT_DIR

DEFAULT_PODINFO_DIR = "/etc/dispatch/podinfo"
DEFAULT_INTERVAL_SECONDS = 300.0
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_MAX_SECONDS = 60.0
DEFAULT_MAX_CHECKS = 0  # 0: run until SIGTERM


class SettingsError(ValueError):
    """One line naming the variable and what it must be."""


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


class Settings(collections.namedtuple(
        "Settings", "endpoint podinfo_dir interval_seconds timeout_seconds backoff_base_seconds backoff_max_seconds"
                    " max_checks started_file",
        defaults=(DEFAULT_PODINFO_DIR, DEFAULT_INTERVAL_SECONDS, DEFAULT_TIMEOUT_SECONDS, DEFAULT_BACKOFF_BASE_SECONDS,
                  DEFAULT_BACKOFF_MAX_SECONDS, DEFAULT_MAX_CHECKS, ""))):
    __slots__ = ()
    endpoint: Endpoint
    podinfo_dir: str
    interval_seconds: float
    timeout_seconds: float
    backoff_base_seconds: float
    backoff_max_seconds: float
    # Test and bench only: stop after this many verdicts (0: never).
    max_checks: int
    # Written once the first check has run, whatever its outcome ("" for none): the pod's
    # startupProbe waits for it (toolkit/render.py), so the trainer starts after that check.
    started_file: str


def _seconds(env: Mapping[str, str], name: str, default: float, *, low: float, high: float) -> float:
    raw = envparse.get(env, ENV_PREFIX + name)
    if raw is None:
        return default
    try:
        return envparse.seconds(raw, low=low, high=high)
    except (envparse.Malformed, envparse.OutOfRange):
        raise SettingsError(f"{ENV_PREFIX}{name}={raw!r}: must be a number of seconds in [{low:g}, {high:g}]") from None


def _count(env: Mapping[str, str], name: str, default: int, *, high: int) -> int:
    raw = envparse.get(env, ENV_PREFIX + name)
    if raw is None:
        return default
    try:
        return envparse.whole(raw, low=0, high=high)
    except (envparse.Malformed, envparse.OutOfRange):
        raise SettingsError(f"{ENV_PREFIX}{name}={raw!r}: must be a whole number in [0, {high}]") from None


def _port(text: str) -> int | None:
    """A TCP port from 1 to 65535, or None."""
    try:
        return envparse.whole(text, low=1, high=65535)
    except (envparse.Malformed, envparse.OutOfRange):
        return None


def _split_server(raw: str) -> tuple[str, int]:
    """https://HOST[:PORT] with no path; HOST may be a bracketed IPv6 address."""
    name = ENV_PREFIX + "API_SERVER"
    rest = raw.removeprefix("https://")
    if rest == raw or not rest or "/" in rest.rstrip("/"):
        raise SettingsError(f"{name}={raw!r}: must be https://HOST[:PORT] with no path")
    rest = rest.rstrip("/")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.removeprefix(":")
    elif rest.count(":") == 1:
        host, _, port = rest.partition(":")
    else:
        host, port = rest, ""
    number = _port(port) if port else 443
    if not host or number is None:
        raise SettingsError(f"{name}={raw!r}: must be https://HOST[:PORT], PORT in [1, 65535]")
    return host, number


def endpoint(env: Mapping[str, str]) -> Endpoint:
    trio = {k: env.get(ENV_PREFIX + k) or "" for k in ("API_SERVER", "TOKEN_FILE", "CA_FILE")}
    given = [k for k, v in trio.items() if v]
    if given:
        if len(given) != 3:
            missing = ", ".join(ENV_PREFIX + k for k, v in trio.items() if not v)
            raise SettingsError(f"{missing}: must be set too when any of {ENV_PREFIX}API_SERVER, "
                                "_TOKEN_FILE, _CA_FILE is set")
        host, port = _split_server(trio["API_SERVER"])
        return Endpoint(host=host, port=port, token_file=trio["TOKEN_FILE"], ca_file=trio["CA_FILE"], source="env")
    host = env.get("KUBERNETES_SERVICE_HOST") or ""
    port = env.get("KUBERNETES_SERVICE_PORT") or "443"
    if not host:
        raise SettingsError("KUBERNETES_SERVICE_HOST: not set (not in a pod?); "
                            f"set {ENV_PREFIX}API_SERVER, _TOKEN_FILE and _CA_FILE instead")
    number = _port(port)
    if number is None:
        raise SettingsError(f"KUBERNETES_SERVICE_PORT={port!r}: must be a port in [1, 65535]")
    return Endpoint(host=host, port=number, token_file=f"{SERVICE_ACCOUNT_DIR}/token",
                    ca_file=f"{SERVICE_ACCOUNT_DIR}/ca.crt", source="in-cluster")


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    base = _seconds(env, "BACKOFF_BASE_SECONDS", DEFAULT_BACKOFF_BASE_SECONDS, low=0.01, high=3600)
    ceiling = _seconds(env, "BACKOFF_MAX_SECONDS", DEFAULT_BACKOFF_MAX_SECONDS, low=0.01, high=86400)
    if ceiling < base:
        raise SettingsError(f"{ENV_PREFIX}BACKOFF_MAX_SECONDS={ceiling:g}: must be at least "
                            f"{ENV_PREFIX}BACKOFF_BASE_SECONDS={base:g}")
    return Settings(
        endpoint=endpoint(env),
        podinfo_dir=env.get(ENV_PREFIX + "PODINFO_DIR") or DEFAULT_PODINFO_DIR,
        interval_seconds=_seconds(env, "INTERVAL_SECONDS", DEFAULT_INTERVAL_SECONDS, low=0.01, high=86400),
        timeout_seconds=_seconds(env, "TIMEOUT_SECONDS", DEFAULT_TIMEOUT_SECONDS, low=0.01, high=600),
        backoff_base_seconds=base,
        backoff_max_seconds=ceiling,
        max_checks=_count(env, "MAX_CHECKS", DEFAULT_MAX_CHECKS, high=10**9),
        started_file=env.get(ENV_PREFIX + "STARTED_FILE") or "",
    )
