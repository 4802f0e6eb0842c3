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
import subprocess
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
    """Run the pod's container with podman (no network, removed after) and parse its output."""
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == container_name)
    env = resolve_env(pod, container)
    env_map = dict(env)
    command = [expand(a, env_map) for a in container.get("command") or []]
    args = [expand(a, env_map) for a in container.get("args") or []]
    name = f"e2e-{SESSION}-{uuid.uuid4().hex[:8]}"
    argv = ["run", "--rm", "--network=none", "--pull=never", "--name", name, "--label", f"{SESSION_LABEL}={SESSION}"]
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
