"""One e2e scenario's moving parts: a runtime fit for dispatch, a TrainJob
started through the toolkit, the pods the real controllers made for it, and
every execution of their trainer containers, as the real node ran them
(devcluster/node.py): the identity each one printed is read back from its
log through `pods/log`, the way a person reads it with `kubectl logs`.

The user's command (COMMAND) prints its environment, then: exits 3 if
FAIL_FIRST names a directory it can make (on a volume every execution of the
TrainJob shares, `runtime(host_dirs=...)`), so exactly the first execution
fails and JobSet restarts it; stays running until it is told to stop
(SIGTERM: a preemption, a hold, a deleted JobSet) when STAY is set; else
exits 0.

The identity rule every scenario ends with (`check_identities`): across the
executions of one TrainJob the epochs strictly increase and the attempt
tokens are distinct, except where a foreign flag was raised first. Each
execution records the TrainJob's foreign flag as it stood when its
container was first seen started (`flag_at_run`), so a scenario that resets
an identity on purpose can show which executions the rule covers and that
the flag came first.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

import kubernetes.client
import kubernetes.utils
import yaml

from devcluster import local, objects, stack as stack_mod
from toolkit import adapter, kube, names, paths, render
from toolkit import request as request_mod

IMAGE = "localhost/dispatch-base/busybox:1.35-static"
SIDECAR_RBAC = pathlib.Path(__file__).resolve().parents[1] / "deployments" / "k8s" / "base" / "sidecar"
JOB_ID = "e2e.job"  # JobIDs may hold dots: the token is parsed from the right
GENERATION, SUBMISSION, ATTEMPT = 3, 7, 1
WAIT_SECONDS = 90.0

TRAINER_CONTAINER = names.TRAINER_CONTAINER

# The user's command (see the module docstring). As PID 1 of its container the shell has no
# default SIGTERM action, hence the trap.
COMMAND = ["/bin/sh", "-c",
           'env; if [ -n "$FAIL_FIRST" ] && mkdir "$FAIL_FIRST" 2>/dev/null; then exit 3; fi; '
           '[ -n "$STAY" ] || exit 0; trap "exit 0" TERM; while :; do sleep 1 & wait $!; done']
MARKS = "/marks"  # where a scenario mounts the directory FAIL_FIRST points into


@dataclasses.dataclass(frozen=True)
class Execution:
    """One run of a trainer container, as its log tells it."""

    pod: str
    restarts: int  # the container's restartCount when read: which run of it in the pod this is
    exit_code: int | None  # None: still running when read
    log: str
    epoch: str | None
    attempt: str | None


def printed(log: str, key: str) -> str | None:
    """The value of the last `KEY=value` line of LOG (an `env` listing), or None."""
    found = None
    for line in log.splitlines():
        if line.startswith(key + "="):
            found = line[len(key) + 1:]
    return found


def container_status(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The kubelet's status of container NAME (a container or an init container, sidecars too)."""
    status = pod.get("status") or {}
    statuses = (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
    return next((dict(c) for c in statuses if c.get("name") == name), None)


def started(pod: dict[str, Any], name: str = TRAINER_CONTAINER) -> bool:
    """The container has run (running now, or terminated after it ran)."""
    state = (container_status(pod, name) or {}).get("state") or {}
    return "running" in state or "terminated" in state


def runtime(name: str, *, max_restarts: int = 2, cpu: str | None = None, image: str = IMAGE,
            host_dirs: dict[str, pathlib.Path] | None = None) -> dict[str, Any]:
    """A runtime fit for dispatch; HOST_DIRS maps a mount path in the trainer container to a
    hostPath directory (a node's disk, or the volume every rank shares)."""
    container: dict[str, Any] = {"name": "node", "image": image}
    if cpu is not None:
        container["resources"] = {"requests": {"cpu": cpu}}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if host_dirs:
        mounts = [(f"host-{i}", path, host) for i, (path, host) in enumerate(sorted(host_dirs.items()))]
        container["volumeMounts"] = [{"name": v, "mountPath": path} for v, path, _ in mounts]
        pod_spec["volumes"] = [{"name": v, "hostPath": {"path": str(host), "type": "Directory"}}
                               for v, _, host in mounts]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {"spec": {
                "failurePolicy": {"maxRestarts": max_restarts},
                "replicatedJobs": [{
                    "name": names.TRAINER_REPLICATED_JOB,
                    "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"template": {"spec": pod_spec}},
                    },
                }],
            }},
        },
    }


class Scenario:
    """One TrainJob's life, and every execution the test ran for its pods."""

    def __init__(self, stack: stack_mod.Stack, api: kubernetes.client.ApiClient, namespace: str, *,
                 service_account: bool = True) -> None:
        self.stack = stack
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.client = kube.from_api_client(api)
        self.namespace = namespace
        self.name = ""
        self.job_id = JOB_ID
        self.executions: list[Execution] = []
        self.flag_at_run: list[str | None] = []  # the foreign annotation when each execution was first seen
        self.seen_pods: set[str] = set()
        self.flagged: str | None = None  # the foreign flag once seen (it stays known after an adopt clears it)
        # The sidecar's ServiceAccount, Role and RoleBinding, as deployments/k8s/base/sidecar ships them
        # (once per namespace: a second scenario in it finds them there).
        if service_account:
            for path in sorted(SIDECAR_RBAC.glob("*.yaml")):
                if path.name == "kustomization.yaml":
                    continue
                try:
                    kubernetes.utils.create_from_dict(api, yaml.safe_load(path.read_text()), namespace=namespace)
                except kubernetes.utils.FailToCreateError as e:
                    if any(x.status != 409 for x in e.api_exceptions):
                        raise

    def create_runtime(self, doc: dict[str, Any], *, fit: bool = True) -> None:
        body = render.runtime(doc, sidecar_image=getattr(self.stack, "sidecar_image", None) or local.SIDECAR_IMAGE) if fit else doc
        self.custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", self.namespace,
                                                    "trainingruntimes", body)

    def start(self, runtime: str, *, env: dict[str, str] | None = None, queue: str | None = None,
              job_id: str = JOB_ID, labels: dict[str, str] | None = None,
              command: list[str] | None = None) -> None:
        extra: dict[str, Any] = {"mode": "kueue", "queueName": queue} if queue else {}
        req = request_mod.from_dict({**extra,
            "jobId": job_id, "generation": GENERATION, "submission": SUBMISSION, "attempt": ATTEMPT,
            "command": command or COMMAND, "namespace": self.namespace,
            "runtimeRef": {"kind": "TrainingRuntime", "name": runtime},
            "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        })
        self.name = req.name
        self.job_id = job_id
        trainjob = render.trainjob(req)
        trainjob["metadata"].setdefault("labels", {}).update(labels or {})
        started = objects.once_the_runtime_is_seen(lambda: adapter.start(self.client, trainjob=trainjob))
        assert started.created

    def pods(self) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_pod(self.namespace,
                                               label_selector=f"{names.JOBSET_NAME_LABEL}={self.name}")
        return [self.api.sanitize_for_serialization(p) for p in listed.items]

    def wait(self, what: str, predicate: Any, *, timeout: float = WAIT_SECONDS) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.stack.check_alive()
            value = predicate()
            if value:
                return value
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; pods: "
                             f"{[(p['metadata']['name'], p['status'].get('phase')) for p in self.pods()]}; "
                             f"workloads: {self._workloads()}")

    def _workloads(self) -> list[Any]:
        listed = self.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.namespace, "workloads")
        return [(w["metadata"]["name"], (w.get("status") or {}).get("conditions"),
                 (w.get("status") or {}).get("admissionChecks")) for w in listed["items"]]

    def pod(self, name: str) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(self.core.read_namespaced_pod(name, self.namespace)))

    def new_pods(self) -> list[dict[str, Any]]:
        """Wait for pods not seen before whose trainer container the kubelet has started (it may
        have ended already), and mark them seen."""
        def ready() -> list[dict[str, Any]] | None:
            fresh = [p for p in self.pods() if p["metadata"]["uid"] not in self.seen_pods
                     and not p["metadata"].get("deletionTimestamp")]
            if fresh and all(started(p) for p in fresh):
                return fresh
            return None
        pods = self.wait("new pods with their trainer container started", ready)
        for pod in pods:
            self.seen_pods.add(pod["metadata"]["uid"])
        return pods

    def log(self, pod: dict[str, Any], container: str = TRAINER_CONTAINER, *, previous: bool = False) -> str:
        return str(self.core.read_namespaced_pod_log(pod["metadata"]["name"], self.namespace, container=container,
                                                     previous=previous))

    def run(self, pod: dict[str, Any], *, until_exit: bool = False) -> Execution:
        """The execution of POD's trainer container: its identity inputs checked, the identity it
        printed read from its log (waited for), its exit code if it has ended (UNTIL_EXIT: wait
        for that); recorded in `executions`."""
        meta = pod["metadata"]
        assert names.ADMISSION_ANNOTATION in (meta.get("annotations") or {}), meta
        assert names.RESTART_LABEL in (meta.get("labels") or {}), meta
        init = [c["name"] for c in pod["spec"].get("initContainers") or []]
        assert names.SIDECAR_CONTAINER in init, init
        flag = self.foreign()
        name = meta["name"]

        def seen() -> Execution | None:
            now = self.pod(name)
            status = container_status(now, TRAINER_CONTAINER) or {}
            ended = ((status.get("state") or {}).get("terminated") or {})
            if until_exit and not ended:
                return None
            text = self.log(now)
            if printed(text, "DISPATCH_ATTEMPT") is None and not ended:
                return None
            return Execution(pod=name, restarts=int(status.get("restartCount") or 0),
                             exit_code=ended.get("exitCode") if ended else None, log=text,
                             epoch=printed(text, "DISPATCH_EPOCH"), attempt=printed(text, "DISPATCH_ATTEMPT"))
        result = self.wait(f"the identity printed by {name}", seen)
        assert result.epoch is not None and result.attempt is not None, result.log
        a, j = meta["annotations"][names.ADMISSION_ANNOTATION], meta["labels"][names.RESTART_LABEL]
        assert result.attempt == f"{self.job_id}.{SUBMISSION}.{ATTEMPT}.{a}.{j}"
        assert int(result.epoch) == GENERATION * 10**12 + SUBMISSION * 10**6 + int(a) + int(j)
        self.executions.append(result)
        self.flag_at_run.append(flag)
        return result

    def sidecar_lines(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON log lines of the pod's real sidecar verifier (a native sidecar the kubelet ran)."""
        lines = []
        for line in self.log(pod, names.SIDECAR_CONTAINER).splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines

    def sidecar_verdicts(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        return [line for line in self.sidecar_lines(pod) if line.get("message") == "verdict"]

    def events(self, reason: str) -> list[dict[str, Any]]:
        """Events about this TrainJob with REASON."""
        listed = self.core.list_namespaced_event(self.namespace,
                                                 field_selector=f"involvedObject.name={self.name},reason={reason}")
        return [self.api.sanitize_for_serialization(e) for e in listed.items]

    def trainjob(self) -> dict[str, Any]:
        return self.client.get(paths.TRAINJOB, name=self.name, namespace=self.namespace)

    def foreign(self) -> str | None:
        """The TrainJob's foreign flag (the causes, one a line), or None."""
        return (self.trainjob()["metadata"].get("annotations") or {}).get(names.FOREIGN_ANNOTATION)

    def workload(self) -> dict[str, Any]:
        """The one Kueue Workload this TrainJob owns."""
        listed = self.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.namespace, "workloads")
        owned = [w for w in listed["items"] if any(
            ref.get("kind") == "TrainJob" and ref.get("name") == self.name
            for ref in w["metadata"].get("ownerReferences") or [])]
        assert len(owned) == 1, [w["metadata"]["name"] for w in owned]
        return dict(owned[0])

    def jobset(self) -> dict[str, Any] | None:
        try:
            return self.client.get(paths.JOBSET, name=self.name, namespace=self.namespace)
        except kube.NotFound:
            return None

    def check_identities(self, *, resets: list[Execution] | None = None) -> None:
        """The identity rule over this scenario's executions (`identity_rule`)."""
        identity_rule(self.executions, self.flag_at_run, resets=resets or [])


def identity_rule(executions: list[Execution], flags: list[str | None], *,
                  resets: list[Execution]) -> None:
    """Each execution's epoch is above every earlier one's and its token is
    new (so across the executions before the foreign flag the epochs strictly
    increase and the tokens are distinct), unless the flag (`flags`, as it
    stood when each was first seen) was already raised when it ran. `resets` are
    executions a scenario made repeat an identity on purpose before the flag
    could be raised (the detection races the pods); the scenario asserts their
    flag itself."""
    assert len(flags) == len(executions)
    exempt = {id(e) for e in resets}
    for i, (e, flag) in enumerate(zip(executions, flags)):
        repeats = [x for x in executions[:i] if int(x.epoch or 0) >= int(e.epoch or 0) or x.attempt == e.attempt]
        if repeats and not flag and id(e) not in exempt:
            raise AssertionError(
                f"execution {i} ({e.pod}: epoch {e.epoch}, token {e.attempt}) does not follow "
                f"{[(x.pod, x.epoch, x.attempt) for x in repeats]}, and no foreign flag was raised before it ran; "
                f"all: {[(x.epoch, x.attempt) for x in executions]}")


KUEUE_API = ("kueue.x-k8s.io", "v1beta2")


def kueue_queues(api: kubernetes.client.ApiClient, *, suffix: str, namespace: str, check_controller: str,
                 cpu: str = "1500m", check: bool = True, flavor: dict[str, Any] | None = None) -> None:
    """ResourceFlavor, an AdmissionCheck served by `check_controller`, a
    ClusterQueue of `cpu` (room for one TrainJob of 1 CPU; the sidecar's
    requests are CPU and memory, so both are covered) that requires the check
    (unless CHECK is false: the same queue without it, the baseline of
    bench/admission) and preempts lower priorities, a LocalQueue `lq` in
    `namespace`, and two WorkloadPriorityClasses `low-<suffix>` and
    `high-<suffix>`. FLAVOR: the ResourceFlavor's spec (e.g. stack.KWOK_FLAVOR:
    what it admits runs on kwok's nodes)."""
    custom = kubernetes.client.CustomObjectsApi(api)

    def create(plural: str, body: dict[str, Any], ns: str | None = None) -> None:
        body = {"apiVersion": "/".join(KUEUE_API), **body}
        if ns:
            custom.create_namespaced_custom_object(*KUEUE_API, ns, plural, body)
        else:
            custom.create_cluster_custom_object(*KUEUE_API, plural, body)

    create("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": f"rf-{suffix}"},
                               **({"spec": flavor} if flavor else {})})
    create("admissionchecks", {"kind": "AdmissionCheck", "metadata": {"name": f"ac-{suffix}"},
                               "spec": {"controllerName": check_controller}})
    strategy = {"admissionChecksStrategy": {"admissionChecks": [{"name": f"ac-{suffix}"}]}} if check else {}
    create("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": f"cq-{suffix}"}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
            {"name": f"rf-{suffix}", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                   {"name": "memory", "nominalQuota": "64Gi"}]}]}],
        **strategy,
        "preemption": {"withinClusterQueue": "LowerPriority"},
    }})
    for name, value in (("low", 10), ("high", 1000)):
        create("workloadpriorityclasses", {"kind": "WorkloadPriorityClass",
                                           "metadata": {"name": f"{name}-{suffix}"}, "value": value})
    create("localqueues", {"kind": "LocalQueue", "metadata": {"name": "lq"},
                           "spec": {"clusterQueue": f"cq-{suffix}"}}, ns=namespace)
