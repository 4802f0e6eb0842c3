"""The CLI: CliRunner for behaviour (exit code and stderr checked apart), and
the installed console script end to end."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from toolkit import cli, identity, releaseinfo, wrap, yamlio

REPO = pathlib.Path(__file__).parents[2]
EXAMPLE = str(REPO / "examples" / "start-request.yaml")
TOOLKIT = str(REPO / ".venv" / "bin" / "toolkit")


def run(*args: str, input: str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli.root, list(args), input=input, prog_name="toolkit")


def one_line(text: str) -> None:
    assert text.count("\n") == 1 and "Traceback" not in text, text


def test_wrap_json_is_the_exec_form() -> None:
    r = run("wrap", "--", "python", "-u", "train.py")
    assert r.exit_code == 0 and r.stderr == ""
    assert json.loads(r.stdout) == wrap.argv(["python", "-u", "train.py"])


def test_wrap_yaml_and_shell() -> None:
    r = run("wrap", "-o", "yaml", "--workdir", "/app", "--", "python", "t.py")
    assert r.exit_code == 0
    assert yamlio.loads_yaml(r.stdout, where="out") == [
        {"command": wrap.command(), "args": ["python", "t.py"], "env": [{"name": "DISPATCH_K8S_WORKDIR", "value": "/app"}]}
    ]
    r = run("wrap", "-o", "shell", "--workdir", "/", "--", "sh", "-c", 'echo "$DISPATCH_EPOCH $DISPATCH_ATTEMPT $PWD"')
    env = {"PATH": "/usr/bin:/bin", "DISPATCH_K8S_ADMISSION": "2", "DISPATCH_K8S_RESTART": "1",
           "DISPATCH_K8S_EPOCH_PREFIX": "3000004", "DISPATCH_K8S_TOKEN_PREFIX": "j.4.0"}
    out = subprocess.run(["sh", "-c", r.stdout], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3000004000003", "j.4.0.2.1", "/"]


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["wrap"], 2, "toolkit wrap: Missing argument"),
        (["wrap", "--workdir", "/x", "--", "true"], 2, "ENV DISPATCH_K8S_WORKDIR=/x"),
        (["wrap", "--", "-x"], 2, "starts with '-'"),
        (["wrap", "-o", "xml", "--", "true"], 2, "toolkit wrap: Invalid value for '-o' / '--output': 'xml' is not an output format (json, yaml, shell)"),
        (["identity", "--parse", "010"], 2, "toolkit identity: epoch = '010' is not 0 or a decimal"),
        (["identity", "--parse", "1000000"], 2, "R = 0"),
        (["identity", "--job-id", "j", "-g", "1"], 2, "missing --submission"),
        (["identity", "--job-id", "j", "-g", "0", "--submission", "0", "--attempt", "0", "-a", "0", "-j", "0"], 2, "A (admission) = 0 is below 1"),
        (["identity", "--job-id", "j", "-g", "0", "--submission", "0", "--attempt", "0", "-a", "999999", "-j", "1"], 2, "reached the bound 1000000"),
        (["identity", "--parse", "1", "-g", "1"], 2, "--parse takes no other option"),
        (["render", "trainjob", "/nonexistent.yaml"], 2, "toolkit render trainjob: /nonexistent.yaml: cannot read"),
        (["nope"], 2, "toolkit: No such command 'nope'"),
        (["check-runtime", "@complex-key"], 2, "a key must be a plain value, found list"),
        (["render", "trainjob", "@complex-key"], 2, "a key must be a plain value, found list"),
        (["check-runtime", "@targets-int"], 1, "targetReplicatedJobs: must be a list of replicated job names, found 5"),
    ],
)
def test_errors_are_one_line(args: list[str], code: int, words: str, tmp_path: pathlib.Path) -> None:
    files = {
        "@complex-key": "? [a, b]\n: 1\n",
        "@targets-int": (
            "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: {name: r}\n"
            "spec:\n  template:\n    spec:\n      failurePolicy:\n        rules:\n"
            "        - {action: RestartJob, targetReplicatedJobs: 5}\n"
            "      replicatedJobs:\n      - name: node\n        template:\n"
            "          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}\n"
            "          spec:\n            backoffLimit: 0\n"
            "            template:\n              spec:\n                restartPolicy: Never\n"
            "                containers: [{name: node, image: i}]\n"
        ),
    }
    for i, arg in enumerate(args):
        if arg in files:
            path = tmp_path / f"{arg[1:]}.yaml"
            path.write_text(files[arg])
            args = [*args[:i], str(path), *args[i + 1:]]
    r = run(*args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    one_line(r.stderr)
    assert words in r.stderr, r.stderr


def test_identity_both_ways() -> None:
    r = run("identity", "--job-id", "a.b", "-g", "1", "--submission", "2", "--attempt", "0", "-a", "3", "-j", "1")
    assert r.exit_code == 0 and r.stdout == "DISPATCH_EPOCH=1000002000004\nDISPATCH_ATTEMPT=a.b.2.0.3.1\n"
    r = run("identity", "--parse", str(2**63 - 1))
    assert r.stdout == "G=9223372\nN=36854\nR=775807\n"


def test_render_trainjob_to_a_file_atomically(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # click 8.5 deprecates isolated_filesystem: a tmp_path working directory instead.
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(cli.root, ["render", "trainjob", EXAMPLE, "--output-file", "tj.yaml"])
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""
    (doc,) = yamlio.load_documents("tj.yaml")
    assert doc["kind"] == "TrainJob" and doc["spec"]["suspend"] is True
    assert sorted(os.listdir(".")) == ["tj.yaml"], "no temporary file left behind"
    pathlib.Path("bad.yaml").write_text("jobId: [\n")
    r = runner.invoke(cli.root, ["render", "trainjob", "bad.yaml"])
    assert r.exit_code == 2 and "bad.yaml: not YAML" in r.stderr
    one_line(r.stderr)
    pathlib.Path("env.yaml").write_text(pathlib.Path(EXAMPLE).read_text().replace("HF_HOME:", "DISPATCH_X:"))
    r = runner.invoke(cli.root, ["render", "trainjob", "env.yaml"])
    assert r.exit_code == 2 and "env.DISPATCH_X: must not start with DISPATCH_" in r.stderr


def test_render_runtime_then_check_runtime(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    pathlib.Path("rt.yaml").write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: {name: r}\n"
        "spec:\n  template:\n    spec:\n      replicatedJobs:\n      - name: node\n        template:\n"
        "          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}\n"
        "          spec:\n            template:\n              spec:\n                containers: [{name: node, image: i}]\n"
    )
    r = runner.invoke(cli.root, ["check-runtime", "rt.yaml"])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "rt.yaml: ClusterTrainingRuntime/r: spec.template.spec.replicatedJobs[node].template.spec.template.spec.restartPolicy: must be Never, found absent",
        "rt.yaml: ClusterTrainingRuntime/r: spec.template.spec.replicatedJobs[node].template.spec.backoffLimit: must be 0, found absent",
    ]
    r = runner.invoke(cli.root, ["render", "runtime", "rt.yaml", "--output-file", "out.yaml", "--sidecar-image", "s:1"])
    assert r.exit_code == 0, r.stderr
    r = runner.invoke(cli.root, ["check-runtime", "out.yaml", "rt.yaml"])
    assert r.exit_code == 1 and r.stdout == "out.yaml: ClusterTrainingRuntime/r: ok\n"
    r = runner.invoke(cli.root, ["check-runtime", "out.yaml"])
    assert r.exit_code == 0 and r.stderr == ""
    # The default sidecar is the recorded release's (toolkit/data/release.json, written by `make release`).
    pinned = "registry.test/dispatch/sidecar:0.1.0@sha256:" + "a" * 64
    pathlib.Path("release.json").write_text(json.dumps({"version": "0.1.0", "images": {"sidecar": pinned}}))
    monkeypatch.setattr(releaseinfo, "FILE", tmp_path / "release.json")
    r = runner.invoke(cli.root, ["render", "runtime", "out.yaml"])
    assert r.exit_code == 0 and "image: s:1" not in r.stdout and f"image: {pinned}" in r.stdout
    # With no release recorded there is no default: one line, exit 2, naming the option.
    monkeypatch.setattr(releaseinfo, "FILE", tmp_path / "absent.json")
    r = runner.invoke(cli.root, ["render", "runtime", "rt.yaml"])
    assert r.exit_code == 2 and r.stdout == "" and "pass --sidecar-image" in r.stderr
    one_line(r.stderr)


@pytest.mark.parametrize("command", [[], *([name] for name in cli.SUMMARIES), ["render", "trainjob"], ["render", "runtime"]])
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    r = run(*command, "--help")
    assert r.exit_code == 0 and "Example" in r.stdout and "toolkit" in r.stdout


# -- the installed console script ---------------------------------------------


def test_console_script_end_to_end(tmp_path: pathlib.Path) -> None:
    out = subprocess.run([TOOLKIT, "wrap", "--", "true"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == wrap.argv(["true"])
    out = subprocess.run([TOOLKIT, "render", "trainjob", EXAMPLE, "--output-file", str(tmp_path / "tj.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and (tmp_path / "tj.yaml").exists()
    bad = subprocess.run([TOOLKIT, "identity", "--parse", "abc"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    one_line(bad.stderr)


def test_shell_completion_works() -> None:
    env = {**os.environ, "_TOOLKIT_COMPLETE": "bash_complete", "COMP_WORDS": "toolkit che", "COMP_CWORD": "1"}
    out = subprocess.run([TOOLKIT], env=env, capture_output=True, text=True, check=True)
    assert "check-image" in out.stdout and "check-runtime" in out.stdout
    src = subprocess.run([TOOLKIT], env={**os.environ, "_TOOLKIT_COMPLETE": "bash_source"}, capture_output=True, text=True, check=True)
    assert "_toolkit_completion" in src.stdout


def test_wrap_imports_nothing_heavy() -> None:
    code = (
        "import sys; from toolkit import cli\n"
        "try:\n    cli.root.main(['wrap', '--', 'true'], prog_name='toolkit')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kubernetes', 'docker', 'yaml', 'requests', 'urllib3', 'pydantic', 'toolkit.kube', 'toolkit.render'))\n"
        "heavy += [m for m in ('toolkit.kube', 'toolkit.render', 'toolkit.request') if m in sys.modules]\n"
        "print(heavy, file=sys.stderr); sys.exit(1 if heavy else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_lazy_mapping_is_one_line_per_command() -> None:
    for name, target in cli.COMMANDS.items():
        module, _, attr = target.partition(":")
        assert module and attr, name
        assert cli.root.get_command(None, name).name == name  # type: ignore[arg-type, union-attr]


def test_contributed_commands_come_from_the_installed_entry_points() -> None:
    installed = cli.root.contributed()
    assert sorted(installed) == sorted(cli.CONTRIBUTED)
    assert not set(installed) & set(cli.COMMANDS)
    for name, entry_point in installed.items():
        assert not entry_point.value.startswith("toolkit."), "the toolkit's own commands are in its table"
        assert cli.root.get_command(None, name).name == name  # type: ignore[arg-type, union-attr]


def test_identity_cli_matches_the_library() -> None:
    r = run("identity", "--job-id", "x", "-g", "9223372", "--submission", "36854", "--attempt", "1", "-a", "775807", "-j", "0")
    assert r.stdout.splitlines()[0] == f"DISPATCH_EPOCH={identity.MAX_INT64}"
