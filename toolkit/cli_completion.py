"""`toolkit completion bash|zsh|fish`: the shell's completion script.

The script is click's own for that shell, which calls the program back
with the words typed so far; the program answers from its own options and
arguments, TrainJob names from the cluster (`toolkit.cli_target`). The
script names the program it was printed by: `toolkit`, or the kubectl
plugin `kubectl-dispatch`, whose completion kubectl itself does not offer
(kubectl completes a plugin through a `kubectl_complete-<name>` executable,
which we do not install).
"""

from __future__ import annotations

import click
import click.shell_completion

SHELLS = ("bash", "zsh", "fish")


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
    prog, var = ("kubectl-dispatch", cli.PLUGIN_COMPLETE_VAR) if plugin else ("toolkit", "_TOOLKIT_COMPLETE")
    comp_cls = click.shell_completion.get_completion_class(shell)
    assert comp_cls is not None  # every name in SHELLS is one of click's
    click.echo(comp_cls(root.command, {}, prog, var).source())
