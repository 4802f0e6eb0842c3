"""The `toolkit` command line's entry points: the standard library only.

Image pipelines run `toolkit wrap` once per build step, so its start is
held to a target (bench/wrap: at most 100 ms, and 1.5x `python -c pass`).
Importing click alone costs more than that ratio leaves, so this module
imports nothing outside the standard library at module level, and:

- `toolkit wrap` that succeeds is answered here without click (`fast_wrap`):
  `wrap [-o|--output FORMAT] [--workdir DIR] [--] CMD...` is parsed as the
  click command parses it, and the text is the same `wrap_text` the click
  command prints. Anything else (help, any error, another spelling, output
  click would not print byte for byte) goes to the click group, which
  answers it as it answers every command. A deliberate second parser of a
  few spellings: it only ever answers what the click command answers with
  exit 0, which tests/toolkit/test_cli_start.py holds, argument list by
  argument list.
- Every other run imports the click group, `toolkit.cli_root` (the lazy
  group, one-line errors and exit codes; the refusals and the helpers the
  commands share are `toolkit.cli_errors` and `toolkit.cli_output`). The
  group knows each subcommand as "module:attribute" in COMMANDS and imports
  it when it is invoked; `toolkit --help` and completion list the commands
  from SUMMARIES, so listing them imports none of them. A command another
  package contributes (the controller's, the local cluster's) is an entry
  point in the group ENTRY_POINTS, loaded by name when invoked: the toolkit
  never imports the layers above it or the tools beside the product
  (docs/toolkit.md, "Architecture"; tests/lint/test_layers.py).

Adding a command is one entry in _TABLE: its name, "module:attribute" of a
click.Command (or Group) defined at module level, and the first sentence of
its help (tests/toolkit/test_cli_start.py checks the sentence against the
command's own). Keep heavy imports out of the top of a command's module.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

# name -> ("module:attribute", the first sentence of the command's help).
_TABLE: dict[str, tuple[str, str]] = {
    "wrap": ("toolkit.cli_wrap:wrap",
        "Print CMD wrapped in the dispatch prologue (-o json: one exec-form array for a Containerfile ENTRYPOINT; yaml: a container's command, args and env; shell: one command line)."),
    "render": ("toolkit.cli_render:render",
        "Render a TrainJob from a StartRequest, or prepare a runtime."),
    "check-runtime": ("toolkit.cli_checks:check_runtime",
        "Check (Cluster)TrainingRuntimes against the runtime requirements."),
    "check-image": ("toolkit.cli_checks:check_image",
        "Prove that an image (or a root filesystem directory) runs the prologue."),
    "identity": ("toolkit.cli_identity:identity_command",
        "Print DISPATCH_EPOCH and DISPATCH_ATTEMPT for an execution, or take an epoch apart."),
    "checkpoint": ("toolkit.cli_checkpoint:checkpoint_cmd",
        "Publish checkpoints fenced by DISPATCH_EPOCH, and find the latest."),
    "start": ("toolkit.cli_cluster:start_cmd",
        "Check the runtime on the cluster, then create the TrainJob of REQUEST (a StartRequest file, YAML or JSON) suspended with A = 0."),
    "open": ("toolkit.cli_cluster:open_cmd",
        "Plain mode: raise A and unsuspend TRAINJOB in one preconditioned update."),
    "hold": ("toolkit.cli_cluster:hold_cmd",
        "Hold TRAINJOB: its pods stop, and A is raised before it runs again."),
    "release": ("toolkit.cli_cluster:release_cmd",
        "Resume a held TRAINJOB; refused while pods of the held execution still run (they would be left below the raised floor)."),
    "status": ("toolkit.cli_cluster:status_cmd",
        "State of TRAINJOB, and A, J, R, epoch and attempt of one execution: the current one while it runs, the next one while it is suspended (each row says which)."),
    "executions": ("toolkit.cli_cluster:executions_cmd",
        "Every execution of TRAINJOB the controller recorded (A, J, R, epoch, attempt, first pod, how it ended, verdict), the high-water mark of R, the adoptions and the foreign causes."),
    "list": ("toolkit.cli_cluster:list_cmd",
        "The dispatch TrainJobs of a namespace (or of all, -A): state, mode, the A last written, executions recorded, the high-water mark of R and the foreign flag."),
    "adopt": ("toolkit.cli_cluster:adopt_cmd",
        "Clear the foreign flag of TRAINJOB after a person has judged it: the causes and REASON go into its history, the flag's annotations and label are removed, the current JobSet UID is recorded, and the next execution's R is set above the high-water mark (a running TrainJob is held in plain mode, re-queued through the check in Kueue mode)."),
    "mirror": ("toolkit.cli_mirror:mirror_cmd",
        "Copy a release's images into REGISTRY, digests kept, and write its manifests for REGISTRY."),
    "completion": ("toolkit.cli_completion:completion_cmd",
        "Print the completion script for SHELL."),
}
COMMANDS: dict[str, str] = {name: target for name, (target, _) in _TABLE.items()}

# Commands other packages contribute: an entry point in this group, NAME =
# "module:attribute" of a click.Command, declared in their pyproject.toml and
# loaded by name when invoked, so the toolkit names none of their modules.
# The controller (which sits above the toolkit) and the local cluster
# (devcluster/, outside the product) contribute theirs this way.
ENTRY_POINTS = "dispatch_k8s.toolkit_commands"
# name -> the first sentence of a contributed command's help, so listing it imports nothing.
CONTRIBUTED: dict[str, str] = {
    "controller": "Run the admission-check controller and reset detector (JSON logs on stderr).",
    "cluster": "The local cluster: etcd, kube-apiserver and the real Trainer, JobSet and Kueue controllers.",
}
SUMMARIES: dict[str, str] = {**{name: summary for name, (_, summary) in _TABLE.items()}, **CONTRIBUTED}

# kubectl runs an executable named kubectl-<name> on PATH for `kubectl <name> ...`, with every
# argument after <name> (--kubeconfig, --context, -n and -A included) and its own environment.
PROG = "toolkit"
COMPLETE_VAR = "_TOOLKIT_COMPLETE"
PLUGIN_PROG = "kubectl dispatch"
PLUGIN_COMPLETE_VAR = "_KUBECTL_DISPATCH_COMPLETE"

WRAP_FORMATS = ("json", "yaml", "shell")

if TYPE_CHECKING:
    root: click.Group


def __getattr__(name: str) -> Any:
    # `cli.root`, the click group, is imported on first use so that importing
    # this module (as the console scripts do) does not import click.
    if name == "root":
        return importlib.import_module("toolkit.cli_root").root
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The `toolkit` entry point."""
    _run(sys.argv[1:], prog_name=PROG, complete_var=COMPLETE_VAR)


def kubectl_plugin() -> None:
    """The `kubectl-dispatch` entry point: the same commands as `toolkit`."""
    _run(sys.argv[1:], prog_name=PLUGIN_PROG, complete_var=PLUGIN_COMPLETE_VAR)


def _run(args: list[str], *, prog_name: str, complete_var: str) -> None:
    text = None if complete_var in os.environ else fast_wrap(args)
    if text is None:
        from toolkit import cli_root

        cli_root.root.main(args, prog_name=prog_name, complete_var=complete_var)
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        reader_gone()


def reader_gone() -> None:
    """The reader of stdout went away (`toolkit render ... | head`): not an
    error of ours, exit 1 without a traceback."""
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - flushing at exit must not raise again
    sys.exit(1)


class WrapInputError(ValueError):
    """A `toolkit wrap` command line whose output would be refused or meaningless."""


def wrap_text(*, output: str, workdir: str | None, cmd: Sequence[str]) -> str:
    """What `toolkit wrap` prints: CMD wrapped in the prologue, as `output`
    (json, yaml or shell), ending in a newline."""
    from toolkit import names
    from toolkit import wrap as wrap_mod

    if not cmd or not cmd[0]:
        raise WrapInputError("CMD must not be empty: the prologue refuses an empty command")
    if workdir is not None and not workdir:
        raise WrapInputError("--workdir must not be empty")
    if output == "json":
        if workdir is not None:
            raise WrapInputError(
                "--workdir needs -o yaml or shell: an exec-form array cannot carry the environment; "
                f"in a Containerfile add: ENV DISPATCH_K8S_WORKDIR={workdir}"
            )
        import json

        return json.dumps(wrap_mod.argv(cmd)) + "\n"
    if output == "shell":
        assignments = [(names.ENV_WORKDIR, workdir)] if workdir else []
        return wrap_mod.shell_line(wrap_mod.argv(cmd), assignments=assignments) + "\n"
    from toolkit import yamlio

    fragment: dict[str, Any] = {"command": wrap_mod.command(), "args": list(cmd)}
    if workdir:
        fragment["env"] = [{"name": names.ENV_WORKDIR, "value": workdir}]
    return yamlio.dump(fragment)


def fast_wrap(args: Sequence[str]) -> str | None:
    """The text `toolkit wrap` prints for `args` (the words after the
    program's name) when it can be told without click; None for anything the
    click group must answer.

    As click parses the command: an option may come before or after CMD's
    words, the last of a repeated option wins, `--` ends the options. Only
    `-o VALUE`, `--output VALUE`, `--output=VALUE`, `--workdir VALUE` and
    `--workdir=VALUE` are taken here; any other word starting with `-` before
    `--` (`-h`, `--format`, `-oyaml`, a misspelling) goes to click, and so do
    a value starting with `-`, a format click would refuse, and text click.echo
    would not print byte for byte (non-ASCII, or an escape sequence it strips
    on a pipe)."""
    if not args or args[0] != "wrap":
        return None
    output, workdir = "json", None
    cmd: list[str] = []
    words = iter(args[1:])
    for word in words:
        if word == "--":
            cmd.extend(words)
            break
        name, eq, value = word.partition("=")
        if name in ("-o", "--output", "--workdir") and not (eq and name == "-o"):
            if not eq:
                value = next(words, "-")
            if value.startswith("-"):
                return None
            if name == "--workdir":
                workdir = value
            else:
                output = value
        elif word.startswith("-"):
            return None
        else:
            cmd.append(word)
    if output not in WRAP_FORMATS:
        return None
    try:
        text = wrap_text(output=output, workdir=workdir, cmd=cmd)
    except ValueError:
        return None
    if not text.isascii() or "\x1b" in text:
        return None
    return text
