"""What the install and upgrade tests do as a platform engineer does it: kubectl (the one built with
the control plane), the ClusterQueue's Active condition, the Workloads that still list our check."""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes.client

from devcluster import install, scenario as flow, stack as stack_mod
from devcluster.scenario import KUEUE_API, Scenario
from tests import waiting
from toolkit import names

CHECK = "dispatch-admission"  # the AdmissionCheck controller.yaml ships
WAIT_SECONDS = 180.0


def wait(what: str, predicate: Any, *, timeout: float = WAIT_SECONDS) -> Any:
    return waiting.until(what, predicate, timeout=timeout, interval=0.5)


def kubectl(stack: stack_mod.Stack, *args: str) -> str:
    done = subprocess.run([str(install.kubectl(stack)), "--kubeconfig", stack.plane.kubeconfig, *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def active(custom: kubernetes.client.CustomObjectsApi, queue: str) -> bool:
    cq = custom.get_cluster_custom_object(*KUEUE_API, "clusterqueues", queue)
    return any(c["type"] == "Active" and c["status"] == "True" for c in (cq.get("status") or {}).get("conditions") or [])


def listing_our_check(custom: kubernetes.client.CustomObjectsApi) -> list[str]:
    """Every Workload, in any namespace, whose status still lists our check."""
    items = custom.list_cluster_custom_object(*KUEUE_API, "workloads")["items"]
    return [w["metadata"]["name"] for w in items
            if any(e.get("name") == CHECK for e in (w.get("status") or {}).get("admissionChecks") or [])]


def admitted_with_a_raised(job: Scenario, runtime: str, job_id: str) -> None:
    """A TrainJob of JOB's on RUNTIME (converted), through Kueue and our check: its pods carry A = 1,
    its trainer exits 0, our check is Ready with "A raised to 1", and every identity is as issued."""
    job.start(runtime, queue="lq", job_id=job_id)
    pods = job.new_pods()
    execution = job.run(pods[0], until_exit=True)
    assert execution.exit_code == 0, execution.log
    assert {p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for p in pods} == {"1"}
    entry = next(e for e in job.workload()["status"]["admissionChecks"] if e["name"] == CHECK)
    assert (entry["state"], entry["message"]) == ("Ready", "A raised to 1"), entry
    job.check_identities()


def queue_without_our_check(api: Any, namespace: str) -> str:
    """The cluster before us: a ClusterQueue (and its LocalQueue in NAMESPACE) that admits without any
    check of ours, Active; its name."""
    flow.kueue_queues(api, suffix=namespace, namespace=namespace, check_controller="example.com/none",
                      cpu="1500m", check=False)
    queue = f"cq-{namespace}"
    wait("the ClusterQueue to be Active", lambda: active(kubernetes.client.CustomObjectsApi(api), queue))
    return queue
