"""`make demo`: the whole system on the local cluster, checked as it goes.

The story, on the real Trainer, JobSet and Kueue controllers and a real node
(the kubelet and containerd, devcluster/node.py) that runs every pod: the
sidecar verifier as a native sidecar, then the trainer through the prologue.
Every identity in the table is what a container printed, read back through
`pods/log` as `kubectl logs` reads it:

  runtime    `toolkit render runtime` makes a runtime fit; `check-runtime`
             refuses one that restarts a rank in place, naming the field
  admission  a TrainJob started in Kueue mode; our admission check raises A
             and approves; its pods run through the prologue
  restart    a rank fails (its container exits 3): JobSet restarts it (J+1),
             the epoch goes up
  preempt    a higher-priority TrainJob preempts it; Kueue admits it again
             later: A+1, the epoch goes up again
  reset      its JobSet is deleted by hand: Trainer rebuilds it with J back
             at 0, the repeated identity runs, and our controller flags the
             TrainJob foreign with the exact cause; the new pod's sidecar
             verifier reports it too, at its first check, before the trainer
             starts (a Warning Event that `kubectl describe` shows); nothing
             is stopped
  fence      the cluster's object store (S3, on the node's address): a
             TrainJob's trainer checkpoints with PyTorch DCP through the
             fence's storage layer (torch mounted from the host); preempted,
             it saves once more within its grace period, after the next
             execution (A raised) has restored what LATEST named and
             published: that late save is refused, naming both epochs, and
             LATEST still names the newer checkpoint (devcluster/demo_fence.py)
  plain      a TrainJob without Kueue: open raises A, hold stops it,
             release raises A again
  dispatch   the reference backend (real HTTP, real SQLite) and the
             dispatcher under its shipped Role: 20 runs under two harnesses
             with limits of their own, claimed under a global in-flight cap,
             one driver Job per run; each driver reports and exits; one is
             OOM-killed by the kernel under its memory limit, reported with
             its reason, exit code 137 and the tail of its log, and its
             orphaned sandbox pod is reaped

Each stage states what it expects and checks it; the first expectation not
observed ends the demo with exit 1 and one `demo: FAILED` line. At the end,
one table of every execution: the identity each container printed, and the
verdict (the epoch is above every earlier one of its TrainJob, or it repeats
one and the TrainJob is flagged foreign).

Invariant: the demo leaves nothing running; the cluster and every process
and container it started are stopped on every path (the harness's own
guarantees, plus a `finally`). SIGTERM is one of those paths: it ends the
demo through the same cleanup (exit 143), and a second SIGTERM during the
cleanup is ignored. The first line after the builds names the cluster's
directory, removed at the end, so that a caller can check that nothing names
it any more.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from typing import Any

import kubernetes.client

from controller import admission
from devcluster import demo_dispatch, demo_fence, demo_output, harness, install, local, node as node_mod, objectstores
from devcluster import scenario, torch_venv
from devcluster import stack as stack_mod
from toolkit import adapter, names, render, runtime_check

Failed, say, expect = demo_output.Failed, demo_output.say, demo_output.expect


class Terminated(BaseException):
    """SIGTERM arrived: the demo stops through its normal cleanup."""


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup itself is not interrupted
    raise Terminated()


def _stage_runtime(low: scenario.Scenario, marks: pathlib.Path) -> None:
    say("runtime: toolkit render runtime + check-runtime")
    sidecar = low.stack.sidecar_image or local.SIDECAR_IMAGE
    fit = render.runtime(scenario.runtime("demo", cpu="1"), sidecar_image=sidecar)
    expect(runtime_check.check(fit) == [], "the rendered runtime passes check-runtime")
    bad = scenario.runtime("in-place")
    bad["spec"]["template"]["spec"]["failurePolicy"]["restartStrategy"] = "InPlaceRestart"
    refusals = runtime_check.check(render.runtime(bad, sidecar_image=sidecar))
    expect(refusals, "a runtime that restarts in place is refused")
    say(f"  refused as expected: {refusals[0]}")
    # 750m (760m with the sidecar): two of its TrainJobs do not fit the ClusterQueue's 1500m (so the
    # high one preempts), while the node's 2 CPUs hold one beside the plain-mode one, our
    # controller's two pods, CoreDNS, and then the dispatcher's pod and its four drivers.
    low.create_runtime(scenario.runtime("demo", cpu="750m", host_dirs={scenario.MARKS: marks}))
    say("  runtime 'demo' applied (restartPolicy Never, backoffLimit 0, the sidecar verifier added)")


def _a(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for p in pods}


def _story(stack: stack_mod.Stack, namespace: str, suffix: str, marks: pathlib.Path,
           store: demo_fence.Store, torch_site: pathlib.Path) -> list[tuple[str, scenario.Scenario]]:
    with stack.plane.api_client() as api, stack.plane.api_client() as api2:
        scenario.kueue_queues(api, suffix=suffix, namespace=namespace, check_controller=admission.CONTROLLER_NAME)
        low = scenario.Scenario(stack, api, namespace)
        high = scenario.Scenario(stack, api2, namespace, service_account=False)
        _stage_runtime(low, marks)

        say("admission: StartRequest in Kueue mode (queue lq, priority low)")
        low.start("demo", queue="lq", job_id="llama.ft", env={"FAIL_FIRST": f"{scenario.MARKS}/failed", "STAY": "1"},
                  labels={"kueue.x-k8s.io/priority-class": f"low-{suffix}"})
        pods = low.new_pods()
        first_a = int(_a(pods).pop())
        say(f"  our admission check raised A to {first_a} and approved; the kubelet ran "
            f"{[p['metadata']['name'] for p in pods]} on {pods[0]['spec']['nodeName']}")

        say("restart: rank 0 fails (its container exits 3) on J=0")
        for pod in pods:
            result = low.run(pod, until_exit=True)
            expect(result.exit_code == 3, f"the first execution fails with exit 3 (got {result.exit_code})")
        low.wait("the JobSet restart", lambda: adapter.restarts_of(low.jobset()) == 1)
        pods = low.new_pods()
        expect(all(p["metadata"]["labels"][names.RESTART_LABEL] == "1" for p in pods), "the new pods carry J=1")
        for pod in pods:
            low.run(pod)  # left running: the preemption ends it
        say(f"  JobSet restarted it: J=1, epoch {low.executions[-1].epoch} (was {low.executions[-2].epoch})")

        say("preempt: a high-priority TrainJob takes the quota")
        high.start("demo", queue="lq", job_id="eval.urgent",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{suffix}"})
        low.wait("the low TrainJob to be suspended by the eviction", lambda: low.trainjob()["spec"].get("suspend"))
        say("  Kueue evicted the low TrainJob (suspended; the kubelet stopped its pods)")
        for pod in high.new_pods():
            high.run(pod, until_exit=True)
        say("  the high TrainJob ran and finished; Kueue admits the low one again")
        pods = low.new_pods()
        again = int(_a(pods).pop())
        expect(again > first_a, f"re-admission raised A above {first_a} (got {again})")
        for pod in pods:
            low.run(pod)  # left running: the reset below happens under it
        say(f"  re-admitted with A={again}: epoch {low.executions[-1].epoch}")

        say("reset: the JobSet is deleted by hand")
        old_uid = low.wait("the JobSet UID to be recorded", lambda: (
            low.trainjob()["metadata"].get("annotations") or {}).get(names.JOBSET_UID_ANNOTATION))
        kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", low.name,
            body={"propagationPolicy": "Background"})
        new = low.wait("Trainer to build a new JobSet", lambda: (
            (js := low.jobset()) and js["metadata"]["uid"] != old_uid and js))
        pods = low.new_pods()
        for pod in pods:
            low.run(pod)
        cause = f"JobSet UID {new['metadata']['uid']} is not the recorded {old_uid}: J may have been reset"
        low.wait("the foreign flag", lambda: cause in (low.foreign() or "").split("\n"))
        low.flagged = low.foreign()
        say(f"  flagged foreign: {cause}")
        _sidecar_reports(low, pods[0])
        status = adapter.status(low.client, namespace=namespace, name=low.name)
        expect(status.foreign, "toolkit status reports the TrainJob foreign")
        expect(not low.trainjob()["spec"].get("suspend"), "nothing was stopped: the TrainJob is not suspended")
        say("  nothing stopped: the TrainJob still runs; recovery is a person's call")
        _stage_adopt(low)
        fenced = demo_fence.stage(stack, store, marks, f"{namespace}-fence", torch_site)

        plain = scenario.Scenario(stack, api, namespace, service_account=False)
        _stage_plain(plain)
        return [(low.name, low), (high.name, high), (fenced.name, fenced), (plain.name, plain)]


ADOPT_REASON = "JobSet deleted by hand during maintenance; checkpoints verified"


def _stage_adopt(low: scenario.Scenario) -> None:
    """A person's decision: they read the causes (`toolkit status`, its fingerprint of them), then
    `toolkit adopt --reviewed` with it clears the flag and sets the next execution above the
    high-water mark of R; Kueue evicts and re-admits the TrainJob through our check, which raises A
    to that minimum; the next execution's epoch is above every earlier one."""
    for _ in range(3):  # a cause flagged after the read (a sidecar's report confirmed late) is read again
        shown = _toolkit(low, "status", low.name, "-n", low.namespace, "-o", "json")
        expect(shown.returncode == 0, f"toolkit status succeeds (exit {shown.returncode}: {shown.stderr.strip()})")
        reviewed = json.loads(shown.stdout)["foreign_fingerprint"]
        say(f"adopt: toolkit adopt {low.name} --reviewed {reviewed} --reason {ADOPT_REASON!r}")
        ran = _toolkit(low, "adopt", low.name, "-n", low.namespace, "--reviewed", reviewed, "--reason", ADOPT_REASON)
        if "the causes changed since they were reviewed" not in ran.stderr:
            break
        say(f"  {ran.stderr.strip()}")
    expect(ran.returncode == 0, f"toolkit adopt succeeds (exit {ran.returncode}: {ran.stderr.strip()})")
    for line in ran.stdout.strip().splitlines():
        say(f"  {line}")
    expect(not low.foreign(), "the foreign flag is cleared")
    highest = max(int(e.epoch or 0) for e in low.executions)
    pods = low.new_pods()
    for pod in pods:
        low.run(pod)
    epoch = int(low.executions[-1].epoch or 0)
    expect(epoch > highest, f"the next execution's epoch {epoch} is above every earlier one ({highest})")
    say(f"  re-admitted through our check: epoch {epoch}, above every earlier one ({highest})")


def _toolkit(sc: scenario.Scenario, *args: str) -> subprocess.CompletedProcess[str]:
    """The `toolkit` command of this installation, against the demo's cluster."""
    command = pathlib.Path(sys.executable).parent / "toolkit"
    return subprocess.run([str(command), *args, "--kubeconfig", sc.stack.plane.kubeconfig], capture_output=True,
                          text=True, timeout=120, check=False)


def _sidecar_reports(low: scenario.Scenario, pod: dict[str, Any]) -> None:
    """The pod's sidecar verifier, a native sidecar the kubelet ran before the trainer: its first
    check sees the reset and posts its Warning Event on the TrainJob, which `kubectl describe` shows."""
    verdicts = low.wait("the sidecar's first verdict", lambda: low.sidecar_verdicts(pod))
    expect(verdicts[0]["verdict"] == "violation" and "jobset-uid" in verdicts[0]["rules"],
           f"the sidecar's first check found the reset (got {verdicts[0]})")
    events = low.wait("the sidecar's Event", lambda: low.events(names.SIDECAR_VIOLATION_REASON))
    expect(events[0]["type"] == "Warning", f"the sidecar's Event is a Warning (got {events[0]['type']})")
    kubectl = harness.binary(local.KUBECTL, low.stack.plane.bin_dir)
    described = subprocess.run([str(kubectl), "--kubeconfig", low.stack.plane.kubeconfig, "describe", "trainjob",
                                "-n", low.namespace, low.name], capture_output=True, text=True, timeout=60,
                               check=False)
    shown = [line.strip() for line in described.stdout.splitlines() if names.SIDECAR_VIOLATION_REASON in line]
    expect(described.returncode == 0 and shown, f"kubectl describe shows the sidecar's Event: {described.stderr}")
    say(f"  the sidecar saw it too; kubectl describe trainjob {low.name}:")
    say(f"    {' '.join(shown[0].split())}")


def _stage_plain(plain: scenario.Scenario) -> None:
    say("plain mode: toolkit start, open (A raised, unsuspended in one update)")
    plain.start("demo", job_id="sweep.7", env={"STAY": "1"})
    opened = adapter.open_(plain.client, namespace=plain.namespace, name=plain.name)
    expect(opened.admission == 1, f"open raised A to 1 (got {opened.admission})")
    for pod in plain.new_pods():
        plain.run(pod)  # left running: the hold stops it
    say("  hold: suspended, its pods go")
    expect(adapter.hold(plain.client, namespace=plain.namespace, name=plain.name), "hold suspends the TrainJob")
    plain.wait("the held TrainJob's pods to go", lambda: not plain.pods())
    released = adapter.release(plain.client, namespace=plain.namespace, name=plain.name)
    expect(released.admission == 2, f"release raised A to 2 (got {released.admission})")
    for pod in plain.new_pods():
        plain.run(pod)
    say(f"  released with A=2: epoch {plain.executions[-1].epoch} (was {plain.executions[-2].epoch})")


def _table(jobs: list[tuple[str, scenario.Scenario]]) -> bool:
    header = ("TrainJob", "execution", "A", "J", "R", "DISPATCH_EPOCH", "DISPATCH_ATTEMPT", "verdict")
    rows: list[tuple[str, ...]] = []
    ok = True
    for name, sc in jobs:
        flagged = sc.foreign() or sc.flagged
        for i, e in enumerate(sc.executions):
            a, j = (e.attempt or "").rsplit(".", 2)[-2:]
            earlier = sc.executions[:i]
            if all(int(x.epoch or 0) < int(e.epoch or 0) and x.attempt != e.attempt for x in earlier):
                verdict = "ok: epoch above every earlier one"
            elif flagged:
                verdict = "repeats an earlier identity: flagged foreign"
            else:
                verdict = "VIOLATION: repeats, not flagged"
                ok = False
            rows.append((name, str(i + 1), a, j, str(int(a) + int(j)), e.epoch or "", e.attempt or "", verdict))
    widths = [max(len(r[k]) for r in (header, *rows)) for k in range(len(header))]
    print()
    for r in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print()
    return ok


def main() -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    say("building the local cluster (cached after the first run: about 20 min on 2 cores the first time)")
    start = time.monotonic()
    plane_bin = harness.build_binaries()
    say(f"  etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy: {plane_bin} "
        f"({time.monotonic() - start:.1f}s)")
    start = time.monotonic()
    controllers_bin = stack_mod.build_binaries()
    say(f"  Trainer, JobSet, Kueue, containerd: {controllers_bin} ({time.monotonic() - start:.1f}s)")
    start = time.monotonic()
    services_bin = local.services_bin()
    say(f"  CoreDNS, the registry: {services_bin} ({time.monotonic() - start:.1f}s)")
    start = time.monotonic()
    stores_bin = objectstores.bin_dir(objectstores.S3Server.binary)
    say(f"  versitygw, the cluster's object store: {stores_bin} ({time.monotonic() - start:.1f}s)")
    start = time.monotonic()
    try:
        torch_site = torch_venv.site_packages(torch_venv.python())
    except torch_venv.BuildFailed as e:
        print(f"demo: FAILED: the torch virtualenv: {e}", file=sys.stderr)
        return 1
    say(f"  torch, mounted into the fence stage's trainer: {torch_site} ({time.monotonic() - start:.1f}s)")
    running: stack_mod.Stack | None = None
    store: demo_fence.Store | None = None
    marks = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-demo-marks-"))
    release_dir = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-demo-release-"))
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-cp-"))
    try:
        say(f"the cluster's directory: {workdir}")
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, then Trainer, JobSet, "
            "Kueue (webhooks served on 127.0.0.1), then the registry and the node: containerd, "
            "kubelet, kube-proxy, and CoreDNS on it; then our release installed as a user installs it: "
            "its images pushed to the registry, controller.yaml applied with kubectl apply --server-side")
        running = local.start(plane_bin=plane_bin, controllers=controllers_bin, release_dir=release_dir,
                              workdir=workdir, images=(*local.NODE_IMAGES, demo_fence.IMAGE))
        if running.swept:
            say(f"  cleaned up after an earlier node first: {'; '.join(running.swept)}")
        namespace = f"demo-{uuid.uuid4().hex[:6]}"
        with running.plane.api_client() as api:
            harness.create_namespace(api, namespace)
        say(f"cluster up: node {node_mod.NODE_NAME} Ready (kubelet + containerd), CoreDNS serving "
            f"{node_mod.CLUSTER_DOMAIN}, registry {running.node.registry.name}; namespace {namespace}")
        installed = running.installed
        say(f"our controller runs from the release {installed.release.build.tag} as pods (its images: "
            f"{installed.build_seconds:.1f}s to build or find in local storage, pushed and the bundle rendered "
            f"in {installed.push_seconds:.1f}s):")
        try:
            for line in install.check(running, running.installed):
                say(f"  {line}")
        except install.InstallError as e:
            raise Failed(str(e)) from None
        say(f"  the runtimes name the release's sidecar {running.sidecar_image}")
        store = demo_fence.Store()
        say(f"the cluster's object store: versitygw at {store.url} (S3 with conditional writes, on the node's "
            f"address; credentials of this run's own, for the pods in a Secret), bucket {store.bucket}")
        jobs = _story(running, namespace, namespace, marks, store, torch_site)
        demo_dispatch.stage(running)
        ok = _table(jobs)
        low = jobs[0][1]
        say(f"toolkit executions {low.name}: what the controller recorded on the TrainJob")
        shown = _toolkit(low, "executions", low.name, "-n", low.namespace)
        expect(shown.returncode == 0, f"toolkit executions succeeds ({shown.stderr.strip()})")
        print(shown.stdout)
        if not ok:
            raise Failed("every execution's epoch is above its TrainJob's earlier ones, or the TrainJob is flagged")
        say("demo: every expected outcome observed")
        return 0
    except (Failed, AssertionError, harness.HarnessError) as e:
        print(f"demo: FAILED: {e or type(e).__name__}", file=sys.stderr)
        if running is not None:
            print(running.logs(lines=30), file=sys.stderr)
        else:  # the cluster did not come up: where it failed
            traceback.print_exc()
        return 1
    except Terminated:
        print("demo: stopped by SIGTERM; stopping the cluster", file=sys.stderr)
        return 143
    finally:
        if store is not None:
            store.stop()
        if running is not None:
            running.stop()
            stack_mod.clean_up(running.started)
            running.plane.stop()
        shutil.rmtree(marks, ignore_errors=True)
        shutil.rmtree(release_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
