"""The dispatch stage of `make demo`: the run queue through the dispatcher onto the real node.

The dispatcher runs as a user runs it: the release's dispatcher.yaml applied as released (its
Namespace, ServiceAccount, Role and Deployment; the image pinned by digest, pulled from the
cluster's registry by the kubelet), then configured as a user's overlay would (the Deployment's
env: the in-flight cap, the driver's memory request, the log tail) and given the Secret it
needs (the backend's URL and service token). The reference backend (real HTTP, real SQLite) is
bound to the node's address so that the dispatcher's pod and the drivers reach it. 20 runs under
two harnesses with limits of their own are claimed under the global in-flight cap, one driver Job
per run. Every driver is the release's test driver image (images/test-driver/driver), run by the
kubelet: each reports running and succeeded to the backend itself and exits 0; one grows until the
kernel kills it under the namespace's LimitRange (OOMKilled, 137), and the dispatcher reports it
with the real tail of its log and reaps the sandbox pod it left running. Scaled to zero, the
dispatcher's pod stops on SIGTERM with exit 0.

It checks every outcome with `demo_output.expect`.
"""

from __future__ import annotations

import collections
import re
import time
from typing import Any

import kubernetes.client
import kubernetes.watch
import yaml

from devcluster import demo_output as out
from devcluster import install, node, runqueue
from devcluster import stack as stack_mod
from dispatcher import jobspec, names

PART = "dispatcher.yaml"
HARNESSES = {"swe-bench": 3, "gpu-eval": 2}  # harness -> its max_parallel in the backend
RUNS = {"swe-bench": 12, "gpu-eval": 8}
MAX_INFLIGHT = 4  # the dispatcher's global cap, below the harnesses' 3 + 2
SANDBOX_IMAGE = "localhost/dispatch-base/busybox:1.35-static"
MEMORY_LIMIT = "48Mi"  # every container's without a limit, from the LimitRange: the OOM driver passes it in under a second
DRIVER_MEMORY_REQUEST = "16Mi"  # below the limit (a request above it is refused at admission)
# The test driver only reports to the backend: four of them fit beside the story's two TrainJobs.
DRIVER_CPU_REQUEST = "10m"
LOG_TAIL_LINES = 3
# The demo's configuration of the released Deployment, as a user's overlay sets it.
SETTINGS = {"TCAB_DISPATCHER_MAX_INFLIGHT": str(MAX_INFLIGHT),
            "TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST": DRIVER_MEMORY_REQUEST,
            "TCAB_DISPATCHER_DRIVER_CPU_REQUEST": DRIVER_CPU_REQUEST,
            "TCAB_DISPATCHER_LOG_TAIL_LINES": str(LOG_TAIL_LINES),
            "TCAB_DISPATCHER_POLL_INTERVAL": "0.5"}
OOM_LOG_TAIL = "step 40: loss 1.95\nstep 41: loss 1.92\nallocating 80 GiB for the KV cache\n"
TIMEOUT = 180.0
POD_TIMEOUT = 120.0


class Released:
    """What dispatcher.yaml installs, read from the file itself."""

    def __init__(self, text: str) -> None:
        docs = [d for d in yaml.safe_load_all(text) if d]
        self.namespace: str = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        self.deployment: str = deployment["metadata"]["name"]
        self.selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        self.container: str = container["name"]
        env = {e["name"]: e for e in container.get("env", [])}
        self.secret: str = env["TCAB_BACKEND_URL"]["valueFrom"]["secretKeyRef"]["name"]
        self.driver_image: str = env["TCAB_DISPATCHER_DRIVER_IMAGE"]["value"]


def _of_another_cluster(process: str, stack: stack_mod.Stack) -> bool:
    """PROCESS ('PID: COMMAND') names the directory of another local cluster and not this one's: a
    test of another checkout on this host runs its controller against its own control plane (the
    host has one node slot, not one control plane). Anything else counts against this cluster."""
    named = set(re.findall(r"/(dispatch-cp-[^/\s]+)", process))
    return bool(named) and stack.plane.workdir.name not in named


def stage(stack: stack_mod.Stack) -> None:
    installed = stack.installed
    out.expect(installed is not None, "the release is installed")
    release = installed.release
    shipped = Released(release.files[PART].read_text())
    ns = shipped.namespace
    out.say(f"dispatch: the release's {PART} applied as released; the reference backend, "
            f"{sum(RUNS.values())} runs under two harnesses "
            f"({', '.join(f'{h} max {n}' for h, n in HARNESSES.items())}); the dispatcher's pod, cap {MAX_INFLIGHT}; "
            f"namespace {ns}")
    with stack.plane.api_client() as api, runqueue.Backend(host=node.NODE_IP) as backend:
        core = kubernetes.client.CoreV1Api(api)
        apps = kubernetes.client.AppsV1Api(api)
        batch = kubernetes.client.BatchV1Api(api)
        applied = install.apply(stack, release, PART)
        out.say(f"  {PART} applied as released: sha256 {applied}")
        core.create_namespaced_limit_range(ns, {"metadata": {"name": "memory"}, "spec": {"limits": [
            {"type": "Container", "default": {"memory": MEMORY_LIMIT}}]}})
        apps.patch_namespaced_deployment(shipped.deployment, ns, {"spec": {"template": {"spec": {"containers": [
            {"name": shipped.container, "env": [{"name": k, "value": v} for k, v in SETTINGS.items()]}]}}}})
        out.say("  configured as a user's overlay would: " + ", ".join(f"{k}={v}" for k, v in SETTINGS.items()))
        for harness_name, limit in HARNESSES.items():
            backend.limit(harness_name, limit)
        runs: dict[str, dict[str, str]] = {}
        for harness_name, count in RUNS.items():
            for i in range(count):
                # The first swe-bench run's driver is OOM-killed; every other one succeeds.
                driver = "oom" if not runs else "succeed"
                run = backend.enqueue(harness_name, {"task": f"{harness_name}/{i}", "driver": driver, "running": True})
                runs[run["id"]] = {**run, "harness": harness_name}
        oom = next(iter(runs))
        sandbox = f"sandbox-{oom}"
        _start_sandbox(core, ns, oom, sandbox)
        # Only the configured template's pod may start: the Secret is made once the shipped
        # template's pod (waiting for it) is gone (the Deployment recreates, never overlaps).
        out.wait_until(lambda: _configured_only(core, shipped), "only the configured dispatcher pod left",
                       timeout=POD_TIMEOUT)
        core.create_namespaced_secret(ns, {"metadata": {"name": shipped.secret},
                                           "stringData": {"url": backend.url, "token": backend.token}})
        pod = _running_pod(core, shipped)
        reference = release.references["dispatcher"]
        expected_id = f"{reference.split('@')[0].rsplit(':', 1)[0]}@{reference.split('@')[1]}"
        image_ids = {s.image_id for s in pod.status.container_statuses or []}
        out.expect(image_ids == {expected_id}, f"the dispatcher's pod runs {expected_id} (got {sorted(image_ids)})")
        out.say(f"  pod {ns}/{pod.metadata.name} Running on {pod.spec.node_name} as "
                f"{pod.spec.service_account_name}: imageID {expected_id}; drivers run {shipped.driver_image}")
        outside = [line for line in install.ours_outside_pods() if not _of_another_cluster(line, stack)]
        out.expect(not outside, f"no process outside the kubelet's pods runs our controller or dispatcher: {outside}")
        out.say("  no process outside the kubelet's pods runs our controller or dispatcher")
        peak, by_harness, seen_jobs = _watch(stack, batch, backend, runs, ns)
        out.wait_until(lambda: sandbox not in {p.metadata.name for p in core.list_namespaced_pod(ns).items},
                       "the sandbox pod reaped")
        stopped = _scale_to_zero(core, apps, shipped, pod.metadata.name)
        out.expect(stopped == 0, f"the dispatcher's pod stops on SIGTERM with exit 0 (got {stopped})")
        states = collections.Counter(backend.get(i)["state"] for i in runs)
        out.expect(states == {"succeeded": len(runs) - 1, "failed": 1},
                   f"{len(runs) - 1} runs succeeded and 1 failed (got {states})")
        out.expect(seen_jobs == {jobspec.job_name(i) for i in runs}, "exactly one driver Job per run")
        out.expect(peak == MAX_INFLIGHT, f"the in-flight cap {MAX_INFLIGHT} was reached and held (peak {peak})")
        for harness_name, limit in HARNESSES.items():
            out.expect(by_harness[harness_name] <= limit,
                       f"{harness_name} never had more than {limit} in flight (peak {by_harness[harness_name]})")
        out.say(f"  all {len(runs)} runs done: {states['succeeded']} succeeded, {states['failed']} failed; "
                f"one Job per run; peak in flight {peak} (cap {MAX_INFLIGHT}); per harness "
                f"{', '.join(f'{h} {by_harness[h]}/{n}' for h, n in HARNESSES.items())}")
        reports = [r for r in backend.get(oom)["reports"] if r["body"].get("status") == "failed"]
        out.expect(len(reports) == 1, f"the OOM-killed driver's death was reported once (got {len(reports)})")
        error = reports[0]["body"]["error"]
        out.expect((error["reason"], error["exit_code"]) == ("OOMKilled", 137),
                   f"the report says OOMKilled, exit 137 (got {error['reason']}, {error['exit_code']})")
        out.expect(error["log_tail"] == OOM_LOG_TAIL,
                   f"the report quotes the last {LOG_TAIL_LINES} lines of the driver's log (got {error['log_tail']!r})")
        out.say(f"  run {oom}: its driver was OOM-killed by the kernel ({MEMORY_LIMIT} limit) and reported failed: "
                f"reason {error['reason']}, exit code {error['exit_code']}, log tail {error['log_tail']!r}")
        out.say(f"  its orphaned sandbox pod {sandbox} was reaped; the dispatcher's pod stopped on SIGTERM, exit 0")


def _env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for c in pod.spec.containers for e in c.env or [] if e.value is not None}


def _configured_only(core: Any, shipped: Released) -> bool:
    pods = core.list_namespaced_pod(shipped.namespace, label_selector=shipped.selector).items
    return bool(pods) and all(SETTINGS.items() <= _env(p).items() for p in pods)


def _running_pod(core: Any, shipped: Released) -> Any:
    """The dispatcher's one pod, once its container runs."""
    found: list[Any] = []

    def running() -> bool:
        pods = core.list_namespaced_pod(shipped.namespace, label_selector=shipped.selector).items
        found[:] = [p for p in pods if any(s.state.running for s in p.status.container_statuses or [])]
        return len(found) == 1 and len(pods) == 1

    out.wait_until(running, "the dispatcher's pod running", timeout=POD_TIMEOUT)
    return found[0]


def _scale_to_zero(core: Any, apps: Any, shipped: Released, pod: str) -> int | None:
    """Scale the Deployment to zero and follow its pod until it is gone: its container's exit code
    as the kubelet reported it."""
    start = core.read_namespaced_pod(pod, shipped.namespace).metadata.resource_version
    apps.patch_namespaced_deployment_scale(shipped.deployment, shipped.namespace, {"spec": {"replicas": 0}})
    code: int | None = None
    stream = kubernetes.watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, shipped.namespace, field_selector=f"metadata.name={pod}",
                               resource_version=start, timeout_seconds=int(POD_TIMEOUT)):
        for status in event["object"].status.container_statuses or []:
            if status.state.terminated is not None:
                code = status.state.terminated.exit_code
        if event["type"] == "DELETED":
            stream.stop()
    return code


def _start_sandbox(core: Any, namespace: str, run_id: str, name: str) -> None:
    """The sandbox pod the OOM-killed driver leaves behind: labelled as a driver labels its sandboxes
    (the run's id, the driver's managed-by), a real container that runs until deleted. Started before
    the driver, so that it is Running when the driver dies."""
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": name, "labels": {names.JOB_ID_LABEL: jobspec.job_id_label(run_id),
                                              names.MANAGED_BY_LABEL: names.DRIVER_MANAGED_BY}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "sandbox", "image": SANDBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]}})
    out.wait_until(lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running", f"{name} Running")
    out.say(f"  run {run_id}: its sandbox pod {name} is Running on the node")


def _watch(stack: stack_mod.Stack, batch: Any, backend: runqueue.Backend, runs: dict[str, dict[str, str]],
           namespace: str) -> tuple[int, collections.Counter[str], set[str]]:
    """Watch until every run has ended: the peak of unfinished driver Jobs (the dispatcher's cap), the
    peak of runs in flight per harness at the backend (the harness limits), every Job name seen."""
    peak, by_harness, seen = 0, collections.Counter[str](), set[str]()
    deadline = time.monotonic() + TIMEOUT
    said = 0
    while True:
        stack.check_alive()
        jobs = batch.list_namespaced_job(namespace, label_selector=jobspec.selector()).items
        seen |= {j.metadata.name for j in jobs}
        peak = max(peak, sum(1 for j in jobs if jobspec.finished(_dict(batch, j)) is None))
        states = {r["id"]: r["state"] for r in backend.runs()}
        for harness_name, n in collections.Counter(
                runs[i]["harness"] for i, s in states.items() if s in ("claimed", "running")).items():
            by_harness[harness_name] = max(by_harness[harness_name], n)
        ended = sum(s in ("succeeded", "failed") for s in states.values())
        if ended >= said + 5:
            said = ended - ended % 5
            out.say(f"  {ended}/{len(runs)} runs ended")
        if ended == len(runs):
            return peak, by_harness, seen
        out.expect(time.monotonic() < deadline, f"every run ended within {TIMEOUT:.0f} s ({ended}/{len(runs)})")
        time.sleep(0.2)


def _dict(batch: Any, job: Any) -> dict[str, Any]:
    return dict(batch.api_client.sanitize_for_serialization(job))
