"""`toolkit completion bash|zsh|fish`: the shell's completion script.

The script is click's own for that shell, which calls the program back
with the words typed so far; the program answers from its own options and
arguments, TrainJob names from the cluster (`toolkit.cli_target`). The
script names the program it was printed by: `toolkit`, or the kubectl
plugin `kubectl-dispatch`.

kubectl completes a plugin's words itself (`kubectl dispatch st<TAB>` in a
shell where kubectl's own completion is loaded) by running the executable
`kubectl_complete-dispatch` with the words after the plugin's name, the last
one the word being typed, and reading one candidate a line, then a last
line `:<directive>` (Cobra's; 4 is "no file names"). `kubectl_complete`
is that executable: it asks the same click completion.
"""

from __future__ import annotations

import sys

import click
import click.shell_completion

SHELLS = ("bash", "zsh", "fish")
# Cobra's ShellCompDirective values kubectl reads from the last line.
NO_FILE_COMPLETION = 4
DEFAULT = 0


@click.command("completion", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion_cmd(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL.

    \b
    Examples:
      source <(toolkit completion bash)                         # bash, this shell
      toolkit completion zsh > "${fpath[1]}/_toolkit"           # zsh, every new shell
      toolkit completion fish > ~/.config/fish/completions/toolkit.fish
    """
    from toolkit import cli

    root = ctx.find_root()
    plugin = root.info_name == cli.PLUGIN_PROG
    prog, var = ("kubectl-dispatch", cli.PLUGIN_COMPLETE_VAR) if plugin else (cli.PROG, cli.COMPLETE_VAR)
    comp_cls = click.shell_completion.get_completion_class(shell)
    assert comp_cls is not None  # every name in SHELLS is one of click's
    click.echo(comp_cls(root.command, {}, prog, var).source())


def kubectl_complete() -> None:
    """The `kubectl_complete-dispatch` entry point (see the module docstring)."""
    from toolkit import cli, cli_root

    words = sys.argv[1:] or [""]
    comp = click.shell_completion.ShellComplete(cli_root.root, {}, cli.PLUGIN_PROG, cli.PLUGIN_COMPLETE_VAR)
    items = comp.get_completions(words[:-1], words[-1])
    files = any(item.type in ("file", "dir") for item in items)
    for item in items:
        if item.type == "plain":
            click.echo(f"{item.value}\t{item.help}" if item.help else item.value)
    click.echo(f":{DEFAULT if files else NO_FILE_COMPLETION}")
