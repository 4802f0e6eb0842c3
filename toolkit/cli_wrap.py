"""`toolkit wrap`, as click answers it: the command's help, its options and
every refusal.

A `toolkit wrap` that succeeds is usually answered before click is imported
(`toolkit.cli.fast_wrap`); this command answers the rest (help, any error,
another spelling) and prints the same text, `cli.wrap_text`, so the two never
differ (tests/toolkit/test_cli_start.py holds them to that). Keep its imports
light: it is on the path of every `toolkit wrap` the fast path leaves to
click.
"""

from __future__ import annotations

import click

from toolkit import cli, cli_errors, cli_output


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workdir", metavar="DIR", help="Directory the prologue enters before the command (DISPATCH_K8S_WORKDIR).")
@cli_output.format_option(("json", "yaml", "shell"), default="json", hint=None)
@cli_errors.renamed("--format", now="the format is -o/--output (json, yaml or shell)")
@click.argument("cmd", nargs=-1, required=True, metavar="-- CMD [ARG...]")
@cli_errors.user_errors
def wrap(workdir: str | None, output: str, cmd: tuple[str, ...]) -> None:
    """Print CMD wrapped in the dispatch prologue (-o json: one exec-form
    array for a Containerfile ENTRYPOINT; yaml: a container's command, args
    and env; shell: one command line).

    The result runs `/bin/sh -c <prologue> dispatch-prologue CMD...`: the
    prologue sets DISPATCH_EPOCH and DISPATCH_ATTEMPT, then execs CMD.

    \b
    Examples:
      toolkit wrap -- python train.py --epochs 3
      toolkit wrap -o yaml --workdir /app -- python train.py
      toolkit wrap -o shell -- ./run.sh
    """
    click.echo(cli.wrap_text(output=output, workdir=workdir, cmd=cmd), nl=False)
