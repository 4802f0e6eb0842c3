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
object of either file is left, no pod of ours runs, and the ClusterQueue is Active.
"""

from __future__ import annotations

import pathlib

import kubernetes.client
import pytest

from devcluster import install, local, scenario as flow, stack as stack_mod
from devcluster.scenario import KUEUE_API, Scenario
from tests.e2e.installing import (CHECK, active, admitted_with_a_raised, kubectl, listing_our_check,
                                  queue_without_our_check, wait)

E2E_KUEUE = True  # Trainer, JobSet and Kueue
E2E_OURS = False  # and nothing of ours: the release is what installs it
# The suite's own budget for the test, beside the wait for the host's node slot: `make test-matrix`
# runs this test alone, so the session's cluster starts, and waits for that slot, inside it.
BUDGET_SECONDS = 600.0


@pytest.mark.timeout(local.NODE_WAIT_SECONDS + BUDGET_SECONDS)
def test_install_run_a_trainjob_and_uninstall_on_a_cluster_with_nothing_of_ours(
        stack: stack_mod.Stack, e2e_namespace: str, tmp_path: pathlib.Path) -> None:
    namespace = e2e_namespace
    queue = f"cq-{namespace}"
    with stack.plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        core = kubernetes.client.CoreV1Api(api)
        # The cluster before: a ClusterQueue that admits without any check of ours.
        assert queue_without_our_check(api, namespace) == queue

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
        admitted_with_a_raised(job, "installed", "install.first")
        assert job.foreign() is None

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

        # Nothing of ours is left: no object of either file, no pod of ours anywhere.
        assert kubectl(stack, "get", "--ignore-not-found", "-o", "name", "-f", str(files["controller.yaml"])) == ""
        assert kubectl(stack, "get", "--ignore-not-found", "-o", "name", "-n", namespace,
                       "-f", str(files["sidecar-rbac.yaml"])) == ""
        ours = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/part-of=dispatch-k8s").items
        assert [p.metadata.name for p in ours] == []

        # The ClusterQueue is Active without our check.
        wait("the ClusterQueue to be Active without our check", lambda: active(custom, queue))

