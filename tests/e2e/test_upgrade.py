"""Upgrade from the previous commit's release to this checkout's, with a TrainJob in flight, as
docs/install.md's "Upgrading" tells a platform engineer, on a cluster with nothing of ours.

The previous commit (a detached git worktree of HEAD~1) builds its own release with its own code:
its images, pushed to the cluster's registry under its version, and its bundle. It is installed as
the install test does (controller.yaml, the sidecar's RBAC, our check on a ClusterQueue, a runtime
converted for its sidecar), and a TrainJob admitted by it runs with A = 1. Then this checkout's
controller.yaml is applied over it, and while the Deployment rolls, the TrainJob is evicted and
made active again: its admission is raised and approved by whichever replica leads, old or new.

Outcome: the TrainJob is admitted again within the bound with A = 2, its pods carry it, and no
execution repeats an epoch (R = A + J); once the rollout is done every controller pod runs this
release's image and one of them holds the Lease; no Workload is left waiting on our check; the
history annotation the controllers wrote carries its format version.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import kubernetes.client

from devcluster import install, local, scenario as flow, stack as stack_mod
from devcluster.scenario import KUEUE_API, Scenario
from tests.e2e.installing import CHECK, active, kubectl, listing_our_check, wait
from toolkit import history, names, raising, render

E2E_KUEUE = True  # Trainer, JobSet and Kueue
E2E_OURS = False  # and nothing of ours: the releases install it

REPO = pathlib.Path(__file__).resolve().parents[2]
# Run in the previous commit's tree with its own code: its release built, pushed to the cluster's
# registry (found through the cluster's workdir), and rendered; prints the image references. Its
# manifests are rendered as that commit renders them: by a kustomize binary, or by the kubectl of
# the Kubernetes build before it (whichever its build_release takes).
BUILD_PREVIOUS = """
import inspect, json, pathlib, sys
from devcluster import install, registry
from release import bundle
out, workdir, kubectl, kustomize = (pathlib.Path(a) for a in sys.argv[1:5])
renderer = ({"kustomize": kustomize} if "kustomize" in inspect.signature(bundle.build_release).parameters
            else {"kubectl": kubectl})
cluster_registry = registry.Registry.open(workdir)
prepared = install.prepare(out)
made = bundle.build_release(registry=cluster_registry.name, out_dir=out, push=cluster_registry.push,
                            version=prepared.build.version, local_images=prepared.local_images, **renderer)
print(json.dumps(made.references))
"""


def _previous_release(stack: stack_mod.Stack, tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, str]]:
    """The previous commit's bundle directory and image references, built by its own code."""
    tree = tmp_path / "previous"
    done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), "HEAD~1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"git worktree add HEAD~1 (the previous commit is needed): {done.stderr}"
    try:
        built = subprocess.run([sys.executable, "-c", BUILD_PREVIOUS, str(tmp_path / "previous-release"),
                                str(stack.plane.workdir), str(install.kubectl(stack)), str(local.kustomize())],
                               cwd=tree, env={**_env(), "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                               timeout=1200, check=False)
        assert built.returncode == 0, f"the previous commit's release: {built.stderr[-3000:]}"
        return tmp_path / "previous-release", json.loads(built.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _images(core: kubernetes.client.CoreV1Api) -> set[str]:
    pods = core.list_namespaced_pod(install.NAMESPACE, label_selector=install.SELECTOR).items
    return {c.image for p in pods if not p.metadata.deletion_timestamp for c in p.spec.containers}


def _rolled(core: kubernetes.client.CoreV1Api, reference: str) -> bool:
    """Every pod of the Deployment is this release's, running it, and there are two."""
    pods = [p for p in core.list_namespaced_pod(install.NAMESPACE, label_selector=install.SELECTOR).items
            if not p.metadata.deletion_timestamp]
    repo, digest = reference.split("@")[0].rsplit(":", 1)[0], reference.split("@")[1]
    return len(pods) == 2 and all(s.image_id == f"{repo}@{digest}" for p in pods for s in p.status.container_statuses or [])


def test_upgrade_from_the_previous_commit_with_a_trainjob_in_flight(
        stack: stack_mod.Stack, e2e_namespace: str, tmp_path: pathlib.Path) -> None:
    namespace = e2e_namespace
    queue = f"cq-{namespace}"
    previous_dir, previous = _previous_release(stack, tmp_path)
    current = install.prepare(tmp_path / "release")  # this checkout's images, before anything is applied
    try:
        _upgrade(stack, namespace, queue, previous_dir, previous, current, tmp_path)
    finally:  # the stack serves the next module with nothing of ours: uninstall in docs/install.md's order
        with stack.plane.api_client() as api:
            custom = kubernetes.client.CustomObjectsApi(api)
            try:
                custom.patch_cluster_custom_object(*KUEUE_API, "clusterqueues", queue, {
                    "spec": {"admissionChecksStrategy": None}})
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    raise
            wait("no Workload to list our check", lambda: not listing_our_check(custom))
            try:
                custom.delete_cluster_custom_object(*KUEUE_API, "clusterqueues", queue)
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    raise
        for manifest in (tmp_path / "release" / "controller.yaml", previous_dir / "controller.yaml"):
            if manifest.exists():
                kubectl(stack, "delete", "--ignore-not-found", "--wait=true", "--timeout=180s", "-f", str(manifest))
        stack.sidecar_image = None


def _upgrade(stack: stack_mod.Stack, namespace: str, queue: str, previous_dir: pathlib.Path,
             previous: dict[str, str], current: install.Prepared, tmp_path: pathlib.Path) -> None:
    with stack.plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        core = kubernetes.client.CoreV1Api(api)

        # The previous release, installed and admitting.
        kubectl(stack, "apply", "--server-side", "-f", str(previous_dir / "controller.yaml"))
        kubectl(stack, "apply", "--server-side", "-n", namespace, "-f", str(previous_dir / "sidecar-rbac.yaml"))
        install.wait_leading(stack)
        assert _images(core) == {previous["controller"]}
        flow.kueue_queues(api, suffix=namespace, namespace=namespace, check_controller="example.com/none",
                          cpu="1500m", check=False)
        custom.patch_cluster_custom_object(*KUEUE_API, "clusterqueues", queue, {
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}}})
        wait("the ClusterQueue with our check to be Active", lambda: active(custom, queue))
        stack.sidecar_image = previous["sidecar"]
        job = Scenario(stack, api, namespace, service_account=False)
        # Rendered as the previous release's toolkit rendered runtimes: its pods on `dispatch-sidecar`,
        # the account the previous sidecar-rbac.yaml binds.
        job.create_runtime(render.runtime(flow.runtime("upgraded", cpu="800m"), sidecar_image=previous["sidecar"],
                                          service_account=names.SIDECAR_SERVICE_ACCOUNT), fit=False)
        job.start("upgraded", queue="lq", job_id="upgrade.first", env={"STAY": "1"})
        first = job.new_pods()
        for pod in first:
            job.run(pod)
        assert {p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for p in first} == {"1"}

        # This checkout's release applied over it; the TrainJob evicted and re-admitted during the roll.
        installed = install.install(stack, current, out_dir=tmp_path / "release")
        workload = job.workload()["metadata"]["name"]
        custom.patch_namespaced_custom_object(*KUEUE_API, namespace, "workloads", workload, {"spec": {"active": False}})
        job.wait("the TrainJob suspended and its pods gone",
                 lambda: job.trainjob()["spec"].get("suspend") and not job.pods())
        custom.patch_namespaced_custom_object(*KUEUE_API, namespace, "workloads", workload, {"spec": {"active": True}})
        second = job.new_pods()
        for pod in second:
            job.run(pod)
        assert {p["metadata"]["annotations"][names.ADMISSION_ANNOTATION] for p in second} == {"2"}
        assert raising.counts(job.trainjob()) == raising.Counts(patch=2, floor=2)
        entry = next(e for e in job.workload()["status"]["admissionChecks"] if e["name"] == CHECK)
        assert (entry["state"], entry["message"]) == ("Ready", "A raised to 2"), entry
        job.check_identities()  # no execution repeats an epoch
        assert job.foreign() is None

        # The rollout is done: this release's image in both pods, one of them leading; nothing waits.
        wait("both controller pods to run this release's image",
             lambda: _rolled(core, installed.release.references["controller"]))
        assert install.wait_leading(stack).startswith("dispatch-controller-")
        waiting_on_us = [w["metadata"]["name"] for w in custom.list_cluster_custom_object(*KUEUE_API, "workloads")["items"]
                         if any(e.get("name") == CHECK and e.get("state") == "Pending"
                                for e in (w.get("status") or {}).get("admissionChecks") or [])]
        assert waiting_on_us == []
        annotation = job.wait("the history of both executions", lambda: len(history.of(job.trainjob()).executions) >= 2
                              and job.trainjob()["metadata"]["annotations"][history.HISTORY_ANNOTATION])
        assert json.loads(annotation)["version"] == history.FORMAT_VERSION, annotation
