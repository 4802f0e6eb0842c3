"""The dispatcher's configuration: environment variables only, read once.

There are no flags and no config file: the process reads `os.environ` in
`from_env` and nowhere else, and everything downstream gets the typed
`Settings`. A variable that is set to the empty string counts as unset (a
Deployment that templates a value out leaves it empty). A missing required
value, or a malformed one, raises `SettingsError` whose message is one line
naming the variable and the bound; `app.main` prints it and exits 2.

Values are read by the parsers all three processes share (toolkit.envparse,
and toolkit.formats for a DNS label or a quantity); the error texts are the
dispatcher's own.

The table in `VARIABLES` is the documentation: docs/dispatcher.md is written
from it, and a test checks it lists every name.
"""

from __future__ import annotations

import dataclasses
import pathlib
import urllib.parse
from collections.abc import Mapping

from dispatcher import backend, names
from toolkit import envparse, formats

IN_CLUSTER_NAMESPACE_FILE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# (name, default, meaning). A default of None means required.
VARIABLES: tuple[tuple[str, str | None, str], ...] = (
    ("TCAB_BACKEND_URL", None, "Base URL of the backend (http or https); also passed to the driver."),
    ("TCAB_BACKEND_SERVICE_TOKEN", None, "Shared service token for `POST /jobs/next`; never logged."),
    ("TCAB_DISPATCHER_DRIVER_IMAGE", None, "Image of the driver container."),
    ("TCAB_DISPATCHER_MAX_INFLIGHT", "16", "Global cap on unfinished driver Jobs (1..100000)."),
    ("TCAB_DISPATCHER_DRIVER_CPU_REQUEST", "100m", "CPU request of the driver container (no limit is set)."),
    ("TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST", "256Mi", "Memory request of the driver container (no limit)."),
    ("TCAB_DISPATCHER_NAMESPACE", "the pod's own namespace, else `default`",
     "Namespace of the driver Jobs and their Secrets."),
    ("TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT", "the namespace's `default`",
     "ServiceAccount the driver pod runs as (the driver creates sandbox pods under it)."),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT", "true",
     "`runAsNonRoot` of the driver container (true or false); false only for a driver image that must run as root."),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_USER", "the image's USER",
     "`runAsUser` of the driver container (1..2147483647), for an image whose USER is a name, not a number."),
    ("TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP", "group 0",
     "`runAsGroup` of the driver container (1..2147483647). Unset, the driver runs in group 0: the kubelet passes "
     "the runtime the image's uid only, never its group."),
    ("TCAB_DISPATCHER_POLL_INTERVAL", "2", "Seconds to wait before claiming again after the backend had nothing (0.01..3600)."),
    ("TCAB_DISPATCHER_JOB_TTL_SECONDS", "3600", "`ttlSecondsAfterFinished` of each driver Job (0..31536000)."),
    ("TCAB_DISPATCHER_BACKEND_TIMEOUT", "10", "Seconds before a backend request times out (0.1..600)."),
    ("TCAB_DISPATCHER_DRIVER_START_DEADLINE", "600",
     "Seconds a driver container may wait to start once its pod is on a node (image pull, config); past it the "
     "run is reported failed with the kubelet's reason and its Job deleted (1..86400)."),
    ("TCAB_DISPATCHER_LOG_TAIL_LINES", "100", "Lines of the dead driver pod's log put in a death report (0..10000)."),
    ("TCAB_DISPATCHER_WORKERS", "8", "Threads that create Jobs, send reports and reap (1..256)."),
    ("TCAB_DISPATCHER_LOG_LEVEL", "info", "debug, info, warning or error."),
    ("TCAB_DISPATCHER_HEARTBEAT_FILE", "no heartbeat",
     "Absolute path of a file the loop touches about once a second, in an existing directory (an emptyDir: the "
     "root filesystem is read-only); `python -m dispatcher.alive --max-age SECONDS FILE` is the liveness probe on it."),
    ("TCAB_K8S_NAMESPACE", "TCAB_DISPATCHER_NAMESPACE",
     "The driver's sandbox namespace; passed through, and reaped in as well."),
    ("TCAB_K8S_*", "", "Every such variable is passed through to the driver unchanged."),
    ("TCAB_CONTAINER_*", "", "Every such variable (the run-image selection) is passed through to the driver unchanged."),
    ("KUBECONFIG", "the pod's ServiceAccount, else ~/.kube/config",
     "Standard kubeconfig path. Unset: the pod's ServiceAccount where KUBERNETES_SERVICE_HOST is set (inside the "
     "cluster), else ~/.kube/config."),
)

_LEVELS = ("debug", "info", "warning", "error")


class SettingsError(ValueError):
    """A required variable is missing or a value is malformed (one line)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    backend_url: str
    service_token: str = dataclasses.field(repr=False)
    driver_image: str
    max_inflight: int = 16
    cpu_request: str = "100m"
    memory_request: str = "256Mi"
    namespace: str = "default"
    driver_service_account: str = ""
    driver_run_as_non_root: bool = True
    driver_run_as_user: int | None = None
    driver_run_as_group: int | None = None
    poll_interval: float = 2.0
    job_ttl_seconds: int = 3600
    backend_timeout: float = 10.0
    driver_start_deadline: float = 600.0
    log_tail_lines: int = 100
    workers: int = 8
    log_level: str = "info"
    heartbeat_file: str = ""  # "" = no heartbeat
    sandbox_namespace: str = "default"
    # (name, value) pairs of TCAB_K8S_* and TCAB_CONTAINER_*, sorted by name.
    passthrough: tuple[tuple[str, str], ...] = ()
    kubeconfig: str = ""


def _required(env: Mapping[str, str], name: str) -> str:
    value = envparse.get(env, name)
    if value is None:
        raise SettingsError(f"{name} is required and not set")
    return value


def _int(env: Mapping[str, str], name: str, default: int, *, low: int, high: int) -> int:
    raw = envparse.get(env, name)
    if raw is None:
        return default
    try:
        return envparse.whole(raw.strip(), low=low, high=high)
    except envparse.Malformed:
        raise SettingsError(f"{name}={raw!r} is not an integer in {low}..{high}") from None
    except envparse.OutOfRange as e:
        raise SettingsError(f"{name}={e.value} is outside {low}..{high}") from None


def _optional_id(env: Mapping[str, str], name: str) -> int | None:
    """A uid or gid other than root's, or None when unset."""
    if envparse.get(env, name) is None:
        return None
    return _int(env, name, 0, low=1, high=2_147_483_647)


def _seconds(env: Mapping[str, str], name: str, default: float, *, low: float, high: float) -> float:
    raw = envparse.get(env, name)
    if raw is None:
        return default
    try:
        return envparse.seconds(raw, low=low, high=high)
    except envparse.Malformed:
        raise SettingsError(f"{name}={raw!r} is not a number of seconds in {low}..{high}") from None
    except envparse.OutOfRange:
        raise SettingsError(f"{name}={raw} is outside {low}..{high} seconds") from None


def _quantity(env: Mapping[str, str], name: str, default: str) -> str:
    raw = envparse.get(env, name)
    if raw is None:
        return default
    if not formats.quantity(raw):
        raise SettingsError(f"{name}={raw!r} is not a Kubernetes quantity of zero or more (like 100m, 0.5, 256Mi)")
    return raw


def _dns_label(env: Mapping[str, str], name: str, default: str) -> str:
    raw = envparse.get(env, name)
    if raw is None:
        return default
    if not formats.dns_label(raw):
        raise SettingsError(f"{name}={raw!r} is not a DNS label (lowercase, digits, '-', at most 63)")
    return raw


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = envparse.get(env, name)
    if raw is None:
        return default
    try:
        return envparse.boolean(raw.strip().lower())
    except envparse.Malformed:
        raise SettingsError(f"{name}={raw!r} is not true or false") from None


def _url(env: Mapping[str, str], name: str) -> str:
    raw = _required(env, name)
    parsed = urllib.parse.urlsplit(raw)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SettingsError(f"{name}={raw!r} is not an http(s) URL with a host")
    return raw.rstrip("/")


def _heartbeat_file(env: Mapping[str, str], name: str) -> str:
    """An absolute path whose directory exists (a typo fails here, not as a liveness restart loop)."""
    raw = envparse.get(env, name)
    if raw is None:
        return ""
    path = pathlib.PurePosixPath(raw)
    if not path.is_absolute() or "\0" in raw or raw.endswith("/") or path.name in ("", ".", ".."):
        raise SettingsError(f"{name}={raw!r} is not an absolute path of a file")
    if not pathlib.Path(path.parent).is_dir():
        raise SettingsError(f"{name}={raw!r} is in {str(path.parent)!r}, which is not an existing directory")
    if pathlib.Path(path).is_dir():
        raise SettingsError(f"{name}={raw!r} is a directory, not a file")
    return raw


def _default_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def from_env(env: Mapping[str, str]) -> Settings:
    """The one place the environment is read. Raises SettingsError."""
    backend_url = _url(env, "TCAB_BACKEND_URL")
    token = _required(env, "TCAB_BACKEND_SERVICE_TOKEN")
    problem = backend.token_problem(token)
    if problem:  # never the value itself: it is a secret
        raise SettingsError(f"TCAB_BACKEND_SERVICE_TOKEN {problem}")
    image = _required(env, "TCAB_DISPATCHER_DRIVER_IMAGE")
    if any(c.isspace() for c in image):
        raise SettingsError(f"TCAB_DISPATCHER_DRIVER_IMAGE={image!r} contains whitespace")
    namespace = _dns_label(env, "TCAB_DISPATCHER_NAMESPACE", "") or _default_namespace()
    level = (envparse.get(env, "TCAB_DISPATCHER_LOG_LEVEL") or "info").lower()
    if level not in _LEVELS:
        raise SettingsError(f"TCAB_DISPATCHER_LOG_LEVEL={level!r} is not one of {', '.join(_LEVELS)}")
    passthrough = tuple(sorted(
        (k, v) for k, v in env.items() if k.startswith(names.PASSTHROUGH_PREFIXES)
    ))
    return Settings(
        backend_url=backend_url,
        service_token=token,
        driver_image=image,
        max_inflight=_int(env, "TCAB_DISPATCHER_MAX_INFLIGHT", 16, low=1, high=100_000),
        cpu_request=_quantity(env, "TCAB_DISPATCHER_DRIVER_CPU_REQUEST", "100m"),
        memory_request=_quantity(env, "TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST", "256Mi"),
        namespace=namespace,
        driver_service_account=_dns_label(env, "TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT", ""),
        driver_run_as_non_root=_bool(env, "TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT", True),
        driver_run_as_user=_optional_id(env, "TCAB_DISPATCHER_DRIVER_RUN_AS_USER"),
        driver_run_as_group=_optional_id(env, "TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP"),
        poll_interval=_seconds(env, "TCAB_DISPATCHER_POLL_INTERVAL", 2.0, low=0.01, high=3600),
        job_ttl_seconds=_int(env, "TCAB_DISPATCHER_JOB_TTL_SECONDS", 3600, low=0, high=31_536_000),
        backend_timeout=_seconds(env, "TCAB_DISPATCHER_BACKEND_TIMEOUT", 10.0, low=0.1, high=600),
        driver_start_deadline=_seconds(env, "TCAB_DISPATCHER_DRIVER_START_DEADLINE", 600.0, low=1, high=86_400),
        log_tail_lines=_int(env, "TCAB_DISPATCHER_LOG_TAIL_LINES", 100, low=0, high=10_000),
        workers=_int(env, "TCAB_DISPATCHER_WORKERS", 8, low=1, high=256),
        log_level=level,
        heartbeat_file=_heartbeat_file(env, "TCAB_DISPATCHER_HEARTBEAT_FILE"),
        sandbox_namespace=_dns_label(env, names.ENV_SANDBOX_NAMESPACE, "") or namespace,
        passthrough=passthrough,
        kubeconfig=envparse.get(env, "KUBECONFIG") or "",
    )
