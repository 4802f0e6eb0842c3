"""Helpers for the dispatcher's cluster tests: the release's dispatcher pod, the test driver.

The tests run on the local cluster's real node (tests/dispatcher/conftest.py): the dispatcher is
the release's pod (devcluster/dispatcher_pod.py), under the shipped Role; the kubelet starts each
driver pod from the Job the dispatcher made, in the release's test driver image
(images/test-driver/driver), whose behaviour each run's launch request picks (`launch`). The
reference backend binds the node's address, so the dispatcher's pod and the drivers reach it.
"""

from __future__ import annotations

import base64
import collections
import threading
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.stream
import kubernetes.watch

from devcluster import dispatcher_pod, node, runqueue
from dispatcher import names
from tests import waiting

SANDBOX_IMAGE = "localhost/dispatch-base/busybox:1.35-static"
BACKEND_HOST = node.NODE_IP  # where pods reach a host service
OOM_LIMIT = "48Mi"  # the memory limit of `limit_memory`: `tail /dev/zero` passes it in well under a second
DRIVER_MEMORY_REQUEST = "16Mi"  # a driver's request where a limit is set (a request may not exceed it)
# What every test's dispatcher runs with unless the test says otherwise: a quick loop, every line.
TEST_SETTINGS = {"TCAB_DISPATCHER_POLL_INTERVAL": "0.1", "TCAB_DISPATCHER_LOG_LEVEL": "debug"}


def launch(driver: str, *, running: bool = False, wait: bool = False, **extra: Any) -> dict[str, Any]:
    """A launch request for the test driver: report running first if RUNNING, then wait for
    `release` if WAIT, then end as DRIVER (succeed, fail, oom or leak). A run enqueued without one
    gets a driver that waits for `release` and exits 0, reporting nothing."""
    return {"driver": driver, **({"running": True} if running else {}), **({"wait": True} if wait else {}), **extra}


def wait(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
    return waiting.until(what, predicate, timeout=timeout, interval=0.1)


class Dispatcher(dispatcher_pod.Pod):
    """The release's dispatcher as the pod of its Deployment in NAMESPACE (installed there by the
    `rbac_kubeconfig` fixture), configured with TEST_SETTINGS and ENV as an overlay would, and given
    BACKEND's URL and service token in its Secret. `env`: the settings it runs with, as the
    dispatcher reads them."""

    def __init__(self, api: kubernetes.client.ApiClient, *, namespace: str, backend: runqueue.Client,
                 **env: str) -> None:
        super().__init__(api, namespace)
        self.configure({**TEST_SETTINGS, **env})
        self.give_backend(backend.url, backend.token)
        self.env.pop("TCAB_DISPATCHER_HEARTBEAT_FILE", None)  # the pod's own directory
        self.env.update(TCAB_BACKEND_URL=backend.url, TCAB_BACKEND_SERVICE_TOKEN=backend.token,
                        TCAB_DISPATCHER_NAMESPACE=namespace)

    def close(self, *, show: bool = True) -> None:
        try:
            super().close()
        finally:
            if show:
                print("dispatcher log tail:\n" + self.text()[-4000:])  # shown by pytest when a test failed


def jobs(api: kubernetes.client.ApiClient, namespace: str) -> list[Any]:
    return list(kubernetes.client.BatchV1Api(api).list_namespaced_job(namespace).items)


def unfinished(job: Any) -> bool:
    return not any(c.type in ("Complete", "Failed") and c.status == "True" for c in (job.status.conditions or []))


def driver_pod(api: kubernetes.client.ApiClient, namespace: str, job_name: str) -> Any:
    pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}").items
    return pods[0] if pods else None


def release(api: kubernetes.client.ApiClient, namespace: str, pod: str) -> None:
    """Let a waiting test driver (images/test-driver/driver) go on: `touch /tmp/release` in its
    container, through pods/exec (the apiserver asks the node's kubelet)."""
    client = kubernetes.stream.stream(kubernetes.client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod,
                                      namespace, container="driver", command=["touch", "/tmp/release"], stderr=True,
                                      stdin=False, stdout=True, tty=False, _preload_content=False)
    try:
        client.run_forever(timeout=30)  # until the command ends and the kubelet closes the stream
        code = client.returncode  # from the error channel: read it before read_all empties the buffers
        out = client.read_all()
        assert code == 0 and out == "", f"exec in {pod}: {code} {out}"
    finally:
        client.close()
        client.sock.shutdown()  # close() returns early once the kubelet has closed the stream, socket left open


def limit_memory(api: kubernetes.client.ApiClient, namespace: str, limit: str = OOM_LIMIT) -> None:
    """A LimitRange giving every container in NAMESPACE a memory limit (the driver Job sets none), so
    a driver that grows is killed by the kernel. Driver memory requests must stay below it."""
    kubernetes.client.CoreV1Api(api).create_namespaced_limit_range(namespace, {
        "metadata": {"name": "driver-memory"},
        "spec": {"limits": [{"type": "Container", "default": {"memory": limit},
                             "defaultRequest": {"memory": DRIVER_MEMORY_REQUEST}}]}})


def sandbox_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A sandbox pod as a driver makes one (it labels it with the run's id and its own managed-by):
    a real container that runs until deleted, and goes within a second when it is."""
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "sandbox", "image": SANDBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}}]}}


def terminated(pod: Any) -> Any:
    """The driver container's terminated state, or None."""
    for status in (pod.status.container_statuses or []) if pod is not None else []:
        if status.name == "driver" and status.state and status.state.terminated:
            return status.state.terminated
    return None


def job_token(api: kubernetes.client.ApiClient, namespace: str, job_name: str) -> str:
    secret = kubernetes.client.CoreV1Api(api).read_namespaced_secret(job_name, namespace)
    return base64.b64decode((secret.data or {})[names.TOKEN_KEY]).decode()  # KeyError for a tombstone


def control_plane_client(api: kubernetes.client.ApiClient) -> kubernetes.client.ApiClient:
    """A second admin client on the same configuration (a watch holds its connection)."""
    return kubernetes.client.ApiClient(api.configuration)


class _Watch(threading.Thread):
    """One kind of object in a namespace through a watch that starts with a list and misses no
    change after: `_see(event_type, obj)` for each (ADDED for the listed ones). Short watches, each
    resumed from the last resourceVersion, so it ends soon after `stop`; a watch that dies fails
    `check`."""

    KIND = ""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, list_call: Callable[..., Any]) -> None:
        super().__init__(daemon=True)
        self.api, self.namespace, self.list_call = api, namespace, list_call
        self.stopping = threading.Event()
        self.listed = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        version = ""
        try:
            while not self.stopping.is_set():
                if not version:
                    listing = self.list_call(self.namespace)
                    version = listing.metadata.resource_version
                    for obj in listing.items:
                        self._see("ADDED", obj)
                    self.listed.set()
                try:
                    for event in kubernetes.watch.Watch().stream(self.list_call, self.namespace, timeout_seconds=2,
                                                                 resource_version=version):
                        obj = event["object"]
                        version = obj.metadata.resource_version
                        self._see(event["type"], obj)
                except kubernetes.client.ApiException as e:
                    if e.status != 410:
                        raise
                    version = ""  # expired: list again (a change between is still seen in the list)
        except BaseException as e:  # noqa: BLE001 (kept for `check`; a dead watch must fail the test)
            self.failure = e
        finally:
            self.api.close()

    def _see(self, event_type: str, obj: Any) -> None:
        raise NotImplementedError

    def check(self) -> None:
        if self.failure is not None or not self.is_alive():
            raise AssertionError(f"the {self.KIND} watch ended: {self.failure!r}")

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
        assert not self.is_alive(), f"the {self.KIND} watch did not end"


class PodWatch(_Watch):
    """What the kubelet did with every pod of a namespace: which driver Jobs (by uid, per Job name)
    had their driver container started, the exit code of each driver container that ran, every
    waiting reason seen, and why each pod that failed did (its phase's reason and message)."""

    KIND = "pod"

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        client = control_plane_client(api)
        super().__init__(client, namespace, kubernetes.client.CoreV1Api(client).list_namespaced_pod)
        self.started: dict[str, set[str]] = collections.defaultdict(set)  # Job name -> uids of its Jobs that ran
        self.exits: dict[str, int] = {}  # pod -> its driver container's exit code
        self.waiting: dict[str, set[str]] = collections.defaultdict(set)  # pod -> waiting reasons
        self.failed: dict[str, str] = {}  # pod of a Job -> "Job name: reason: message" once the pod failed

    def _see(self, event_type: str, pod: Any) -> None:
        job = (pod.metadata.labels or {}).get("batch.kubernetes.io/job-name")
        owners = [o.uid for o in pod.metadata.owner_references or [] if o.kind == "Job"]
        if job and pod.status.phase == "Failed":
            ended = [f"{c.name} {c.state.terminated.reason} {c.state.terminated.exit_code}"
                     for c in pod.status.container_statuses or [] if c.state and c.state.terminated]
            self.failed[pod.metadata.name] = (f"{job}: {pod.status.reason}: {pod.status.message}: {ended}; "
                                              f"deleted at {pod.metadata.deletion_timestamp}")
        for status in pod.status.container_statuses or []:
            if status.name != "driver" or status.state is None:
                continue
            state = status.state
            if state.waiting is not None and state.waiting.reason:
                self.waiting[pod.metadata.name].add(state.waiting.reason)
            ran = state.running is not None or (state.terminated is not None and state.terminated.started_at)
            if ran and job and owners:
                self.started[job].add(owners[0])
            if state.terminated is not None and state.terminated.started_at:  # not a container never made
                self.exits[pod.metadata.name] = state.terminated.exit_code


class Dispatches:
    """Every driver Job of a namespace and every token Secret, through two watches, for the
    in-flight count as the cap means it: Jobs unfinished whose driver can still run, so a Job whose
    Secret is the tombstone (its container can never start) does not count.

    Each change is recorded with its resourceVersion and the count is replayed in that order: the
    two watches deliver independently, but the apiserver's resourceVersions (etcd's revisions) order
    all writes of one cluster, so a tombstone written before the Job that took its slot is seen
    before it. `uids` (Job name -> the uids of its Jobs) and `unfinished` (Job name -> unfinished)
    are kept as the changes come."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.lock = threading.Lock()
        self.changes: list[tuple[int, str, str, str, bool]] = []  # (rv, "job"|"secret", name, uid, flag)
        self.uids: dict[str, set[str]] = collections.defaultdict(set)
        self.unfinished: dict[str, bool] = {}
        jobs_client, secrets_client = control_plane_client(api), control_plane_client(api)
        self.watches = [
            _Recorder("job", jobs_client, namespace, kubernetes.client.BatchV1Api(jobs_client).list_namespaced_job,
                      self._job),
            _Recorder("secret", secrets_client, namespace,
                      kubernetes.client.CoreV1Api(secrets_client).list_namespaced_secret, self._secret)]

    def _job(self, event_type: str, job: Any) -> None:
        name, uid = job.metadata.name, job.metadata.uid
        with self.lock:
            self.uids[name].add(uid)
            if event_type == "DELETED":
                self.unfinished.pop(name, None)
            else:
                self.unfinished[name] = unfinished(job)
            self.changes.append((int(job.metadata.resource_version), "job", name, uid,
                                 event_type != "DELETED" and unfinished(job)))

    def _secret(self, event_type: str, secret: Any) -> None:
        owners = [o.uid for o in secret.metadata.owner_references or [] if o.kind == "Job"]
        if owners and event_type != "DELETED":
            tombstone = names.TOKEN_KEY not in (secret.data or {})
            with self.lock:
                self.changes.append((int(secret.metadata.resource_version), "secret", secret.metadata.name, owners[0],
                                     tombstone))

    def start(self) -> None:
        for w in self.watches:
            w.start()
        for w in self.watches:
            w.listed.wait(timeout=30)

    def check(self) -> None:
        for w in self.watches:
            w.check()

    def stop(self) -> None:
        for w in self.watches:
            w.stop()

    def of(self, names: set[str]) -> list[tuple[int, str, str, str, bool]]:
        """The changes recorded for NAMES, in resourceVersion order."""
        with self.lock:
            return sorted(c for c in self.changes if c[2] in names)

    def peak(self, names: set[str] | None = None) -> tuple[int, list[str]]:
        """The most Jobs in flight at once (of NAMES only, if given), and which they were."""
        with self.lock:
            changes = sorted(self.changes)
        jobs: dict[str, tuple[str, bool]] = {}  # name -> (uid, unfinished)
        tombstoned: set[str] = set()  # Job uids
        best: tuple[int, list[str]] = (0, [])
        for _, kind, name, uid, flag in changes:
            if kind == "secret":
                if flag:
                    tombstoned.add(uid)
                continue
            jobs[name] = (uid, flag)
            flying = sorted(n for n, (u, on) in jobs.items() if on and u not in tombstoned
                            and (names is None or n in names))
            if len(flying) > best[0]:
                best = (len(flying), flying)
        return best


class _Recorder(_Watch):
    """A watch that hands each change to SEE."""

    def __init__(self, kind: str, api: kubernetes.client.ApiClient, namespace: str, list_call: Callable[..., Any],
                 see: Callable[[str, Any], None]) -> None:
        super().__init__(api, namespace, list_call)
        self.KIND, self.see = kind, see

    def _see(self, event_type: str, obj: Any) -> None:
        self.see(event_type, obj)
