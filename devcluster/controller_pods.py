"""Our controller as the release runs it on the local cluster, for the suites that need to act on it:
the Deployment `dispatch-controller` in dispatch-system (two replicas, leader election over the
Lease), installed by `local.start(release_dir=...)` (devcluster/install.py).

What a person or a node does to it, and nothing else:
- `stop()` scales the Deployment to zero and returns once its pods are gone (each stopped by
  SIGTERM through the kubelet); `start()` scales it back and returns once a Ready pod holds the
  Lease. Between the two no controller of ours runs.
- `kill(pod)` SIGKILLs a pod's controller container through the node's runtime (containerd's task
  API, as the node's OOM killer or a crash would end it); the kubelet restarts it. `kill_leader()`
  kills the pod that holds the Lease, once every replica runs (so the standby is there to take over,
  as in production). `all_running()` waits for that.
- `leader()` names the pod that holds the Lease.

What a bench measures of it, from outside as of any pod: `pids()`, each running pod's controller
container's host processes (found by their cgroup, node.container_pids), and `metrics_addresses()`,
each pod's IP and the port its container declares for /metrics (devcluster/metrics.py scrapes it
with a reader's token).

`Logbook` keeps every line each controller container printed, every restart of every pod
included: a watch on the pods follows each container instance's log from the kubelet (from its
first line, `previous` for one that ended before it was seen) into a file of its own in LOG_DIR,
named `dispatch-controller.<pod>.<container id>.log`. A pod deleted or a container killed keeps
its file. `lines()` reads them all with the pod each came from.

Invariant: no fault here touches what the release installed (its manifests, its image); the only
writes are the Deployment's scale, as `kubectl scale` makes them.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.watch

from devcluster import harness, install, node, polling

DEPLOYMENT = "dispatch-controller"
CONTAINER = "controller"
METRICS_PORT = "metrics"  # the name of the container's /metrics port in the Deployment
REPLICAS = 2
GONE_TIMEOUT_SECONDS = 90.0


class ControllerPods:
    """The release's controller Deployment on RUNNING (a local.start Stack with the release installed)."""

    def __init__(self, running: Any) -> None:
        self.running = running
        self.logbook = Logbook(running.plane, pathlib.Path(running.plane.log_dir))

    # -- the Deployment ----------------------------------------------------

    def _scale(self, replicas: int) -> None:
        with self.running.plane.api_client() as api:
            kubernetes.client.AppsV1Api(api).patch_namespaced_deployment_scale(
                DEPLOYMENT, install.NAMESPACE, {"spec": {"replicas": replicas}})

    def pods(self) -> list[Any]:
        with self.running.plane.api_client() as api:
            return list(kubernetes.client.CoreV1Api(api).list_namespaced_pod(
                install.NAMESPACE, label_selector=install.SELECTOR).items)

    def stop(self) -> None:
        """Scale to zero; return once every pod of it is gone."""
        self._scale(0)
        _until("our controller's pods to be gone", lambda: not self.pods(), GONE_TIMEOUT_SECONDS)

    def start(self) -> str:
        """Scale to REPLICAS; return the pod that leads once it is Ready and holds the Lease."""
        self._scale(REPLICAS)
        return install.wait_leading(self.running)

    def leader(self) -> str:
        return install.wait_leading(self.running)

    def all_running(self, timeout: float = install.READY_TIMEOUT_SECONDS) -> list[str]:
        """Wait until REPLICAS pods of it run their controller container and one of them leads; their
        names."""
        def running() -> list[str] | None:
            names = [p.metadata.name for p in self.pods() if not p.metadata.deletion_timestamp
                     and (c := _container(p)) is not None and c.state.running is not None and c.started]
            return names if len(names) == REPLICAS else None
        names = _until(f"{REPLICAS} pods of our controller running", running, timeout)
        install.wait_leading(self.running, timeout=timeout)
        return names

    # -- measuring it ---------------------------------------------------------

    def pids(self) -> dict[str, list[int]]:
        """Pod name -> the host processes of its controller container, for each pod where it runs."""
        found = {}
        for pod in self.pods():
            status = _container(pod)
            if status is not None and status.state.running is not None and status.container_id:
                found[pod.metadata.name] = node.container_pids(pod.metadata.uid, status.container_id)
        return found

    def metrics_addresses(self) -> dict[str, tuple[str, int]]:
        """Pod name -> (its IP, the port its controller container declares as `metrics`), for each pod
        that has an IP."""
        found = {}
        for pod in self.pods():
            ports = [p.container_port for c in pod.spec.containers if c.name == CONTAINER
                     for p in c.ports or [] if p.name == METRICS_PORT]
            if pod.status.pod_ip and ports:
                found[pod.metadata.name] = (pod.status.pod_ip, ports[0])
        return found

    # -- faults --------------------------------------------------------------

    def kill(self, pod: str) -> None:
        """SIGKILL POD's controller container through containerd; return once the kubelet saw it end
        (its restart count went up). A container that ended on its own between the status read here
        and the kill (e.g. a leader that lost its Lease while the apiserver was away exits) counts
        as killed: the kubelet restarts it all the same."""
        [found] = [p for p in self.pods() if p.metadata.name == pod]
        status = _container(found)
        if status is None or status.state.running is None or not status.container_id:
            raise harness.HarnessError(f"pod {pod}: its controller container is not running")
        self.running.node.kill_container(status.container_id.split("://", 1)[-1])
        before = status.restart_count
        _until(f"the kubelet to see pod {pod}'s controller killed",
               lambda: any(p.metadata.name == pod and (_container(p) is None or _container(p).restart_count > before
                                                       or _container(p).state.running is None)
                           for p in self.pods()) or None, 60.0)

    def kill_leader(self) -> str:
        """Kill the pod that holds the Lease once every replica runs; its name."""
        self.all_running()
        leader = self.leader()
        self.kill(leader)
        return leader


def _container(pod: Any) -> Any:
    return next((c for c in pod.status.container_statuses or [] if c.name == CONTAINER), None)


def _until(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    return polling.until(what, predicate, timeout=timeout, error=harness.HarnessError)


class Logbook:
    """Every controller container's log, each instance in a file of its own (see the module's doc)."""

    def __init__(self, plane: Any, log_dir: pathlib.Path) -> None:
        self.plane = plane
        self.log_dir = log_dir
        self._followed: set[str] = set()  # container ids
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        watcher = threading.Thread(target=self._watch, name="controller-logbook", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                with self.plane.api_client() as api:
                    core = kubernetes.client.CoreV1Api(api)
                    for event in kubernetes.watch.Watch().stream(
                            core.list_namespaced_pod, install.NAMESPACE, label_selector=install.SELECTOR,
                            timeout_seconds=30):
                        self._seen(event["object"])
                        if self._stop.is_set():
                            return
            except Exception:  # the apiserver restarted (a fault): watch again
                time.sleep(0.5)

    def _seen(self, pod: Any) -> None:
        status = _container(pod)
        if status is None:
            return
        last = status.last_state.terminated if status.last_state else None
        if last is not None and last.container_id:
            self._follow(pod.metadata.name, last.container_id, previous=True)
        if status.container_id and (status.state.running or status.state.terminated):
            self._follow(pod.metadata.name, status.container_id, previous=False)

    def _follow(self, pod: str, container_id: str, *, previous: bool) -> None:
        cid = container_id.split("://", 1)[-1]
        with self._lock:
            if cid in self._followed:
                return
            self._followed.add(cid)
        thread = threading.Thread(target=self._copy, args=(pod, cid, previous), daemon=True,
                                  name=f"controller-log-{pod}")
        thread.start()
        self._threads.append(thread)

    def _copy(self, pod: str, cid: str, previous: bool) -> None:
        """Append container CID's log to its file until the container has ended and its last line is
        in. A stream the apiserver cut (a restart: a fault) is opened again from the first line, and
        what the file already holds is skipped: a container's log only grows."""
        path = self.log_dir / f"{DEPLOYMENT}.{pod}.{cid[:12]}.log"
        path.touch()
        while not self._stop.is_set():
            ended = previous
            try:
                with self.plane.api_client() as api:
                    core = kubernetes.client.CoreV1Api(api)
                    if not previous:
                        status = _container(core.read_namespaced_pod(pod, install.NAMESPACE))
                        last = status.last_state.terminated if status is not None and status.last_state else None
                        if last is not None and last.container_id and cid in last.container_id:
                            previous = ended = True  # it ended and the kubelet started the next
                        elif status is None or not status.container_id or cid not in status.container_id:
                            return  # two restarts since: the kubelet no longer keeps its log
                        else:
                            ended = status.state.running is None
                    skip = path.stat().st_size
                    response = core.read_namespaced_pod_log(
                        pod, install.NAMESPACE, container=CONTAINER, follow=not ended, previous=previous,
                        _preload_content=False)
                    with path.open("ab") as out:
                        for chunk in response.stream(4096):
                            if skip >= len(chunk):
                                skip -= len(chunk)
                                continue
                            out.write(chunk[skip:])
                            skip = 0
                            out.flush()
                if ended:
                    return
            except kubernetes.client.ApiException as e:
                if e.status in (400, 404):  # the pod is gone, or this instance's log with it
                    return
                time.sleep(0.5)
            except Exception:  # the apiserver is down or cut the stream: read again
                time.sleep(0.5)

    def lines(self) -> list[tuple[str, dict[str, Any]]]:
        """(pod, record) for each JSON line every controller container printed so far."""
        found = []
        for path in sorted(self.log_dir.glob(f"{DEPLOYMENT}.*.log")):
            pod = path.name.split(".")[1]
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        found.append((pod, json.loads(line)))
                    except ValueError:
                        continue
        return found

    def tail(self, lines: int = 150) -> str:
        return "\n".join(f"---- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                         for path in sorted(self.log_dir.glob(f"{DEPLOYMENT}.*.log")))
