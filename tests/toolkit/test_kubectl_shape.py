"""The CLI spelled as kubectl is: one meaning per option letter in every
command, `-o` always an output format, old spellings refused in one line
that names the new one, the namespace from the kubeconfig context, and
completion scripts for three shells. No cluster here (the cluster half:
tests/adapter/test_list_and_plugin_on_cluster.py)."""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator

import click
import pytest
import yaml
from click.testing import CliRunner

from toolkit import cli, cli_cluster, cli_output, kubecontext, listing

REPO = pathlib.Path(__file__).parents[2]
EXAMPLE = str(REPO / "examples" / "start-request.yaml")
BIN = REPO / ".venv" / "bin"


def _commands(group: click.Group, path: str = "toolkit") -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield f"{path} {name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path} {name}")


def _visible_options(command: click.Command) -> Iterator[click.Option]:
    for p in command.params:
        if isinstance(p, click.Option) and not p.hidden:
            yield p


def test_an_option_letter_means_one_thing_in_every_command() -> None:
    meaning: dict[str, set[tuple[str, ...]]] = {}
    where: dict[str, list[str]] = {}
    for path, command in _commands(cli.root):
        for option in _visible_options(command):
            for short in (o for o in option.opts + option.secondary_opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(tuple(o for o in option.opts if o.startswith("--")))
                where.setdefault(short, []).append(path)
    two = {k: v for k, v in meaning.items() if len(v) > 1}
    assert not two, {k: (sorted(v), where[k]) for k, v in two.items()}
    assert meaning["-n"] == {("--namespace",)} and meaning["-o"] == {("--output",)}
    assert meaning["-A"] == {("--all-namespaces",)} and meaning["-l"] == {("--selector",)}


def test_o_is_an_output_format_wherever_it_is() -> None:
    seen = []
    for path, command in _commands(cli.root):
        for option in _visible_options(command):
            if "-o" in option.opts:
                assert isinstance(option.type, cli_output.OutputFormat), path
                seen.append(path.split(" ", 1)[1])
    assert {"wrap", "render trainjob", "render runtime", "status", "executions", "list"} <= set(seen)


def test_commands_on_a_cluster_take_kubeconfig_context_and_namespace() -> None:
    for name in ("open", "hold", "release", "status", "executions", "list", "adopt"):
        opts = {o for p in cli.root.get_command(click.Context(cli.root), name).params for o in p.opts}  # type: ignore[union-attr]
        assert {"--kubeconfig", "--context", "-n", "--namespace", "-h"} <= opts | {"-h"}, name
        assert ("-A" in opts) == (name in ("executions", "list")), name


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["render", "trainjob", EXAMPLE, "-o", "tj.yaml"],
         "toolkit render trainjob: Invalid value for '-o' / '--output': 'tj.yaml' is not an output format "
         "(yaml, json); to write a file, --output-file tj.yaml (see 'toolkit render trainjob --help')"),
        (["identity", "--job-id", "j", "-g", "1", "-n", "2", "--attempt", "0", "-a", "1", "-j", "0"],
         "toolkit identity: -n is gone: -n is the namespace in every toolkit command; the submission number "
         "is --submission (see 'toolkit identity --help')"),
        (["wrap", "--format", "yaml", "--", "true"],
         "toolkit wrap: --format is gone: the format is -o/--output (json, yaml or shell) "
         "(see 'toolkit wrap --help')"),
        (["status", "-o", "text", "x"],
         "toolkit status: Invalid value for '-o' / '--output': 'text' is not an output format (table, json, "
         "yaml); the text table is -o table, the default (see 'toolkit status --help')"),
        (["executions", "x", "-A"],
         "toolkit executions: a TrainJob is named in one namespace: give -n NAMESPACE, not -A "
         "(see 'toolkit executions --help')"),
    ],
)
def test_an_old_spelling_is_refused_in_one_line_naming_the_new_one(args: list[str], line: str,
                                                                   tmp_path: pathlib.Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli.root, args, prog_name="toolkit", env={"KUBECONFIG": "/nonexistent"})
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", line + "\n")
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing asked of a cluster


def test_render_prints_yaml_or_json_and_writes_a_file_only_with_output_file(tmp_path: pathlib.Path) -> None:
    as_yaml = CliRunner().invoke(cli.root, ["render", "trainjob", EXAMPLE])
    as_json = CliRunner().invoke(cli.root, ["render", "trainjob", EXAMPLE, "-o", "json"])
    assert as_yaml.exit_code == as_json.exit_code == 0
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
    out = tmp_path / "tj.json"
    written = CliRunner().invoke(cli.root, ["render", "trainjob", EXAMPLE, "-o", "json", "--output-file", str(out)])
    assert (written.exit_code, written.stdout) == (0, "") and json.loads(out.read_text()) == json.loads(as_json.stdout)


def _kubeconfig(path: pathlib.Path, *, current: str, contexts: dict[str, str | None]) -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", **({"current-context": current} if current else {}),
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}}
                     for n, ns in contexts.items()],
    }
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_namespace_is_the_flag_then_the_context_s_then_default(tmp_path: pathlib.Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = _kubeconfig(tmp_path / "config", current="dev", contexts={"dev": "training", "ops": "ops-ns", "bare": None})
    assert kubecontext.namespace(given=None, kubeconfig=cfg, context=None) == "training"
    assert kubecontext.namespace(given=None, kubeconfig=cfg, context="ops") == "ops-ns"
    assert kubecontext.namespace(given=None, kubeconfig=cfg, context="bare") == "default"
    assert kubecontext.namespace(given="mine", kubeconfig=cfg, context="ops") == "mine"
    assert kubecontext.namespace(given=None, kubeconfig=str(tmp_path / "missing"), context=None) == "default"
    # $KUBECONFIG may list several files: their contexts are merged, as the client merges them
    other = _kubeconfig(tmp_path / "other", current="", contexts={"elsewhere": "from-other"})
    monkeypatch.setenv("KUBECONFIG", f"{other}:{cfg}")
    assert kubecontext.namespace(given=None, kubeconfig=None, context="elsewhere") == "from-other"
    assert kubecontext.namespace(given=None, kubeconfig=None, context=None) == "training"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
@pytest.mark.parametrize(("program", "var"), [("toolkit", "_TOOLKIT_COMPLETE"),
                                              ("kubectl-dispatch", "_KUBECTL_DISPATCH_COMPLETE")])
def test_completion_prints_the_shell_s_script(shell: str, program: str, var: str) -> None:
    out = subprocess.run([str(BIN / program), "completion", shell], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == ""
    assert var in out.stdout and f"{shell}_complete" in out.stdout
    bad = subprocess.run([str(BIN / program), "completion", "tcsh"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_the_list_table_is_kubectl_s() -> None:
    import datetime

    rows = [listing.Row(namespace="a", name="llama-ft-7", state="running", mode="kueue", admission=5, executions=5,
                        high_water=5, foreign=True, causes=2, created="2026-12-05T18:00:00Z"),
            listing.Row(namespace="b", name="x", state="suspended", mode="plain", admission=0, executions=0,
                        high_water=0, foreign=False, causes=0, created="2026-12-05T19:59:15Z")]
    now = datetime.datetime(2026, 12, 5, 20, 0, 0, tzinfo=datetime.timezone.utc)
    assert cli_cluster.list_table(rows, every=True, now=now).splitlines() == [
        "NAMESPACE   NAME         STATE       MODE    A   EXECUTIONS   HIGH-WATER R   FOREIGN   AGE",
        "a           llama-ft-7   running     kueue   5   5            5              yes (2)   2h",
        "b           x            suspended   plain   0   0            0              no        45s",
    ]
    assert cli_cluster.list_table(rows[1:], every=False, now=now).splitlines()[0].startswith("NAME ")
