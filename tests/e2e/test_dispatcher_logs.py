"""The dispatcher's death report quotes the dead driver's log, read the way a real cluster serves it.

tests/dispatcher has no kubelet, so there the report says that no log could be read. Here the
driver pod runs on a kwok node and `pods/log` goes where it goes on a real cluster: the apiserver
dials the node's kubelet server (kwok's), which answers from the container's CRI log file. The
dispatcher runs as a real process under the shipped Role, against the reference backend.
"""

from __future__ import annotations

import time
from typing import Any

import kubernetes.client

from dispatcher import jobspec
from tests.dispatcher import cluster
from devcluster import stack as stack_mod
from tests.refbackend import proc


def cri_lines(*texts: str) -> str:
    """Lines in the container runtime's log format (the one a kubelet reads back for pods/log)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    return "".join(f"{stamp}.{i:09d}Z stdout F {text}\n" for i, text in enumerate(texts))


def running_driver_pod(api: kubernetes.client.ApiClient, namespace: str, job_name: str) -> Any:
    pod = cluster.driver_pod(api, namespace, job_name)
    return pod if pod is not None and pod.status.phase == "Running" else None


def test_a_dead_driver_is_reported_with_the_last_lines_of_its_log(stack: stack_mod.Stack, e2e_namespace: str) -> None:
    ns = e2e_namespace
    with stack.plane.api_client() as api, proc.Backend() as backend:
        cluster.install_rbac(api, ns)
        kubeconfig = stack.plane.mint_kubeconfig(namespace=ns, service_account=cluster.SA)
        run = backend.enqueue()
        d = cluster.Dispatcher(kubeconfig=kubeconfig, namespace=ns, backend=backend,
                               TCAB_DISPATCHER_LOG_TAIL_LINES="3")
        try:
            d.start()
            name = jobspec.job_name(run["id"])
            pod = cluster.wait(lambda: running_driver_pod(api, ns, name), timeout=60,
                               what="the driver pod Running on a kwok node")
            assert pod.spec.node_name in ("kwok-node-0", "kwok-node-1")
            stack.driver_log.write_text(cri_lines("step 1", "step 2", "step 3", "allocating 80 GiB",
                                                  "Killed"))
            # The container is OOM-killed: kwok writes the terminated state a kubelet would.
            kubernetes.client.CoreV1Api(api).patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"annotations": {
                stack_mod.EXIT_CODE_ANNOTATION: "137", stack_mod.EXIT_REASON_ANNOTATION: "OOMKilled"}}})
            cluster.wait(lambda: backend.get(run["id"])["state"] == "failed", timeout=60, what="the death report")
            reports = backend.get(run["id"])["reports"]
            assert len(reports) == 1
            error = reports[0]["body"]["error"]
            assert (error["reason"], error["exit_code"], error["pod"]) == ("OOMKilled", 137, pod.metadata.name)
            assert error["log_tail"] == "step 3\nallocating 80 GiB\nKilled\n"
            assert error.get("log_error") is None
            assert d.terminate() == 0
        finally:
            d.close()
