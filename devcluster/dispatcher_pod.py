"""The release's dispatcher as a pod on the local cluster's node: installed, configured, started,
killed and stopped as on any cluster, its log read from the kubelet.

`Released(text)`: what the bundle's dispatcher.yaml installs (its namespace, Deployment, container,
the Secret it reads the backend from, the driver image), read from the file itself.
`overlay(text, namespace)`: the same documents placed in NAMESPACE as a kustomize overlay's
`namespace:` places them (the Namespace itself left out, the RoleBinding's subject moved with
them), with `replicas: 0` so that nothing runs before `Pod.start`; `install(running, release,
namespace)` applies them with `kubectl apply --server-side` (devcluster/install.py).

`Pod(api, namespace)` is the dispatcher's Deployment in NAMESPACE:
- `configure(env)`: its container's env values, as a user's overlay sets them;
- `give_backend(url, token)`: the Secret it reads the backend's URL and service token from;
- `start()`: scaled to one; returns once a new container of it runs, from the image the
  Deployment names (its imageID is that digest: the kubelet pulled it from the registry). From
  then on the pod's log is followed through the apiserver and the kubelet (`pods/log`): every
  container the pod runs, the one before a restart included (`previous`);
- `crash()`: the container's processes SIGKILLed on the host (node.container_pids); the kubelet
  restarts it in the same pod, as in production; returns once the new container runs;
- `kill()`: the container's processes SIGKILLed with nothing of them running after and nothing
  restarted: frozen (SIGSTOP), the Deployment scaled to zero (the pod terminating, so the kubelet
  restarts nothing; its SIGTERM stays pending in the frozen process), then SIGKILLed; the next
  `start()` is a new pod;
- `terminate()`: scaled to zero: the kubelet stops the container with SIGTERM; its exit code as
  the kubelet reported it in the pod's last status;
- `text()`, `lines()`: everything its containers wrote, in order (`lines` parses the JSON lines);
- `close()`: killed if running, the log followers ended.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import pathlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.watch
import urllib3
import yaml

from devcluster import harness, install as install_mod, node, polling

PART = "dispatcher.yaml"
COMPONENT = "app.kubernetes.io/component=dispatcher"  # the label the Deployment carries
POD_TIMEOUT = 120.0
# How long a follower waits, after a running container's log stream ended, for the pod's status to
# say whether it exited before it follows that container again (a stream cut short: an apiserver
# restart).
STALE = 3.0


class PodError(harness.HarnessError):
    """The dispatcher's pod did not do what was asked in time; the message says what it did."""


class Released:
    """What dispatcher.yaml installs, read from the file itself."""

    def __init__(self, text: str) -> None:
        docs = [d for d in yaml.safe_load_all(text) if d]
        self.namespace: str = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
        self.service_account: str = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        self.deployment: str = deployment["metadata"]["name"]
        self.selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        self.container: str = container["name"]
        self.image: str = container["image"]
        env = {e["name"]: e for e in container.get("env", [])}
        self.secret: str = env["TCAB_BACKEND_URL"]["valueFrom"]["secretKeyRef"]["name"]
        self.driver_image: str = env["TCAB_DISPATCHER_DRIVER_IMAGE"]["value"]


def digest_id(reference: str) -> str:
    """The imageID the kubelet reports for REFERENCE (`REPO:TAG@sha256:D`): `REPO@sha256:D`."""
    name, digest = reference.split("@", 1)
    return f"{name.rsplit(':', 1)[0] if ':' in name.rsplit('/', 1)[-1] else name}@{digest}"


def overlay(text: str, namespace: str) -> list[dict[str, Any]]:
    """dispatcher.yaml's documents in NAMESPACE, as `namespace: NAMESPACE` in a kustomize overlay
    puts them, and the Deployment at zero replicas; the Namespace document is left out (NAMESPACE
    exists)."""
    docs = []
    for doc in (copy.deepcopy(d) for d in yaml.safe_load_all(text) if d):
        if doc["kind"] == "Namespace":
            continue
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
        if doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = 0
        docs.append(doc)
    return docs


def install(running: Any, release: Any, namespace: str) -> Released:
    """The release's dispatcher.yaml into NAMESPACE (`overlay`), applied server-side with the
    control plane's kubectl; what it installs."""
    text = release.files[PART].read_text()
    install_mod.apply_text(running, yaml.safe_dump_all(overlay(text, namespace)), f"{PART} in {namespace}")
    return Released(text)


def _wait(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    return polling.until(f"the dispatcher's pod: {what}", predicate, timeout=timeout, interval=0.1, error=PodError)


def _alive(pid: int) -> bool:
    """PID exists and is not a zombie (a process killed and not yet reaped by its shim is dead)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _pending(pid: int, sig: signal.Signals) -> bool:
    """SIG is pending for PID (sent and not yet delivered: the process is stopped), or PID is gone."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask >> (sig - 1) & 1 for mask in masks)


def _exit_code(pod: Any, container: str, known: int | None) -> int | None:
    """The exit code of POD's CONTAINER if its status says it terminated, else KNOWN."""
    status = _status(pod, container)
    return status.state.terminated.exit_code if status is not None and status.state.terminated else known


def _status(pod: Any, container: str) -> Any:
    return next((s for s in (pod.status.container_statuses or []) if s.name == container), None)


class Pod:
    """The dispatcher's Deployment in NAMESPACE (found by its component label), its pods and their log."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        found = self.apps.list_namespaced_deployment(namespace, label_selector=COMPONENT).items
        if len(found) != 1:
            raise PodError(f"{len(found)} dispatcher Deployments in {namespace}, not 1")
        deployment = found[0]
        self.deployment: str = deployment.metadata.name
        self.selector = ",".join(f"{k}={v}" for k, v in deployment.spec.selector.match_labels.items())
        container = deployment.spec.template.spec.containers[0]
        self.container: str = container.name
        self.image: str = container.image
        self.env: dict[str, str] = {e.name: e.value for e in container.env or [] if e.value is not None}
        self.secret: str = next(e.value_from.secret_key_ref.name for e in container.env or []
                                if e.name == "TCAB_BACKEND_URL")
        self.seen: set[str] = set()  # every container id started, crashed or killed here
        self.current: Any = None  # the pod of the last start()
        self.followers: dict[str, _Follower] = {}  # pod name -> its log's follower
        self.log: list[tuple[str, str]] = []  # (pod/container id, line), in the order read

    # -- configuration, as a user's overlay and Secret give it

    def configure(self, env: dict[str, str]) -> None:
        self.apps.patch_namespaced_deployment(self.deployment, self.namespace, {"spec": {"template": {"spec": {
            "containers": [{"name": self.container, "env": [{"name": k, "value": v} for k, v in env.items()]}]}}}})
        self.env.update(env)

    def give_backend(self, url: str, token: str) -> None:
        self.core.create_namespaced_secret(self.namespace, {"metadata": {"name": self.secret},
                                                            "stringData": {"url": url, "token": token}})

    # -- running it

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items)

    def running(self) -> tuple[Any, str] | None:
        """The pod whose container runs now, and that container's id; None when none runs."""
        for pod in self.pods():
            status = _status(pod, self.container)
            if status is not None and status.state.running is not None and pod.metadata.deletion_timestamp is None:
                return pod, status.container_id
        return None

    def _new_container(self) -> tuple[Any, str] | None:
        found = self.running()
        return found if found is not None and found[1] not in self.seen else None

    def start(self, *, timeout: float = POD_TIMEOUT) -> Pod:
        """Scaled to one; once a container not run before runs, from the image the Deployment names."""
        self.apps.patch_namespaced_deployment_scale(self.deployment, self.namespace, {"spec": {"replicas": 1}})
        pod, container_id = _wait("a new container running", self._new_container, timeout)
        self._started(pod, container_id)
        return self

    def _started(self, pod: Any, container_id: str) -> None:
        self.seen.add(container_id)
        image_id = _status(pod, self.container).image_id
        if image_id != digest_id(self.image):
            raise PodError(f"pod {pod.metadata.name} runs imageID {image_id!r}, not {digest_id(self.image)!r}")
        self.current = pod
        if pod.metadata.name not in self.followers:
            follower = _Follower(self.api.configuration, self.namespace, pod.metadata.name, self.container, self.log)
            self.followers[pod.metadata.name] = follower
            follower.start()

    def image_id(self) -> str:
        """The imageID the kubelet reports for the running container."""
        assert self.current is not None
        return str(_status(self.core.read_namespaced_pod(self.current.metadata.name, self.namespace),
                           self.container).image_id)

    def pids(self) -> list[int]:
        """The host processes of the running container (none when none runs)."""
        found = self.running()
        return node.container_pids(found[0].metadata.uid, found[1]) if found is not None else []

    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def crash(self, *, timeout: float = POD_TIMEOUT) -> None:
        """SIGKILL the container's processes; return once the kubelet has restarted it in its pod."""
        found = self.running()
        if found is None:
            raise PodError("crash: no container running")
        self._signal(node.container_pids(found[0].metadata.uid, found[1]), signal.SIGKILL)
        pod, container_id = _wait("the container restarted by the kubelet", self._new_container, timeout)
        self._started(pod, container_id)

    def kill(self, *, timeout: float = POD_TIMEOUT, restart_matters: bool = True) -> None:
        """SIGKILL the container's processes, frozen first while the pod is made to terminate (the
        Deployment scaled to zero), so that nothing runs after the freeze and nothing restarts.
        RESTART_MATTERS=False (the end of a test): no wait for the kubelet to take up the termination."""
        found = self.running()
        if found is None:
            raise PodError("kill: no container running")
        pod, container_id = found
        pids = node.container_pids(pod.metadata.uid, container_id)
        self._signal(pids, signal.SIGSTOP)
        self.apps.patch_namespaced_deployment_scale(self.deployment, self.namespace, {"spec": {"replicas": 0}})
        name = pod.metadata.name

        def terminating() -> bool:
            try:
                return self.core.read_namespaced_pod(name, self.namespace).metadata.deletion_timestamp is not None
            except kubernetes.client.ApiException as e:
                if e.status == 404:
                    return True
                raise

        _wait("its pod terminating", terminating, timeout)
        # The deletion in the API is not yet the kubelet's: a container that dies before the kubelet
        # has taken up the pod's termination is restarted in it (restartPolicy Always), and that
        # restarted container, not frozen, would run beside the next pod. The kubelet's stop signal,
        # held pending by the freeze, says it has.
        if restart_matters:
            _wait("the kubelet's SIGTERM pending in it", lambda: any(_pending(pid, signal.SIGTERM) for pid in pids),
                  timeout)
        self._signal(pids, signal.SIGKILL)
        _wait("its processes dead", lambda: not any(_alive(pid) for pid in pids), timeout)

    def terminate(self, *, timeout: float = POD_TIMEOUT) -> int | None:
        """Scale to zero and follow the pod until it is gone: its container's exit code as the
        kubelet last reported it (None if it reported none)."""
        assert self.current is not None, "terminate before start"
        name = self.current.metadata.name
        selector = f"metadata.name={name}"
        deadline = time.monotonic() + timeout
        listing = self.core.list_namespaced_pod(self.namespace, field_selector=selector)
        if not listing.items:
            raise PodError(f"terminate: pod {name} is gone already")
        self.apps.patch_namespaced_deployment_scale(self.deployment, self.namespace, {"spec": {"replicas": 0}})
        code: int | None = None
        while True:
            for pod in listing.items:
                code = _exit_code(pod, self.container, code)
            if not listing.items:
                break
            try:
                stream = kubernetes.watch.Watch()
                for event in stream.stream(self.core.list_namespaced_pod, self.namespace, field_selector=selector,
                                           resource_version=listing.metadata.resource_version,
                                           timeout_seconds=max(1, int(deadline - time.monotonic()))):
                    code = _exit_code(event["object"], self.container, code)
                    if event["type"] == "DELETED":
                        stream.stop()
                        listing.items = []
            except kubernetes.client.ApiException as e:
                if e.status != 410:
                    raise
            if listing.items:
                if time.monotonic() > deadline:
                    raise PodError(f"terminate: pod {name} not gone within {timeout:.0f}s")
                listing = self.core.list_namespaced_pod(self.namespace, field_selector=selector)  # expired: again
        follower = self.followers.get(name)
        if follower is not None:
            follower.join(timeout=30)
        return code

    def close(self) -> None:
        """Kill it if it runs, leave the Deployment at zero; end the log followers."""
        try:
            if self.running() is not None:
                self.kill(restart_matters=False)
            else:
                self.apps.patch_namespaced_deployment_scale(self.deployment, self.namespace, {"spec": {"replicas": 0}})
        finally:
            for follower in self.followers.values():
                follower.stop()

    # -- its log

    def text(self) -> str:
        return "".join(line + "\n" for _, line in list(self.log))

    def lines(self) -> list[dict[str, Any]]:
        return [_parsed(line) for _, line in list(self.log)]

    def lines_by_container(self) -> dict[str, list[dict[str, Any]]]:
        """Each container's lines ("pod/container id"), for a test that counts what each one said."""
        out: dict[str, list[dict[str, Any]]] = {}
        for source, line in list(self.log):
            out.setdefault(source, []).append(_parsed(line))
        return out


def _parsed(line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"message": line, "unparsed": True}


class _Follower(threading.Thread):
    """One pod's log, every container it runs in turn, appended line by line to SINK: the running
    container's followed (`follow`), a restarted one's rest read back (`previous`), each line once
    (a stream cut short, e.g. by an apiserver restart, is read again past the lines taken)."""

    def __init__(self, configuration: Any, namespace: str, pod: str, container: str,
                 sink: list[tuple[str, str]]) -> None:
        super().__init__(daemon=True, name=f"log {namespace}/{pod}")
        self.configuration, self.namespace, self.pod, self.container = configuration, namespace, pod, container
        self.sink = sink
        self.stopping = threading.Event()
        self.taken: dict[str, int] = {}  # container id -> lines taken from its log
        self.done: set[str] = set()  # container ids whose log was read to its end
        self.ended: dict[str, float] = {}  # container id -> when its followed stream last ended

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)

    def run(self) -> None:
        with kubernetes.client.ApiClient(self.configuration) as api:
            core = kubernetes.client.CoreV1Api(api)
            while not self.stopping.is_set():
                try:
                    pod = core.read_namespaced_pod(self.pod, self.namespace, _request_timeout=10)
                except kubernetes.client.ApiException as e:
                    if e.status == 404:
                        return  # the pod is gone: its containers' logs with it
                    time.sleep(0.2)
                    continue
                except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError):
                    time.sleep(0.2)  # the apiserver is away
                    continue
                status = _status(pod, self.container)
                last = status.last_state.terminated if status is not None and status.last_state else None
                if last is not None and last.container_id and last.container_id not in self.done:
                    if self._take(core, last.container_id, previous=True, follow=False):
                        self.done.add(last.container_id)
                    continue
                state = status.state if status is not None else None
                cid = status.container_id if status is not None else None
                if cid and cid not in self.done and state is not None and (state.running or state.terminated):
                    if state.running and time.monotonic() - self.ended.get(cid, -STALE) < STALE:
                        # Its stream ended and the status may not say so yet: once it is restarted,
                        # the current log is the next container's, never to be taken as this one's.
                        time.sleep(0.1)
                        continue
                    followed = self._take(core, cid, previous=False, follow=state.running is not None)
                    if followed and state.terminated:
                        self.done.add(cid)
                    elif state.running:
                        self.ended[cid] = time.monotonic()
                time.sleep(0.1)

    def _take(self, core: Any, container_id: str, *, previous: bool, follow: bool) -> bool:
        """Read the log past the lines taken; True once read to its end (or nothing is there to
        read), False when the stream broke off."""
        skip = self.taken.get(container_id, 0)
        try:
            response = core.read_namespaced_pod_log(self.pod, self.namespace, container=self.container,
                                                    previous=previous, follow=follow, _preload_content=False,
                                                    _request_timeout=(10, 600 if follow else 30))
        except kubernetes.client.ApiException:
            return True  # no such container's log (not started, or gone): nothing to take
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError):
            return False
        seen, rest = 0, b""
        try:
            for chunk in response.stream(amt=None, decode_content=False):
                rest += chunk
                *complete, rest = rest.split(b"\n")
                for line in complete:
                    seen += 1
                    if seen > skip:
                        self.sink.append((f"{self.pod}/{container_id}", line.decode(errors="replace")))
                        self.taken[container_id] = seen
            if rest:
                seen += 1
                if seen > skip:
                    self.sink.append((f"{self.pod}/{container_id}", rest.decode(errors="replace")))
                    self.taken[container_id] = seen
            return True
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError):
            return False
        finally:
            response.release_conn()
