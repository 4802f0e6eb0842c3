"""The fence stage of `make demo`: a late save from a preempted execution, refused on an object store.

The local cluster serves an object store: versitygw (S3 with conditional writes, the server the
fence's S3 suite runs against, devcluster/objectstores.py) on the node's address, so that pods
reach it, with credentials of this run's own; `Store` starts it once the cluster is up and stops it
with the cluster, its data directory removed. The pods get its address and credentials from a
Secret, through the environment, as training pods get theirs.

One TrainJob in Kueue mode, in a namespace and ClusterQueue of its own (room for one of its pods:
a higher priority preempts it), runs the sample trainer that checkpoints with PyTorch Distributed
Checkpoint through the fence's storage layer (images/sample-trainer/train-dcp, in
localhost/dispatch/sample-trainer:python-s3: `torch.distributed.checkpoint.save` with
`dispatch_fence.dcp_storage.Writer`, `load` with `dcp_reader.Reader`) with a checkpoint root on
that store. torch is not in the image (its build for this machine is several GB): the pod mounts,
read-only, the site-packages of the torch virtualenv the fence's suites run in
(devcluster/build-torch-venv.sh, built here first when the cache has none), on the node that is
this host. Its first execution restores nothing, saves through the fence (LATEST names its
checkpoint) and trains on; preempted, it is sent SIGTERM and, as trainers do, saves once more
before it exits, within its grace period: that save is late on purpose, started only once LATEST
names a newer epoch (gated on the new execution's publish, not timed). Kueue admits the TrainJob
again (A raised): the second execution restores what LATEST names, the first one's save, and
publishes its own. Then the first execution's save is refused by the fence in DCP's global plan,
before a byte is written, with both epochs, and LATEST still
names the second one's checkpoint. Every line shown is read from the containers' logs (`pods/log`),
the last one from the store itself.

Which execution is the slow one is decided as the story's failing rank is: the first execution
that makes a directory on a volume every execution shares (`scenario.MARKS`).

It checks every outcome with `demo_output.expect`.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import subprocess
import sys
import threading
from typing import Any

import kubernetes.client

from controller import admission
from devcluster import demo_output as out
from devcluster import harness, node, objectstores, scenario
from devcluster import stack as stack_mod

IMAGE = "localhost/dispatch/sample-trainer:python-s3"
SECRET = "checkpoint-store"  # the store's address and credentials, for the trainer's environment
TRAINER_USER = 65532  # the image's USER: the marks directory is its
SLOW = f"{scenario.MARKS}/slow"
# The first execution to claim SLOW saves once more when it is stopped, late; every other one
# restores, saves and exits. The identity first, as `env` prints it (the scenario reads it from
# those lines; the rest of the environment holds the store's credentials, not for a log).
COMMAND = ["/bin/sh", "-c",
           f'env | grep ^DISPATCH_; if mkdir {SLOW} 2>/dev/null; then exec train-dcp --checkpoint "$CHECKPOINTS" --restore '
           '--late-save; fi; exec train-dcp --checkpoint "$CHECKPOINTS" --restore']
# Where the pod sees the torch virtualenv's site-packages, after the image's own modules.
TORCH_MOUNT = "/opt/torch/site-packages"
PYTHONPATH = f"/usr/local/lib/dispatch:{TORCH_MOUNT}"
# 100m (110m with the sidecar) in a ClusterQueue of 150m: one pod fits, a second preempts. Three fit
# the node beside the story's TrainJob (the old one terminating, the high one, the new one).
CPU, QUOTA = "100m", "150m"
GRACE_SECONDS = 120  # the late save lands well within it
REFUSED = "a superseded execution's save, refused; nothing published"


class Store:
    """The local cluster's object store: versitygw on the node's address, until `stop()`."""

    def __init__(self) -> None:
        self.server = objectstores.S3Server(host=node.NODE_IP, key=f"demo-{secrets.token_hex(4)}",
                                            secret=secrets.token_urlsafe(24))
        self.server.needs = (self.server.binary,)  # versitygw alone (the demo builds nothing else)
        try:
            self.server.start()
        except (RuntimeError, OSError) as e:
            self.server.close()
            raise out.Failed(f"the cluster's object store did not start: {e}") from None
        self.url = self.server.env["AWS_ENDPOINT_URL"]
        self.bucket = objectstores.BUCKET

    def stop(self) -> None:
        self.server.close()

    def latest(self, root: str) -> str:
        """What `python -m dispatch_fence latest ROOT` prints, run here with the pods' client settings."""
        done = subprocess.run([sys.executable, "-m", "dispatch_fence", "latest", root], capture_output=True,
                              text=True, timeout=60, check=False,
                              env={**objectstores.clean_env(), **self.server.env})
        out.expect(done.returncode == 0, f"dispatch_fence latest {root} succeeds ({done.stderr.strip()})")
        return done.stdout.strip()


class _Follow(threading.Thread):
    """The container's whole log, read until the container ends (the kubelet closes the stream). A
    daemon thread: a demo that fails or is stopped meanwhile does not wait for it, and stopping the
    cluster ends the stream."""

    def __init__(self, core: kubernetes.client.CoreV1Api, namespace: str, pod: str) -> None:
        super().__init__(daemon=True)
        self.text: str | None = None
        self.error: BaseException | None = None
        self.response = core.read_namespaced_pod_log(pod, namespace, container=scenario.TRAINER_CONTAINER,
                                                     follow=True, _preload_content=False)
        self.start()

    def run(self) -> None:
        try:
            self.text = b"".join(self.response.stream(4096)).decode(errors="replace")
        except BaseException as e:  # reported by result()
            self.error = e
        finally:
            self.response.release_conn()

    def result(self, timeout: float) -> str:
        self.join(timeout)
        out.expect(not self.is_alive(), f"the container's log ended within {timeout:.0f} s")
        out.expect(self.text is not None, f"the container's log was read ({self.error!r})")
        return self.text or ""


def _line(log: str, text: str) -> str | None:
    """The first line of LOG that holds TEXT."""
    return next((line.strip() for line in log.splitlines() if text in line), None)


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def stage(stack: stack_mod.Stack, store: Store, marks: pathlib.Path, namespace: str,
          torch_site: pathlib.Path) -> scenario.Scenario:
    """The stage (TORCH_SITE: the torch virtualenv's site-packages, mounted into the trainer's pod);
    returns the fenced TrainJob's scenario, whose executions join the demo's table."""
    shared = marks / "fence"
    shared.mkdir()
    os.chown(shared, TRAINER_USER, TRAINER_USER)
    root = f"s3://{store.bucket}/{namespace}"
    out.say(f"fence: checkpoints with PyTorch DCP through the fence's storage layer, on the cluster's object store "
            f"(versitygw, S3 with conditional writes, at {store.url}); root {root}; namespace {namespace}")
    with stack.plane.api_client() as api, stack.plane.api_client() as api2:
        harness.create_namespace(api, namespace)
        scenario.kueue_queues(api, suffix=namespace, namespace=namespace, check_controller=admission.CONTROLLER_NAME,
                              cpu=QUOTA)
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespaced_secret(namespace, {"metadata": {"name": SECRET}, "stringData": store.server.env})
        job = scenario.Scenario(stack, api, namespace)
        high = scenario.Scenario(stack, api2, namespace, service_account=False)
        runtime = scenario.runtime("fenced", cpu=CPU, image=IMAGE, host_dirs={scenario.MARKS: shared})
        pod_spec: dict[str, Any] = (
            runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])
        pod_spec["terminationGracePeriodSeconds"] = GRACE_SECONDS
        pod_spec["containers"][0]["envFrom"] = [{"secretRef": {"name": SECRET}}]
        pod_spec["volumes"].append({"name": "torch", "hostPath": {"path": str(torch_site), "type": "Directory"}})
        pod_spec["containers"][0]["volumeMounts"].append({"name": "torch", "mountPath": TORCH_MOUNT, "readOnly": True})
        job.create_runtime(runtime)
        job.create_runtime(scenario.runtime("urgent", cpu=CPU))
        job.start("fenced", queue="lq", job_id="llama.ckpt", command=COMMAND,
                  env={"CHECKPOINTS": root, "PYTHONPATH": PYTHONPATH},
                  labels={"kueue.x-k8s.io/priority-class": f"low-{namespace}"})

        # Execution 1 saves through the fence and trains on.
        first_pod = job.new_pods()[0]
        first_name = first_pod["metadata"]["name"]
        first = job.run(first_pod)
        late_log = _Follow(core, namespace, first_name)
        published = job.wait("the first execution's save", lambda: _line(job.log(first_pod), "train: published "))
        first_ckpt = _name(published)
        out.expect(store.latest(root).endswith(first_ckpt), f"LATEST names the first execution's {first_ckpt}")
        out.say(f"  execution 1 (epoch {first.epoch}) saved through the fence: LATEST names {first_ckpt}; "
                "it trains on")

        # Preempted: SIGTERM; the trainer stages its final save and holds it back (grace period).
        high.start("urgent", queue="lq", job_id="eval.ckpt",
                   labels={"kueue.x-k8s.io/priority-class": f"high-{namespace}"})
        job.wait("the eviction", lambda: job.trainjob()["spec"].get("suspend"))
        job.wait("the first execution's final save, its state held after SIGTERM",
                 lambda: _line(job.log(first_pod), f"({first.attempt}-final)"))
        out.say(f"  preempted: Kueue evicted it; its trainer runs on within its grace period ({GRACE_SECONDS} s), "
                f"its log: {_line(job.log(first_pod), 'train: SIGTERM')}")
        for pod in high.new_pods():
            out.expect(high.run(pod, until_exit=True).exit_code == 0, "the high-priority TrainJob ran and finished")

        # Re-admitted (A raised) while execution 1 still runs: execution 2 restores what LATEST names, and saves.
        second_pod = job.new_pods()[0]
        out.expect(late_log.is_alive(), "the preempted execution is still running when the next one starts")
        second = job.run(second_pod, until_exit=True)
        out.expect(second.exit_code == 0, f"the second execution saves and exits 0 (got {second.exit_code})")
        out.expect(int(second.epoch or 0) > int(first.epoch or 0), "the second execution's epoch is above the first's")
        restored = _line(second.log, "train: restored ")
        out.expect(restored and first_ckpt in restored and f"weights of {first.attempt}" in restored,
                   f"the second execution restored {first_ckpt}, what LATEST named ({second.log})")
        out.say(f"  re-admitted: execution 2 (epoch {second.epoch}) starts; its log: {restored}")
        second_ckpt = _name(_line(second.log, f"{root}/ckpt-") or "")
        out.expect(second_ckpt.startswith(f"ckpt-{int(second.epoch or 0):019d}-"),
                   f"the second execution published ({second.log})")
        out.say(f"  it saved through the fence and exited 0: LATEST names {second_ckpt}")

        # Then execution 1's final save: refused, both epochs named; LATEST stands.
        text = late_log.result(timeout=GRACE_SECONDS)
        refused = _line(text, REFUSED)
        out.expect(refused and f"epoch {first.epoch} is lower than epoch {second.epoch} ({second_ckpt})" in refused,
                   f"the preempted execution's late save is refused, naming both epochs ({text})")
        out.expect(_line(text, "train: the final save's publish exited 1"),
                   f"the refused publish exits 1 ({text})")
        out.say("  the preempted execution's late save, from its log:")
        for line in (_line(text, "train: LATEST names "), refused, _line(text, "train: the final save's publish")):
            out.say(f"    {line}")
        latest = store.latest(root)
        out.expect(latest.endswith(second_ckpt), f"LATEST still names {second_ckpt} (got {latest})")
        out.say(f"  LATEST still names {second_ckpt} (epoch {second.epoch}): the late save overwrote nothing")
    return job
