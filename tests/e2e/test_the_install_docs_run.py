"""Every command block of docs/install.md and docs/operating.md that tests/doc_commands.py lists in
RUN, run as written, in the pages' order, against the local cluster with the release installed as
a user installs it: the pages' placeholders (the training namespace, the TrainJob, the sidecar
image, the checkpoint root) put in from doc_commands.PLACEHOLDERS, the release's files under the
names the pages give them in the directory the commands run in, with the kubectl built with the
control plane and this checkout's `toolkit` first on PATH and the cluster's kubeconfig in
KUBECONFIG. Each command is one `bash -c` and exits 0, or the status doc_commands.STATUS allows it
with its reason.

What the cluster holds before, as a platform engineer's would: a ClusterTrainingRuntime
`torch-distributed` as Trainer ships one (not converted), and a TrainJob made by `toolkit start`
in plain mode, suspended, on a converted runtime (the operating page's runbooks act on it). After
the commands, what they did is read back from the cluster: the runtime converted with the release's
sidecar, the namespace opted in, both controller replicas Running and Ready, the TrainJob released
with A raised. Everything the commands made outside the test's namespace is deleted at the end.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import kubernetes.client

from devcluster import install
from devcluster import scenario as flow
from devcluster import stack as stack_mod
from devcluster.scenario import Scenario
from tests import doc_commands
from tests.e2e.installing import kubectl
from toolkit import names, raising

E2E_KUEUE = True  # Trainer, JobSet, Kueue, and our controller installed from the release
COMMAND_SECONDS = 180
TRAINER = ("trainer.kubeflow.org", "v1alpha1")


def _environment(stack: stack_mod.Stack, bin_dir: pathlib.Path) -> dict[str, str]:
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(install.kubectl(stack))
    venv_bin = pathlib.Path(doc_commands.ROOT / ".venv" / "bin")
    return {**os.environ, "PATH": f"{bin_dir}:{venv_bin}:{os.environ['PATH']}",
            "KUBECONFIG": str(stack.plane.kubeconfig)}


def _run(command: str, *, values: doc_commands.Values, cwd: pathlib.Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", doc_commands.substituted(command, values)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=COMMAND_SECONDS, check=False)
    expected = doc_commands.allowed_status(command)
    assert done.returncode == expected, (
        f"{command!r} exited {done.returncode}, not {expected}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def test_every_command_the_install_and_operating_pages_give_runs_on_the_cluster(
        stack: stack_mod.Stack, e2e_namespace: str, tmp_path: pathlib.Path) -> None:
    release = stack.release_dir
    assert release is not None and stack.sidecar_image, "the Kueue stack installs the release"
    work = tmp_path / "work"
    work.mkdir()
    for name in ("controller.yaml", "dispatcher.yaml", "sidecar-rbac.yaml"):
        (work / name).symlink_to(release / name)
    (work / "service-token").write_text("a token of the backend's\n")
    (tmp_path / "ckpt").mkdir()
    env = _environment(stack, tmp_path / "bin")

    with stack.plane.api_client() as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        # The cluster before: Trainer's runtime, not converted; a TrainJob of ours, suspended.
        shipped = flow.runtime("torch-distributed", cpu="500m")
        shipped["kind"] = "ClusterTrainingRuntime"
        custom.create_cluster_custom_object(*TRAINER, "clustertrainingruntimes", shipped)
        job = Scenario(stack, api, e2e_namespace, service_account=False)
        job.create_runtime(flow.runtime("docs", cpu="500m"))
        job.start("docs", job_id="docs.first")
        values = doc_commands.Values(sidecar_image=stack.sidecar_image, trainjob=job.name,
                                     namespace=e2e_namespace, checkpoint_root=str(tmp_path / "ckpt"))
        printed: dict[str, str] = {}
        try:
            for block in doc_commands.command_blocks():
                if block.key in doc_commands.RUN:
                    for command in doc_commands.commands(block):
                        printed[command] = _run(command, values=values, cwd=work, env=env)

            # What the commands did, read back from the cluster.
            assert "successfully rolled out" in printed[
                "kubectl -n dispatch-system rollout status deployment/dispatch-controller"]
            converted = custom.get_cluster_custom_object(*TRAINER, "clustertrainingruntimes", "torch-distributed")
            pod = converted["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            assert [(c["name"], c["image"]) for c in pod["initContainers"]] == [
                (names.SIDECAR_CONTAINER, stack.sidecar_image)]
            labels = kubernetes.client.CoreV1Api(api).read_namespace(e2e_namespace).metadata.labels
            assert labels.get("dispatch.phpboyscout.uk/identity") == "enabled"
            listed = next(out for command, out in printed.items()
                          if command.startswith("kubectl get pods -n dispatch-system"))
            rows = [line.split() for line in listed.splitlines()[1:]]
            assert [(row[1], row[2]) for row in rows] == [("1/1", "Running")] * 2, listed  # leader and standby
            trainjob = custom.get_namespaced_custom_object(*TRAINER, e2e_namespace, "trainjobs", job.name)
            assert not raising.is_suspended(trainjob) and raising.counts(trainjob).current == 1, trainjob["spec"]
        finally:
            kubectl(stack, "delete", "--ignore-not-found", "clusterrolebinding", "dispatch-metrics-reader")
            kubectl(stack, "delete", "--ignore-not-found", "clustertrainingruntime", "torch-distributed")
            kubectl(stack, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s",
                    "-f", str(release / "dispatcher.yaml"))
