"""The dispatcher's configuration: environment variables only, read once.

There are no flags and no config file: the process reads `os.environ` in
`from_env` and nowhere else, and everything downstream gets the typed
`Settings`. Each variable is a row of `TABLE`, read by the table machinery
all three processes share (toolkit.envtable): a variable set to the empty
string counts as unset (a Deployment that templates a value out leaves it
empty), and a missing required value or a malformed one raises
`SettingsError`, one line naming the variable and the bound; `app.main`
prints it and exits 2. The service token is a secret: a message about it
never holds its value.

Precedence: the variable > the default; two defaults are derived here (the
namespace: the pod's own, else `default`; the sandbox namespace: the
namespace). docs/dispatcher.md carries the table as `envtable.markdown`
writes it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import urllib.parse
from collections.abc import Mapping
from typing import Any

from dispatcher import backend, names
from toolkit import envtable, formats

IN_CLUSTER_NAMESPACE_FILE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

SettingsError = envtable.SettingsError


def _url(raw: str) -> str:
    parsed = urllib.parse.urlsplit(raw)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise envtable.Invalid()
    return raw.rstrip("/")


def _token(raw: str) -> str:
    problem = backend.token_problem(raw)
    if problem:  # never the value itself: it is a secret
        raise envtable.Invalid(problem)
    return raw


def _heartbeat_file(raw: str) -> str:
    """An absolute path whose directory exists (a typo fails here, not as a liveness restart loop)."""
    path = pathlib.PurePosixPath(raw)
    if not path.is_absolute() or "\0" in raw or raw.endswith("/") or path.name in ("", ".", ".."):
        raise envtable.Invalid()
    if not pathlib.Path(path.parent).is_dir():
        raise envtable.Invalid(f"{str(path.parent)!r} is not an existing directory")
    if pathlib.Path(path).is_dir():
        raise envtable.Invalid("expected a file, not a directory")
    return raw


# The dispatcher's own kinds; the rest are the table machinery's (toolkit.envtable).
URL = envtable.Kind("url", "an http(s) URL with a host", _url)
TOKEN = envtable.Kind("token", f"an {backend.TOKEN_RULE}", _token)
IMAGE = envtable.text("image", "an image reference, without whitespace", lambda raw: not any(c.isspace() for c in raw))
QUANTITY = envtable.text("quantity", "a Kubernetes quantity of zero or more (like 100m, 0.5, 256Mi)", formats.quantity)
HEARTBEAT_FILE = envtable.Kind("file", "an absolute path of a file, in an existing directory", _heartbeat_file)
_ID = envtable.whole(1, 2_147_483_647)  # a uid or gid other than root's
_K8S, _CONTAINER = names.PASSTHROUGH_PREFIXES

# The table, in the docs' order (docs/dispatcher.md, "Configuration").
TABLE: tuple[envtable.Setting, ...] = (
    envtable.Setting("TCAB_BACKEND_URL", "backend_url", URL,
                     "Base URL of the backend; also passed to the driver.", required=True),
    envtable.Setting("TCAB_BACKEND_SERVICE_TOKEN", "service_token", TOKEN,
                     "Shared service token for `POST /jobs/next`; never logged.", required=True, secret=True),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_IMAGE", "driver_image", IMAGE, "Image of the driver container.",
                     required=True),
    envtable.Setting("TCAB_DISPATCHER_MAX_INFLIGHT", "max_inflight", envtable.whole(1, 100_000),
                     "Global cap on unfinished driver Jobs.", default=16),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_CPU_REQUEST", "cpu_request", QUANTITY,
                     "CPU request of the driver container (no limit is set).", default="100m"),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST", "memory_request", QUANTITY,
                     "Memory request of the driver container (no limit).", default="256Mi"),
    envtable.Setting("TCAB_DISPATCHER_NAMESPACE", "namespace", envtable.DNS_LABEL,
                     "Namespace of the driver Jobs and their Secrets.",
                     shown="the pod's own namespace, else `default`"),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT", "driver_service_account", envtable.DNS_LABEL,
                     "ServiceAccount the driver pod runs as (the driver creates sandbox pods under it).", default="",
                     shown="the namespace's `default`"),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_RUN_AS_NON_ROOT", "driver_run_as_non_root", envtable.BOOLEAN,
                     "`runAsNonRoot` of the driver container; false only for a driver image that must run as root.",
                     default=True),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_RUN_AS_USER", "driver_run_as_user", _ID,
                     "`runAsUser` of the driver container, for an image whose USER is a name, not a number.",
                     shown="the image's USER"),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_RUN_AS_GROUP", "driver_run_as_group", _ID,
                     "`runAsGroup` of the driver container. Unset, the driver runs in group 0: the kubelet passes "
                     "the runtime the image's uid only, never its group.", shown="group 0"),
    envtable.Setting("TCAB_DISPATCHER_POLL_INTERVAL", "poll_interval", envtable.seconds(0.01, 3600),
                     "Seconds to wait before claiming again after the backend had nothing.", default=2.0),
    envtable.Setting("TCAB_DISPATCHER_JOB_TTL_SECONDS", "job_ttl_seconds", envtable.whole(0, 31_536_000),
                     "`ttlSecondsAfterFinished` of each driver Job.", default=3600),
    envtable.Setting("TCAB_DISPATCHER_BACKEND_TIMEOUT", "backend_timeout", envtable.seconds(0.1, 600),
                     "Seconds before a backend request times out.", default=10.0),
    envtable.Setting("TCAB_DISPATCHER_DRIVER_START_DEADLINE", "driver_start_deadline", envtable.seconds(1, 86_400),
                     "Seconds a driver container may wait to start once its pod is on a node (image pull, config); "
                     "past it the run is reported failed with the kubelet's reason and its Job deleted.",
                     default=600.0),
    envtable.Setting("TCAB_DISPATCHER_LOG_TAIL_LINES", "log_tail_lines", envtable.whole(0, 10_000),
                     "Lines of the dead driver pod's log put in a death report.", default=100),
    envtable.Setting("TCAB_DISPATCHER_WORKERS", "workers", envtable.whole(1, 256),
                     "Threads that create Jobs, send reports and reap.", default=8),
    envtable.Setting("TCAB_DISPATCHER_LOG_LEVEL", "log_level", envtable.choice("debug", "info", "warning", "error"),
                     "Level of the JSON log lines on stderr.", default="info"),
    envtable.Setting("TCAB_DISPATCHER_HEARTBEAT_FILE", "heartbeat_file", HEARTBEAT_FILE,
                     "A file the loop touches about once a second (in an emptyDir: the root filesystem is "
                     "read-only); `python -m dispatcher.alive --max-age SECONDS FILE` is the liveness probe on it.",
                     default="", shown="no heartbeat"),
    envtable.Setting(names.ENV_SANDBOX_NAMESPACE, "sandbox_namespace", envtable.DNS_LABEL,
                     "The driver's sandbox namespace; passed through, and reaped in as well.",
                     shown="`TCAB_DISPATCHER_NAMESPACE`"),
    envtable.Setting(_K8S + "*", "passthrough", envtable.TEXT,
                     "Every such variable is passed through to the driver unchanged."),
    envtable.Setting(_CONTAINER + "*", "passthrough", envtable.TEXT,
                     "Every such variable (the run-image selection) is passed through to the driver unchanged."),
    envtable.Setting("KUBECONFIG", "kubeconfig", envtable.PATH,
                     "Standard kubeconfig path. Unset: the pod's ServiceAccount where KUBERNETES_SERVICE_HOST is set "
                     "(inside the cluster), else ~/.kube/config.", default="",
                     shown="the pod's ServiceAccount, else `~/.kube/config`"),
)
_DEFAULT: dict[str, Any] = {s.field: s.default for s in TABLE}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The dispatcher's settings, typed; the defaults are the table's."""

    backend_url: str
    service_token: str = dataclasses.field(repr=False)
    driver_image: str
    max_inflight: int = _DEFAULT["max_inflight"]
    cpu_request: str = _DEFAULT["cpu_request"]
    memory_request: str = _DEFAULT["memory_request"]
    namespace: str = "default"  # derived (from_env): the pod's own namespace, else this
    driver_service_account: str = _DEFAULT["driver_service_account"]
    driver_run_as_non_root: bool = _DEFAULT["driver_run_as_non_root"]
    driver_run_as_user: int | None = _DEFAULT["driver_run_as_user"]
    driver_run_as_group: int | None = _DEFAULT["driver_run_as_group"]
    poll_interval: float = _DEFAULT["poll_interval"]
    job_ttl_seconds: int = _DEFAULT["job_ttl_seconds"]
    backend_timeout: float = _DEFAULT["backend_timeout"]
    driver_start_deadline: float = _DEFAULT["driver_start_deadline"]
    log_tail_lines: int = _DEFAULT["log_tail_lines"]
    workers: int = _DEFAULT["workers"]
    log_level: str = _DEFAULT["log_level"]
    heartbeat_file: str = _DEFAULT["heartbeat_file"]  # "" = no heartbeat
    sandbox_namespace: str = "default"  # derived (from_env): the namespace
    # (name, value) pairs of TCAB_K8S_* and TCAB_CONTAINER_*, sorted by name.
    passthrough: tuple[tuple[str, str], ...] = ()
    kubeconfig: str = _DEFAULT["kubeconfig"]


def _default_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def from_env(env: Mapping[str, str]) -> Settings:
    """The one place the environment is read. Raises SettingsError."""
    values: dict[str, Any] = envtable.read(TABLE, env)
    values["namespace"] = values["namespace"] or _default_namespace()
    values["sandbox_namespace"] = values["sandbox_namespace"] or values["namespace"]
    return Settings(**values)
