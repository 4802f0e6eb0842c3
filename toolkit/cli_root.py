"""The `toolkit` click group: the commands listed without importing them,
each imported when it is invoked, and every error answered in one line.

`toolkit.cli` (the entry points, standard library only) imports this module
for every run that is not `toolkit wrap`'s fast path. The group knows each
subcommand only as "module:attribute" (`cli.COMMANDS`: `toolkit.cli_wrap`,
`cli_render`, `cli_checks`, `cli_identity`, `cli_checkpoint`, `cli_cluster`,
`cli_completion`), or as an entry point another package contributes
(`cli.ENTRY_POINTS`), and imports it when it is invoked; `--help` and shell
completion list every command from its first sentence in `cli.SUMMARIES`,
so listing them imports none. Keep this module's imports to click and
`toolkit.cli`: `toolkit --help` pays for each one.

Exit status: 0 ok, 1 a check failed (click.ClickException), 2 usage or bad
input (click.UsageError, `cli_errors.BadInput`). Every error is ONE line on
stderr, `toolkit <command>: <message>`, never a traceback for a user's
mistake: `LazyGroup.main` catches click's exceptions and prints them that
way instead of click's multi-line usage block (the refusals themselves are
`toolkit.cli_errors`). Manifests go to stdout (or --output-file FILE,
written atomically: `toolkit.cli_output`), diagnostics to stderr.

Options are spelled as kubectl spells them, and one letter means one thing
in every command: `-o` is the output format (`toolkit.cli_output`), `-n` the
namespace, `-A` every namespace, `-l` a label selector, `-h` help. A
spelling that is gone (`-o FILE`, `identity -n`, `wrap --format`) is refused
in one line that names the new one (`cli_errors.renamed`), exit 2.
Completion: `toolkit completion bash|zsh|fish` (`toolkit.cli_completion`).
The same commands are the kubectl plugin `kubectl-dispatch`
(`cli.kubectl_plugin`), and kubectl completes them through
`kubectl_complete-dispatch`.
"""

from __future__ import annotations

import errno
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Any

import click
import click.shell_completion

from toolkit import cli


class LazyGroup(click.Group):
    """A group whose commands are imported on first use from "module:attr"."""

    def __init__(self, *args: Any, lazy: dict[str, str], summaries: dict[str, str], entry_points: str,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        self.summaries = summaries
        self.entry_points = entry_points

    def contributed(self) -> dict[str, importlib.metadata.EntryPoint]:
        """The commands installed packages contribute (the entry point group
        `entry_points`), by name; read from their metadata, nothing imported.
        A name of our own is never taken by one."""
        found = importlib.metadata.entry_points(group=self.entry_points)
        return {ep.name: ep for ep in found if ep.name not in self.lazy}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy) | set(self.contributed()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            target = self.lazy[cmd_name]
            module_name, _, attr = target.partition(":")
            command = getattr(importlib.import_module(module_name), attr)
        else:
            entry_point = self.contributed().get(cmd_name)
            if entry_point is None:
                return super().get_command(ctx, cmd_name)
            target, command = entry_point.value, entry_point.load()
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command

    def listed(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command as `--help` and completion list it: for a lazy one, a
        stand-in carrying its first sentence, which click shortens exactly as
        it shortens the command's own help, so listing imports nothing."""
        if cmd_name in self.summaries:
            return click.Command(cmd_name, help=self.summaries[cmd_name])
        return self.get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click.Group.format_commands, with `listed` in place of `get_command`.
        rows = [(name, self.listed(ctx, name)) for name in self.list_commands(ctx)]
        shown = [(name, command) for name, command in rows if command is not None and not command.hidden]
        if shown:
            limit = formatter.width - 6 - max(len(name) for name, _ in shown)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in shown])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[click.shell_completion.CompletionItem]:
        # click.Group.shell_complete, with `listed` in place of `get_command`.
        items = []
        for name in self.list_commands(ctx):
            command = self.listed(ctx, name)
            if name.startswith(incomplete) and command is not None and not command.hidden:
                items.append(click.shell_completion.CompletionItem(name, help=command.get_short_help_str()))
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = ctx.command_path if ctx is not None else (prog_name or "toolkit")
            message = " ".join(exc.format_message().split())
            if isinstance(exc, click.UsageError) and ctx is not None:
                message += f" (see '{ctx.command_path} --help')"
            _stderr(f"{where}: {message}")
            sys.exit(exc.exit_code)
        except click.Abort:
            _stderr(f"{prog_name or 'toolkit'}: aborted")
            sys.exit(1)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            cli.reader_gone()
        sys.exit(rv if isinstance(rv, int) else 0)


def _stderr(line: str) -> None:
    click.echo(line, err=True)


@click.group(cls=LazyGroup, lazy=cli.COMMANDS, summaries=cli.SUMMARIES, entry_points=cli.ENTRY_POINTS,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dispatch-k8s", prog_name="toolkit")
def root() -> None:
    """Execution identity for Kubeflow TrainJobs: wrap commands, render
    TrainJobs and runtimes, check runtimes and images.

    \b
    Example:
      toolkit wrap -- python train.py --epochs 3
      toolkit render trainjob examples/start-request.yaml
    """
