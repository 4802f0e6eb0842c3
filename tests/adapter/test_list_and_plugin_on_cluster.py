"""The CLI as kubectl users drive it, on the real apiserver: `kubectl
dispatch` through kubectl's own plugin mechanism (the kubectl built beside
the control plane finds `kubectl-dispatch` on PATH), with `--kubeconfig`,
`--context`, `-n`, `-A` and `-o`; the namespace taken from the kubeconfig
context when -n is not given; TrainJob names completed from the cluster."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
import yaml

from devcluster import harness, local
from tests.adapter import kit
from toolkit import adapter, kube

pytestmark = pytest.mark.cluster

BIN = pathlib.Path(__file__).resolve().parents[2] / ".venv" / "bin"


@pytest.fixture
def setup(control_plane, api_client, namespace, tmp_path):
    """An opened TrainJob, and a kubeconfig whose current context points at
    `default` and whose context `team` at the test's namespace."""
    admin = kube.from_api_client(api_client)
    name = kit.create_trainjob(admin, namespace)["metadata"]["name"]
    adapter.open_(admin, namespace=namespace, name=name)
    cfg = yaml.safe_load(pathlib.Path(control_plane.kubeconfig).read_text())
    base = cfg["contexts"][0]["context"]
    cfg["contexts"] = [{"name": "elsewhere", "context": {**base, "namespace": "default"}},
                       {"name": "team", "context": {**base, "namespace": namespace}}]
    cfg["current-context"] = "elsewhere"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    kubectl = str(harness.binary(local.KUBECTL, control_plane.bin_dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_") and k != "KUBECONFIG"}
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"

    def run(*argv: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env={**env, **(extra_env or {})}, capture_output=True, text=True,
                              timeout=60, check=False)

    return name, str(path), kubectl, run


def test_kubectl_dispatch_executions_through_the_plugin_mechanism(setup, namespace):
    name, kubeconfig, kubectl, run = setup
    by_context = run(kubectl, "dispatch", "executions", name, "--kubeconfig", kubeconfig, "--context", "team")
    assert by_context.returncode == 0, by_context.stderr
    assert by_context.stdout.splitlines()[0] == f"trainjob {namespace}/{name} (running)"

    by_flag = run(kubectl, "dispatch", "executions", name, "--kubeconfig", kubeconfig, "-n", namespace, "-o", "yaml")
    assert by_flag.returncode == 0, by_flag.stderr
    doc = yaml.safe_load(by_flag.stdout)
    assert (doc["namespace"], doc["name"], doc["state"]) == (namespace, name, "running")
    long_flag = run(kubectl, "dispatch", "executions", name, "--kubeconfig", kubeconfig, "--namespace", namespace,
                    "-o", "json")
    assert json.loads(long_flag.stdout) == doc

    every = run(kubectl, "dispatch", "executions", "-A", "-o", "json", "--kubeconfig", kubeconfig)
    assert every.returncode == 0, every.stderr
    assert {"namespace": namespace, "name": name} in [{k: r[k] for k in ("namespace", "name")}
                                                      for r in json.loads(every.stdout)["items"]]

    # the current context's namespace (default) has no such TrainJob: a one-line refusal naming it
    missing = run(kubectl, "dispatch", "executions", name, "--kubeconfig", kubeconfig)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == f"kubectl dispatch executions: TrainJob default/{name} not found\n"
    both = run(kubectl, "dispatch", "executions", name, "-A", "--kubeconfig", kubeconfig)
    assert (both.returncode, both.stderr) == (2, "kubectl dispatch executions: a TrainJob is named in one namespace: "
                                                 "give -n NAMESPACE, not -A (see 'kubectl dispatch executions --help')\n")


def test_toolkit_acts_in_the_context_s_namespace_without_n(setup, namespace):
    name, kubeconfig, _, run = setup
    listed = run(str(BIN / "toolkit"), "list", "--context", "team", "-o", "json", extra_env={"KUBECONFIG": kubeconfig})
    assert listed.returncode == 0, listed.stderr
    assert [(r["namespace"], r["name"]) for r in json.loads(listed.stdout)["items"]] == [(namespace, name)]
    status = run(str(BIN / "toolkit"), "status", name, "--context", "team", "-o", "json",
                 extra_env={"KUBECONFIG": kubeconfig})
    assert status.returncode == 0 and json.loads(status.stdout)["namespace"] == namespace


@pytest.mark.parametrize(("program", "var"), [("toolkit", "_TOOLKIT_COMPLETE"),
                                              ("kubectl-dispatch", "_KUBECTL_DISPATCH_COMPLETE")])
def test_trainjob_names_complete_from_the_cluster(setup, program, var):
    name, kubeconfig, _, run = setup
    words = f"{program} status --context team {name[:3]}"
    done = run(str(BIN / program), extra_env={"KUBECONFIG": kubeconfig, var: "bash_complete",
                                              "COMP_WORDS": words, "COMP_CWORD": "4"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"plain,{name}"]
    nothing = run(str(BIN / program), extra_env={"KUBECONFIG": kubeconfig, var: "bash_complete",
                                                 "COMP_WORDS": f"{program} status {name[:3]}", "COMP_CWORD": "2"})
    assert (nothing.returncode, nothing.stdout.split()) == (0, [])  # the current context's namespace has none


def test_kubectl_completes_the_plugin_s_words_from_the_cluster(setup):
    """kubectl's own completion (`kubectl __complete`, what its shell script calls) runs
    kubectl_complete-dispatch for the words after `dispatch`."""
    name, kubeconfig, kubectl, run = setup
    commands = run(kubectl, "__complete", "dispatch", "exec", extra_env={"KUBECONFIG": kubeconfig})
    assert commands.returncode == 0, commands.stderr
    assert commands.stdout.splitlines()[-1] == ":4"
    assert [line.split("\t")[0] for line in commands.stdout.splitlines()[:-1]] == ["executions"]
    names = run(kubectl, "__complete", "dispatch", "status", "--context", "team", name[:3],
                extra_env={"KUBECONFIG": kubeconfig})
    assert names.returncode == 0, names.stderr
    assert names.stdout.splitlines() == [name, ":4"]
