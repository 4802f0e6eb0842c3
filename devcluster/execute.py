"""Run a pod's container the way a kubelet would, with podman, and read the
identity that execution printed.

kwok has no container runtime: it only writes pod status. So for each pod the
real controllers made, the test resolves the container's environment from
that pod alone - literal values and Downward API `fieldRef`s from the pod's
own metadata, in order, with the kubelet's `$(VAR)` expansion (in values,
command and args; `$$` is a literal `$`) - and runs its real command and args
in the pod's image with podman. The identity the prologue exported is what
the process printed: the scenario's user command is `env`-style output of
DISPATCH_EPOCH and DISPATCH_ATTEMPT.

Invariants:
- Nothing here knows how the toolkit rendered the TrainJob; it reads only the
  pod, as a kubelet does. A pod whose env needs something this resolver does
  not implement (configMapKeyRef, resourceFieldRef, envFrom) is an error,
  never an empty value.
- A sidecar (an initContainer, run by `run_sidecar`) gets what the kubelet
  gives it: its Downward API volume written from the pod (labels and
  annotations in the kubelet's `key="value"` format, Go-quoted), the projected
  ServiceAccount volume the apiserver added (a token the caller got by
  TokenRequest, the cluster CA, the namespace), and
  KUBERNETES_SERVICE_HOST/PORT; host network, so it reaches the apiserver on
  loopback. Any other volume kind is an error.
- No container outlives its run: each is `--rm`, named, and labelled with
  this test process's SESSION_LABEL; when a run times out, killing the podman
  client does not stop the container (conmon keeps it), so it is removed by
  name (`podman rm -f`). `leftover_containers()` lists what carries the label,
  for the suite's session-end check.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Any

Obj = dict[str, Any]

# The project's podman settings (scripts/containers.conf), as every podman call here uses.
CONTAINERS_CONF = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "containers.conf"

# Every container this test process runs carries this label, with a value of
# its own, so a run beside another (make test in parallel) sees only its own.
SESSION_LABEL = "e2e.dispatch.phpboyscout.uk/session"
SESSION = uuid.uuid4().hex[:12]

_FIELD_KEY = re.compile(r"^metadata\.(annotations|labels)\['([^']*)'\]$")


class ResolveError(Exception):
    """The pod's environment cannot be resolved from the pod alone."""


class Timeout(Exception):
    """The container did not finish in time; it has been removed."""


def field_ref(pod: Obj, path: str) -> str:
    """The value the kubelet's Downward API gives for `path` (missing key: empty)."""
    meta = pod.get("metadata", {})
    m = _FIELD_KEY.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", ""),
        "status.podIP": pod.get("status", {}).get("podIP", ""),
        "status.hostIP": pod.get("status", {}).get("hostIP", ""),
    }
    if path not in simple:
        raise ResolveError(f"fieldRef {path!r} is not supported by the e2e resolver")
    return str(simple[path] or "")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: defined names are replaced, `$$` is `$`,
    anything else is left as written."""
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    if name in env:
                        out.append(env[name])
                    else:
                        out.append(text[i:end + 1])
                    i = end + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def resolve_env(pod: Obj, container: Obj) -> list[tuple[str, str]]:
    """The container's environment in order, as the kubelet builds it."""
    if container.get("envFrom"):
        raise ResolveError(f"container {container['name']}: envFrom is not supported by the e2e resolver")
    env: dict[str, str] = {}
    order: list[str] = []
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" in var:
            source = var["valueFrom"]
            if "fieldRef" not in source:
                raise ResolveError(f"env {name}: only fieldRef is supported by the e2e resolver, got {source}")
            value = field_ref(pod, source["fieldRef"]["fieldPath"])
        else:
            value = expand(var.get("value", ""), env)
        if name not in env:
            order.append(name)
        env[name] = value
    return [(k, env[k]) for k in order]


@dataclasses.dataclass(frozen=True)
class Execution:
    pod: str
    exit_code: int
    stdout: str
    stderr: str
    epoch: str | None
    attempt: str | None


def _printed(stdout: str, key: str) -> str | None:
    for line in stdout.splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1]
    return None


def podman(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """podman with the project's settings."""
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)})


def leftover_containers() -> list[str]:
    """Names of this session's containers that still exist, in any state."""
    listed = podman("ps", "--all", "--filter", f"label={SESSION_LABEL}={SESSION}", "--format", "{{.Names}}")
    if listed.returncode != 0:
        raise RuntimeError(f"podman ps failed: {listed.stderr}")
    return listed.stdout.split()


def _remove(name: str, *, attempts: int = 20) -> str:
    """Remove a container whose podman client was killed; it may still be
    being created, so look again until it is gone. Returns what happened."""
    for _ in range(attempts):
        removed = podman("rm", "--force", "--time=0", name)
        if podman("container", "exists", name).returncode == 1:  # 1: no such container
            return "removed"
        time.sleep(0.5)
    return f"NOT removed: podman rm said {removed.returncode} {removed.stderr.strip()}"


def run(pod: Obj, *, container_name: str, timeout: float = 60.0) -> Execution:
    """Run the pod's container with podman (no network, removed after) and parse its output.

    Its hostPath volumes are mounted as the kubelet mounts them; no ServiceAccount token is
    (training code needs none here), and no other volume kind is supported in a trainer."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == container_name)
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    options = ["--network=none"]
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"], {})
        if "hostPath" in volume:
            mode = "ro" if mount.get("readOnly") else "rw"
            options += ["--volume", f"{volume['hostPath']['path']}:{mount['mountPath']}:{mode}"]
        elif not _is_service_account(volume):
            raise ResolveError(f"volume {mount['name']}: only hostPath volumes are supported in a trainer "
                               f"container by the e2e executor, got {sorted(volume)}")
    return _podman_run(pod, container, options, [], timeout=timeout)


def _is_service_account(volume: Obj) -> bool:
    """The projected token volume the apiserver adds to every container."""
    return any("serviceAccountToken" in source for source in (volume.get("projected") or {}).get("sources") or [])


def go_quote(value: str) -> str:
    """Go's strconv.Quote, as the kubelet writes a label or annotation value.
    (Python's isprintable and Go's unicode.IsPrint agree: both exclude the
    categories C* and Z* but the ASCII space; only a character newer than this
    Python's Unicode tables is escaped here and written as itself by Go, and
    the sidecar reads both forms back the same.)"""
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v"}


def downward_file(pod: Obj, path: str) -> str:
    """A Downward API volume file's content for fieldRef PATH."""
    meta = pod.get("metadata", {})
    if path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={go_quote(str(v))}" for k, v in sorted(values.items()))
    return field_ref(pod, path)


@dataclasses.dataclass(frozen=True)
class ServiceAccount:
    """What the kubelet mounts for the pod's ServiceAccount, and where the apiserver is."""

    token: str
    ca_pem: str
    host: str
    port: int


def run_sidecar(pod: Obj, *, container_name: str, account: ServiceAccount, env: dict[str, str] | None = None,
                timeout: float = 60.0) -> Execution:
    """Run the pod's initContainer CONTAINER_NAME as the kubelet would (see the module docstring),
    with ENV added (a bound on its checks, say); removed after."""
    container = next(c for c in pod["spec"].get("initContainers") or [] if c["name"] == container_name)
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="e2e-sidecar-"))  # 0700: only its mounts are opened up
    try:
        options = ["--network=host"]
        for mount in container.get("volumeMounts") or []:
            files = _open_dir(scratch / mount["name"])
            for path, content in _volume_files(pod, volumes.get(mount["name"], {}), account):
                (files / path).write_text(content)
                (files / path).chmod(0o644)
            options += ["--volume", f"{files}:{mount['mountPath']}:ro"]
        security = container.get("securityContext") or {}
        if security.get("readOnlyRootFilesystem"):
            options.append("--read-only")
        if "ALL" in (security.get("capabilities") or {}).get("drop", []):
            options.append("--cap-drop=ALL")
        if security.get("allowPrivilegeEscalation") is False:
            options += ["--security-opt", "no-new-privileges"]
        extra = [("KUBERNETES_SERVICE_HOST", account.host), ("KUBERNETES_SERVICE_PORT", str(account.port)),
                 *(env or {}).items()]
        return _podman_run(pod, container, options, extra, timeout=timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _volume_files(pod: Obj, volume: Obj, account: ServiceAccount) -> list[tuple[str, str]]:
    """(path, content) of each file the kubelet would put in VOLUME: a downwardAPI volume, or the
    projected ServiceAccount volume (token, the cluster CA's ConfigMap, the namespace)."""
    if "downwardAPI" in volume:
        return [(i["path"], downward_file(pod, i["fieldRef"]["fieldPath"])) for i in volume["downwardAPI"]["items"]]
    if "projected" not in volume:
        raise ResolveError(f"volume {volume.get('name')}: only downwardAPI and projected volumes are supported "
                           f"by the e2e executor, got {sorted(volume)}")
    files: list[tuple[str, str]] = []
    for source in volume["projected"].get("sources") or []:
        if "serviceAccountToken" in source:
            files.append((source["serviceAccountToken"]["path"], account.token))
        elif (source.get("configMap") or {}).get("name") == "kube-root-ca.crt":
            files += [(i["path"], account.ca_pem) for i in source["configMap"].get("items") or []]
        elif "downwardAPI" in source:
            files += [(i["path"], downward_file(pod, i["fieldRef"]["fieldPath"]))
                      for i in source["downwardAPI"]["items"]]
        else:
            raise ResolveError(f"volume {volume.get('name')}: projected source {sorted(source)} is not supported "
                               "by the e2e executor")
    return files


def _open_dir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir()
    path.chmod(0o755)  # a non-root container user reads it
    return path


def _podman_run(pod: Obj, container: Obj, options: list[str], extra: list[tuple[str, str]], *,
                timeout: float) -> Execution:
    env = [*resolve_env(pod, container), *extra]
    env_map = dict(env)
    command = [expand(a, env_map) for a in container.get("command") or []]
    args = [expand(a, env_map) for a in container.get("args") or []]
    name = f"e2e-{SESSION}-{uuid.uuid4().hex[:8]}"
    argv = ["run", "--rm", *options, "--pull=never", "--name", name, "--label", f"{SESSION_LABEL}={SESSION}"]
    for k, v in env:
        argv += ["--env", f"{k}={v}"]
    if command:
        argv += ["--entrypoint", command[0], container["image"], *command[1:], *args]
    else:
        argv += [container["image"], *args]
    try:
        proc = podman(*argv, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Timeout(f"pod {pod['metadata']['name']}: container {name} ran over {timeout}s; "
                      f"{_remove(name)}") from None
    return Execution(pod=pod["metadata"]["name"], exit_code=proc.returncode, stdout=proc.stdout,
                     stderr=proc.stderr, epoch=_printed(proc.stdout, "DISPATCH_EPOCH"),
                     attempt=_printed(proc.stdout, "DISPATCH_ATTEMPT"))
