"""Install into a cluster with nothing of ours, run a TrainJob through it, uninstall: as
docs/install.md tells a platform engineer, on the local cluster with Trainer, JobSet and Kueue and
no controller, ServiceAccount, check or runtime of ours.

Install: this checkout's release bundle (devcluster/install.py: images pushed to the cluster's
registry, `controller.yaml` applied server-side), the sidecar's RBAC applied into the training
namespace from the bundle's `sidecar-rbac.yaml`, our AdmissionCheck added to an existing
ClusterQueue that was admitting without it. A runtime converted with `toolkit render runtime`
(naming the release's sidecar by digest) runs a TrainJob through Kueue: the check says "A raised to
1", the pod carries A = 1, and the trainer prints its epoch and attempt.

Uninstall, in the documented order: our check off the ClusterQueue until no Workload lists it; the
converted runtime put back as it was; the sidecar's RBAC and `controller.yaml` deleted. Then no
object of either file is left, no pod of ours runs, and the ClusterQueue is Active and admits a
new TrainJob on the runtime as it was, whose pod runs. A TrainJob that runs through the uninstall
keeps running once its sidecar has lost its ServiceAccount and RBAC: the sidecar's checks are
refused, logged and retried, and the trainer is never restarted.
"""

from __future__ import annotations

import pathlib
from typing import Any

import kubernetes.client

from devcluster import install, scenario as flow, stack as stack_mod
from devcluster.scenario import KUEUE_API, Scenario
from tests.e2e.installing import CHECK, active, kubectl, listing_our_check, wait
from toolkit import names

E2E_KUEUE = True  # Trainer, JobSet and Kueue
E2E_OURS = False  # and nothing of ours: the release is what installs it

TRAINER_API = ("trainer.kubeflow.org", "v1alpha1")
TRAINER = names.TRAINER_CONTAINER


def test_install_run_a_trainjob_and_uninstall_on_a_cluster_with_nothing_of_ours(
        stack: stack_mod.Stack, e2e_namespace: str, tmp_path: pathlib.Path) -> None:
    namespace = e2e_namespace
    queue = f"cq-{namespace}"
    with stack.plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        core = kubernetes.client.CoreV1Api(api)
        # The cluster before: a ClusterQueue that admits without any check of ours.
        flow.kueue_queues(api, suffix=namespace, namespace=namespace, check_controller="example.com/none",
                          cpu="1500m", check=False)
        wait("the ClusterQueue to be Active", lambda: active(custom, queue))

        # Install.
        installed = install.install(stack, install.prepare(tmp_path / "release"), out_dir=tmp_path / "release")
        assert install.wait_leading(stack).startswith("dispatch-controller-")  # a pod of the Deployment leads
        files = installed.release.files
        kubectl(stack, "apply", "--server-side", "-n", namespace, "-f", str(files["sidecar-rbac.yaml"]))
        custom.patch_cluster_custom_object(*KUEUE_API, "clusterqueues", queue, {
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}}})
        wait("the ClusterQueue with our check to be Active", lambda: active(custom, queue))

        # A TrainJob through Kueue and our check, on a converted runtime: its epoch in the log.
        job = Scenario(stack, api, namespace, service_account=False)
        as_it_was = flow.runtime("installed", cpu="800m")
        job.create_runtime(as_it_was)  # `toolkit render runtime` with the release's sidecar
        converted = custom.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace,
                                                        "trainingruntimes", "installed")
        sidecar = converted["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
            "spec"]["initContainers"][0]
        assert sidecar["image"] == installed.release.references["sidecar"] and "@sha256:" in sidecar["image"]
        job.start("installed", queue="lq", job_id="install.first")
        pods = job.new_pods()
        execution = job.run(pods[0], until_exit=True)
        assert execution.exit_code == 0, execution.log
        assert {p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for p in pods} == {"1"}
        entry = next(e for e in job.workload()["status"]["admissionChecks"] if e["name"] == CHECK)
        assert (entry["state"], entry["message"]) == ("Ready", "A raised to 1"), entry
        job.check_identities()
        assert job.foreign() is None

        # A TrainJob that runs through the uninstall, its sidecar checking every 2 s (its interval
        # set in the converted runtime, as an operator may set it).
        watched = Scenario(stack, api, namespace, service_account=False)
        watched.create_runtime(flow.runtime("watched", cpu="100m"))
        runtime = custom.get_namespaced_custom_object(*TRAINER_API, namespace, "trainingruntimes", "watched")
        pod_spec = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod_spec["initContainers"][0].setdefault("env", []).append(
            {"name": "DISPATCH_SIDECAR_INTERVAL_SECONDS", "value": "2"})
        custom.replace_namespaced_custom_object(*TRAINER_API, namespace, "trainingruntimes", "watched", runtime)
        watched.start("watched", queue="lq", job_id="install.watched", env={"STAY": "1"})  # runs until stopped
        running = watched.new_pods()[0]
        watched.run(running)

        # Uninstall, in the documented order. 1: our check off the ClusterQueue, until no Workload lists it.
        custom.patch_cluster_custom_object(*KUEUE_API, "clusterqueues", queue, {
            "spec": {"admissionChecksStrategy": None}})
        wait("no Workload to list our check", lambda: not listing_our_check(custom))
        # 2: the converted runtime put back as it was.
        custom.delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainingruntimes",
                                               "installed")
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainingruntimes",
                                               as_it_was)
        # 3: the sidecar's RBAC in each training namespace, then controller.yaml.
        kubectl(stack, "delete", "-n", namespace, "-f", str(files["sidecar-rbac.yaml"]))
        kubectl(stack, "delete", "--wait=true", "--timeout=180s", "-f", str(files["controller.yaml"]))

        # The running TrainJob's sidecar lost its ServiceAccount and RBAC: its checks are refused
        # (401: the token of a deleted ServiceAccount is no longer valid; 403 until the apiserver
        # sees that), logged and retried, and its trainer runs on, never restarted.
        wait("the sidecar's check to be refused",
             lambda: any('"check failed"' in line and ("401" in line or "403" in line)
                         for line in watched.log(running, names.SIDECAR_CONTAINER).splitlines()))
        pod = core.read_namespaced_pod(running["metadata"]["name"], namespace)
        trainer = next(c for c in pod.status.container_statuses if c.name == TRAINER)
        assert (pod.status.phase, bool(trainer.state.running), trainer.restart_count) == ("Running", True, 0), pod.status

        # Nothing of ours is left: no object of either file, no pod of ours anywhere.
        assert kubectl(stack, "get", "--ignore-not-found", "-o", "name", "-f", str(files["controller.yaml"])) == ""
        assert kubectl(stack, "get", "--ignore-not-found", "-o", "name", "-n", namespace,
                       "-f", str(files["sidecar-rbac.yaml"])) == ""
        ours = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/part-of=dispatch-k8s").items
        assert [p.metadata.name for p in ours] == []

        # The ClusterQueue is Active without our check.
        wait("the ClusterQueue to be Active without our check", lambda: active(custom, queue))

        # It admits a new TrainJob on the runtime as it was, with nothing of ours, and the pod runs.
        custom.create_namespaced_custom_object(*TRAINER_API, namespace, "trainjobs", {
            "apiVersion": "/".join(TRAINER_API), "kind": "TrainJob",
            "metadata": {"name": "after", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
            "spec": {"runtimeRef": {"apiGroup": TRAINER_API[0], "kind": "TrainingRuntime", "name": "installed"},
                     # 100m: it fits beside the quota the watched TrainJob holds (and the first one's,
                     # should its Workload not have released it yet).
                     "trainer": {"command": ["/bin/sh", "-c", "echo after"],
                                 "resourcesPerNode": {"requests": {"cpu": "100m"}}}}})
        try:
            wait("the new TrainJob's Workload to be admitted", lambda: admitted(custom, namespace, "after"))
        except AssertionError as e:
            raise AssertionError(f"{e}; Workloads: {workloads_now(custom, namespace)}") from None

        def succeeded() -> bool:
            pods = core.list_namespaced_pod(namespace, label_selector="jobset.sigs.k8s.io/jobset-name=after").items
            return bool(pods) and all(p.status.phase == "Succeeded" for p in pods)

        try:
            wait("the new TrainJob's pod to succeed", succeeded)
        except AssertionError as e:
            pods = core.list_namespaced_pod(namespace).items
            raise AssertionError(f"{e}; pods: {[(p.metadata.name, p.status.phase) for p in pods]}") from None


def admitted(custom: kubernetes.client.CustomObjectsApi, namespace: str, trainjob: str) -> bool:
    """TRAINJOB's Workload is Admitted."""
    return any(c["type"] == "Admitted" and c["status"] == "True"
               for w in custom.list_namespaced_custom_object(*KUEUE_API, namespace, "workloads")["items"]
               if any(r.get("name") == trainjob for r in w["metadata"].get("ownerReferences") or [])
               for c in (w.get("status") or {}).get("conditions") or [])


def workloads_now(custom: kubernetes.client.CustomObjectsApi, namespace: str) -> list[Any]:
    """Each Workload of NAMESPACE: its name, its conditions and its checks (what a failed wait shows)."""
    return [(w["metadata"]["name"],
             [(c["type"], c["status"], c.get("reason"), c.get("message"))
              for c in (w.get("status") or {}).get("conditions") or []],
             (w.get("status") or {}).get("admissionChecks"))
            for w in custom.list_namespaced_custom_object(*KUEUE_API, namespace, "workloads")["items"]]
