"""wrap and render: the command and env of the trainer, the runtime helper, and
Trainer v2.3.0's own runtimes (from its Go module) before and after."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import subprocess
from typing import Any

import pytest

from toolkit import names, prologue, render, request, runtime_check, wrap, yamlio

REPO = pathlib.Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "start-request.yaml"


def test_command_embeds_the_prologue_byte_for_byte() -> None:
    assert wrap.command() == ["/bin/sh", "-c", (REPO / "prologue" / "prologue.sh").read_bytes().decode(), "dispatch-prologue"]
    assert prologue.text().encode() == (REPO / "prologue" / "prologue.sh").read_bytes()


def test_env_order_and_reserved_keys() -> None:
    env = wrap.env(job={"ZED": "1", "ALPHA": "2", "MID": "3"}, epoch_prefix="5", token_prefix="j.0.0", workdir="/w")
    assert [e["name"] for e in env] == [
        "ALPHA", "MID", "ZED",
        names.ENV_ADMISSION, names.ENV_RESTART, names.ENV_EPOCH_PREFIX, names.ENV_TOKEN_PREFIX, names.ENV_WORKDIR,
    ]
    assert env[3]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['dispatch.phpboyscout.uk/admission']"
    assert env[4]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
    assert [e["name"] for e in wrap.env(job={}, epoch_prefix="", token_prefix="t")][-1] == names.ENV_TOKEN_PREFIX
    for bad in ("DISPATCH_", "DISPATCH_EPOCH", "DISPATCH_K8S_ADMISSION"):
        with pytest.raises(wrap.ReservedEnvError, match=bad):
            wrap.env(job={bad: "x"}, epoch_prefix="", token_prefix="t")
    with pytest.raises(wrap.ReservedEnvError, match="twice"):
        wrap.job_env([("A", "1"), ("A", "2")])


@pytest.mark.parametrize("words", [["echo", "plain"], ["printf", "%s|", "it's", "a \"b\"", "$HOME", "new\nline", ""]])
def test_shell_line_reads_back_as_the_same_words(words: list[str]) -> None:
    line = wrap.shell_line(["/bin/sh", "-c", 'printf "%s\\0" "$@"', "x", *words])
    out = subprocess.run(["sh", "-c", line], capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [w.encode() for w in words]


def test_rendered_trainjob_runs_through_a_real_sh(tmp_path: pathlib.Path) -> None:
    """The trainer command, args and env of the rendered TrainJob, run the way
    the kubelet would (env resolved, exec of command + args), give the epoch
    and attempt identity says."""
    req = request.from_dict({**yamlio.load_document(str(EXAMPLE)), "workdir": str(tmp_path),
                             "command": ["/bin/sh", "-c", 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT $PWD $HF_HOME"']})
    tj = render.trainjob(req)
    trainer = tj["spec"]["trainer"]
    pod = {"annotations": {names.ADMISSION_ANNOTATION: "4"}, "labels": {names.RESTART_LABEL: "2"}}
    env = {"PATH": "/usr/bin:/bin"}
    for entry in trainer["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            kind, key = path.split("[")
            env[entry["name"]] = pod[kind.split(".")[1]][key.strip("']")]
    out = subprocess.run(trainer["command"] + trainer["args"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1000002000006", "team-a.llama-finetune.2.0.4.2", str(tmp_path), "/cache/hf"]


def test_trainjob_shape() -> None:
    tj = render.trainjob(request.load(str(EXAMPLE)))
    assert tj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and tj["kind"] == "TrainJob"
    spec = tj["spec"]
    assert spec["suspend"] is True
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    assert spec["trainer"]["command"] == wrap.command() and spec["trainer"]["args"] == ["python", "train.py", "--epochs", "3"]
    assert spec["trainer"]["numNodes"] == 2
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == names.PATCH_MANAGER
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    assert rjob["template"]["spec"]["template"]["metadata"]["annotations"] == {names.ADMISSION_ANNOTATION: "0"}
    assert tj["metadata"]["labels"] == {names.KUEUE_QUEUE_LABEL: "team-a"}
    assert tj["metadata"]["annotations"][names.JOB_ID_ANNOTATION] == "team-a.llama-finetune"
    # The YAML written round-trips to the same object, prologue bytes included.
    assert yamlio.loads_yaml(yamlio.dump(tj), where="x") == [tj]


# -- runtimes -------------------------------------------------------------


@pytest.fixture(scope="session")
def trainer_runtimes() -> list[pathlib.Path]:
    """The ClusterTrainingRuntimes Kubeflow Trainer v2.3.0 ships, from its Go module."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", "github.com/kubeflow/trainer/v2@v2.3.0"],
        capture_output=True, text=True, check=True, cwd="/tmp", timeout=300,
    )
    root = pathlib.Path(json.loads(out.stdout)["Dir"]) / "manifests" / "base" / "runtimes"
    files = sorted(p for p in root.rglob("*.yaml") if p.name != "kustomization.yaml")
    assert len(files) >= 8, files
    return files


def test_shipped_runtimes_are_refused_then_accepted_after_render(trainer_runtimes: list[pathlib.Path]) -> None:
    for path in trainer_runtimes:
        (doc,) = yamlio.load_documents(str(path))
        assert doc["kind"] == "ClusterTrainingRuntime"
        refusals = [str(r) for r in runtime_check.check(doc)]
        steps = [str(r) for r in runtime_check.trainer_step(doc)]
        assert refusals == [*steps,
            "spec.template.spec.replicatedJobs[node].template.spec.template.spec.restartPolicy: must be Never, found absent",
            "spec.template.spec.replicatedJobs[node].template.spec.backoffLimit: must be 0, found absent",
        ], path
        if steps:
            # An MPI runtime gives spec.trainer to its launcher: `node` would run without the
            # prologue. Refused by render too, by that field.
            assert any("replicatedJobs[launcher]" in s for s in steps) and any("replicatedJobs[node]" in s for s in steps)
            with pytest.raises(render.RenderError, match="must be trainer"):
                render.runtime(doc, sidecar_image="sidecar:test")
            continue
        before = copy.deepcopy(doc)
        rendered = render.runtime(doc, sidecar_image="sidecar:test")
        assert doc == before, "render must not modify its input"
        assert runtime_check.check(rendered) == [], path
        assert render.runtime(rendered, sidecar_image="sidecar:test") == rendered, "render runtime must be idempotent"
        pod = rendered["spec"]["template"]["spec"]["replicatedJobs"]
        node = next(r for r in pod if r["name"] == "node")["template"]["spec"]["template"]["spec"]
        sidecars = [c for c in node["initContainers"] if c["name"] == names.SIDECAR_CONTAINER]
        assert len(sidecars) == 1 and sidecars[0]["restartPolicy"] == "Always"
        assert "serviceAccountName" not in node  # the pods keep the namespace's default account


def test_sidecar_contract() -> None:
    c = render.sidecar_container(image="img:1")
    assert c["image"] == "img:1" and c["restartPolicy"] == "Always"
    assert c["volumeMounts"] == [{"name": names.PODINFO_VOLUME, "mountPath": "/etc/dispatch/podinfo", "readOnly": True},
                                 {"name": names.SIDECAR_STATE_VOLUME, "mountPath": "/run/dispatch-sidecar"},
                                 {"name": names.SIDECAR_TOKEN_VOLUME,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]
    # The trainer waits for the sidecar's first check (its mark file), never for a verdict.
    assert c["startupProbe"]["exec"]["command"] == ["python3", "-S", "-m", "sidecar", "--started"]
    assert {"name": "DISPATCH_SIDECAR_STARTED_FILE", "value": "/run/dispatch-sidecar/started"} in c["env"]
    assert render.sidecar_state_volume() == {"name": names.SIDECAR_STATE_VOLUME,
                                             "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    files = {i["path"]: i["fieldRef"]["fieldPath"] for i in render.podinfo_volume()["downwardAPI"]["items"]}
    assert files == {"annotations": "metadata.annotations", "labels": "metadata.labels",
                     "name": "metadata.name", "namespace": "metadata.namespace"}


def _runtime(**node_job: object) -> dict[str, object]:
    base = render.runtime({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime", "metadata": {"name": "r"},
        "spec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"metadata": {"labels": runtime_check.TRAINER_STEP_LABELS},
                                          "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "i"}]}}}}},
        ]}}},
    }, sidecar_image="sidecar:test")
    return base


NODE = "spec.template.spec.replicatedJobs[node].template.spec"


@pytest.mark.parametrize(
    ("mutate", "expected", "rank"),
    [
        (lambda d, j, p: p.update(restartPolicy="OnFailure"), f'{NODE}.template.spec.restartPolicy: must be Never, found "OnFailure"', False),
        (lambda d, j, p: j.update(backoffLimit=6), f"{NODE}.backoffLimit: must be 0, found 6", False),
        (lambda d, j, p: p["containers"][0].update(restartPolicy="Always"), f'{NODE}.template.spec.containers[node].restartPolicy: must be absent or Never (in-place restart), found "Always"', False),
        (lambda d, j, p: d["spec"]["template"]["spec"].update(failurePolicy={"rules": [{"name": "x", "action": "RestartJob"}]}),
         'spec.template.spec.failurePolicy.rules[0].action: must not replace a failed rank without a JobSet restart (set allowRankRestart to permit it), found "RestartJob"', True),
        (lambda d, j, p: d["spec"]["template"]["spec"].update(failurePolicy={"rules": [{"name": "x", "action": "RestartJobAndIgnoreMaxRestarts", "targetReplicatedJobs": ["node"]}]}),
         "spec.template.spec.failurePolicy.rules[0].action", True),
        (lambda d, j, p: d["spec"]["template"]["spec"].update(failurePolicy={"restartStrategy": "InPlaceRestart"}),
         'spec.template.spec.failurePolicy.restartStrategy: must not restart pods in place (set allowRankRestart to permit it), found "InPlaceRestart"', True),
        (lambda d, j, p: j.update(backoffLimitPerIndex=0), f"{NODE}.backoffLimitPerIndex: must be absent", True),
        (lambda d, j, p: j.update(podFailurePolicy={"rules": [{"action": "FailJob"}, {"action": "Ignore"}]}),
         f'{NODE}.podFailurePolicy.rules[1].action: must not be Ignore', True),
    ],
)
def test_each_refusal_names_the_field_and_value(mutate, expected: str, rank: bool) -> None:  # type: ignore[no-untyped-def]
    doc = _runtime()
    assert runtime_check.check(doc) == []
    rjob = doc["spec"]["template"]["spec"]["replicatedJobs"][0]  # type: ignore[index]
    job_spec = rjob["template"]["spec"]
    mutate(doc, job_spec, job_spec["template"]["spec"])
    refusals = [str(r) for r in runtime_check.check(doc)]
    assert len(refusals) == 1 and refusals[0].startswith(expected), refusals
    assert (runtime_check.check(doc, allow_rank_restart=True) == []) is rank


def test_rules_for_other_replicated_jobs_and_fine_actions_pass() -> None:
    doc = _runtime()
    doc["spec"]["template"]["spec"]["failurePolicy"] = {  # type: ignore[index]
        "restartStrategy": "Recreate",
        "rules": [{"name": "a", "action": "RestartJob", "targetReplicatedJobs": ["launcher"]},
                  {"name": "b", "action": "RestartJobSet"}, {"name": "c", "action": "FailJobSet"}],
    }
    assert runtime_check.check(doc) == []


def test_not_a_runtime() -> None:
    assert [str(r) for r in runtime_check.check({"kind": "Pod"})] == [
        'kind: must be ClusterTrainingRuntime or TrainingRuntime, found "Pod"']
    assert [str(r) for r in runtime_check.check({"kind": "TrainingRuntime", "spec": {}})] == [
        "spec.template.spec.replicatedJobs[node]: the trainer's replicated job must exist, found absent"]


def test_a_runtime_whose_trainer_step_is_not_node_is_refused_by_field_by_render_and_check() -> None:
    """Trainer gives the TrainJob's command, the prologue and its env only to the replicated job
    labelled trainjob-ancestor-step=trainer: without that label on `node` (or with it on another
    job) the pods run the image's own command, with no DISPATCH_EPOCH."""
    field = "spec.template.spec.replicatedJobs[{}].template.metadata.labels[trainer.kubeflow.org/trainjob-ancestor-step]"
    rendered = _runtime()
    unlabelled = copy.deepcopy(rendered)
    del unlabelled["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["metadata"]
    assert [str(r) for r in runtime_check.check(unlabelled)] == [
        f"{field.format('node')}: must be trainer: Trainer gives the TrainJob's command, the prologue and its env "
        "only to the replicated job so labelled, found absent"]
    with pytest.raises(render.RenderError, match=re.escape(field.format("node"))):
        render.runtime(unlabelled, sidecar_image="sidecar:test")
    other = copy.deepcopy(rendered)
    other["spec"]["template"]["spec"]["replicatedJobs"].append(
        {"name": "launcher", "template": {"metadata": {"labels": runtime_check.TRAINER_STEP_LABELS}}})
    assert [r.path for r in runtime_check.check(other)] == [field.format("launcher")]
    with pytest.raises(render.RenderError, match=re.escape(field.format("launcher"))):
        render.runtime(other, sidecar_image="sidecar:test")


def test_only_the_sidecar_mounts_the_service_account_token() -> None:
    """No automount on the pod: the sidecar's projected token goes into the sidecar alone, and a
    projected token the runtime mounts for its own trainer (cloud credentials) is left as it is."""
    own = {"name": "cloud-token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "audience": "sts.example", "expirationSeconds": 3600}}]}}
    doc = _runtime()
    pod = doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["volumes"].append(own)
    pod["containers"][0]["volumeMounts"] = [{"name": "cloud-token", "mountPath": "/var/run/secrets/cloud"}]
    rendered = render.runtime(doc, sidecar_image="sidecar:test")
    pod = rendered["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cloud-token"] == own
    sources = volumes[names.SIDECAR_TOKEN_VOLUME]["projected"]["sources"]
    assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    mounting = {c["name"] for c in [*pod["containers"], *pod["initContainers"]]
                if any(m["name"] == names.SIDECAR_TOKEN_VOLUME for m in c.get("volumeMounts") or [])}
    assert mounting == {names.SIDECAR_CONTAINER}
    assert pod["containers"][0]["volumeMounts"] == [{"name": "cloud-token", "mountPath": "/var/run/secrets/cloud"}]


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


def test_the_pods_keep_their_own_service_account_unless_one_is_asked_for() -> None:
    """The account a cloud binding names (IRSA, Pod Identity, Workload Identity) is the pods' own:
    render keeps the runtime's, or none (the namespace's default); --service-account sets one, and
    refuses, naming the field, to replace another the runtime names."""
    doc = _runtime()
    assert "serviceAccountName" not in _pod_spec(render.runtime(doc, sidecar_image="sidecar:test"))
    _pod_spec(doc)["serviceAccountName"] = "trainer-cloud"
    rendered = render.runtime(doc, sidecar_image="sidecar:test")
    assert _pod_spec(rendered)["serviceAccountName"] == "trainer-cloud"
    assert render.runtime(rendered, sidecar_image="sidecar:test") == rendered
    assert _pod_spec(render.runtime(doc, sidecar_image="sidecar:test", service_account="trainer-cloud"))[
        "serviceAccountName"] == "trainer-cloud"
    assert _pod_spec(render.runtime(_runtime(), sidecar_image="sidecar:test", service_account="dispatch-sidecar"))[
        "serviceAccountName"] == "dispatch-sidecar"
    with pytest.raises(render.RenderError, match=re.escape(
            "spec.template.spec.replicatedJobs[node].template.spec.template.spec.serviceAccountName: "
            "is 'trainer-cloud', but the service account asked for is 'other'")):
        render.runtime(doc, sidecar_image="sidecar:test", service_account="other")
    with pytest.raises(render.RenderError, match=r"service account: 'Bad_Name' is not a DNS-1123 subdomain"):
        render.runtime(_runtime(), sidecar_image="sidecar:test", service_account="Bad_Name")
