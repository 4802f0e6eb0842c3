"""The dispatch stage of `make demo`: the run queue through the dispatcher onto the real node.

The reference backend (real HTTP, real SQLite), bound to the node's address so that drivers can
reach it, and the dispatcher under its shipped Role: 20 runs under two harnesses with limits of
their own, claimed under a global in-flight cap, one driver Job per run. Every driver is the test
driver image (images/test-driver/driver) run by the kubelet: each reports running and succeeded
to the backend itself and exits 0; one grows until the kernel kills it under the namespace's
LimitRange (OOMKilled, 137), and the dispatcher reports it with the real tail of its log and reaps
the sandbox pod it left running.

The stage runs in a namespace of its own (`<namespace>-dispatch`), so that the LimitRange's memory
limit reaches no other stage's pods. It checks every outcome with `demo_output.expect`.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import kubernetes.client

from devcluster import demo_output as out
from devcluster import harness, node, runqueue
from devcluster import stack as stack_mod
from dispatcher import jobspec, names

HARNESSES = {"swe-bench": 3, "gpu-eval": 2}  # harness -> its max_parallel in the backend
RUNS = {"swe-bench": 12, "gpu-eval": 8}
MAX_INFLIGHT = 4  # the dispatcher's global cap, below the harnesses' 3 + 2
DRIVER_IMAGE = "localhost/dispatch/test-driver:dev"  # in devcluster/local.py NODE_IMAGES
SANDBOX_IMAGE = "localhost/dispatch-base/busybox:1.35-static"
MEMORY_LIMIT = "48Mi"  # every container's, from the LimitRange: the OOM driver passes it in under a second
DRIVER_MEMORY_REQUEST = "16Mi"  # below the limit (a request above it is refused at admission)
LOG_TAIL_LINES = 3
OOM_LOG_TAIL = "step 40: loss 1.95\nstep 41: loss 1.92\nallocating 80 GiB for the KV cache\n"
TIMEOUT = 180.0

def stage(stack: stack_mod.Stack, namespace: str) -> None:
    ns = f"{namespace}-dispatch"
    out.say(f"dispatch: the reference backend, {sum(RUNS.values())} runs under two harnesses "
            f"({', '.join(f'{h} max {n}' for h, n in HARNESSES.items())}); the dispatcher, cap {MAX_INFLIGHT}; "
            f"namespace {ns}")
    with stack.plane.api_client() as api, runqueue.Backend(host=node.NODE_IP) as backend:
        harness.create_namespace(api, ns)
        core = kubernetes.client.CoreV1Api(api)
        batch = kubernetes.client.BatchV1Api(api)
        core.create_namespaced_limit_range(ns, {"metadata": {"name": "memory"}, "spec": {"limits": [
            {"type": "Container", "default": {"memory": MEMORY_LIMIT}}]}})
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
        runqueue.install_rbac(api, ns)
        kubeconfig = stack.plane.mint_kubeconfig(namespace=ns, service_account=runqueue.DISPATCHER_SA)
        d = runqueue.Dispatcher(kubeconfig=kubeconfig, namespace=ns, backend=backend,
                                driver_image=DRIVER_IMAGE, TCAB_DISPATCHER_MAX_INFLIGHT=str(MAX_INFLIGHT),
                                TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST=DRIVER_MEMORY_REQUEST,
                                TCAB_DISPATCHER_LOG_TAIL_LINES=str(LOG_TAIL_LINES),
                                TCAB_DISPATCHER_LOG_LEVEL="info")
        ok = False
        try:
            d.start()
            peak, by_harness, seen_jobs = _watch(stack, batch, backend, runs, ns)
            out.wait_until(lambda: sandbox not in {p.metadata.name for p in core.list_namespaced_pod(ns).items},
                           "the sandbox pod reaped")
            ok = True
        finally:
            stopped = d.terminate() if d.popen is not None and d.popen.poll() is None else None
            d.close(show=not ok)
        out.expect(stopped == 0, f"the dispatcher stops on SIGTERM with exit 0 (got {stopped})")
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
        out.say(f"  its orphaned sandbox pod {sandbox} was reaped")


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
