"""`toolkit checkpoint publish|latest`: the checkpoint fence for shell-based
trainers (dispatch_fence.checkpoint, docs/checkpoint.md).

Exit 0 published (or read), 1 refused (a lower epoch: StaleEpoch), 2 bad
input (the epoch, the attempt, the staging directory, the root); one line on
stderr, never a traceback. Loaded lazily by `toolkit.cli`; imports click and
the fence module only.
"""

from __future__ import annotations

import click

from dispatch_fence import checkpoint
from toolkit import cli_errors

_SETTINGS = {"help_option_names": ["-h", "--help"]}


def _run(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except checkpoint.StaleEpoch as exc:
        cli_errors.fail(str(exc))
    except checkpoint.CheckpointError as exc:
        cli_errors.bad_input(str(exc))


@click.group("checkpoint", cls=click.Group, context_settings=_SETTINGS)
def checkpoint_cmd() -> None:
    """Publish checkpoints fenced by DISPATCH_EPOCH, and find the latest.

    \b
    Examples:
      toolkit checkpoint publish /ckpt/.staging-$DISPATCH_ATTEMPT /ckpt --keep 3
      toolkit checkpoint latest /ckpt
    """


@checkpoint_cmd.command("publish", context_settings=_SETTINGS)
@click.argument("staging", metavar="STAGING")
@click.argument("root", metavar="ROOT")
@click.option("--keep", type=click.IntRange(min=1), default=None, metavar="K",
              help="Keep the newest K checkpoints in ROOT, remove the rest (default: remove none).")
@click.option("--epoch", default=None, metavar="EPOCH", help="The epoch (default: $DISPATCH_EPOCH).")
@click.option("--attempt", default=None, metavar="TOKEN", help="The attempt token (default: $DISPATCH_ATTEMPT).")
def publish_cmd(staging: str, root: str, keep: int | None, epoch: str | None, attempt: str | None) -> None:
    """Publish the complete checkpoint in STAGING into ROOT; print its path.

    STAGING must hold the marker file COMPLETE (written last) and be on
    ROOT's filesystem: it is renamed into ROOT as
    ckpt-<epoch>-<serial>-<attempt>, and ROOT/LATEST then names it. An epoch
    lower than one already in ROOT is refused (exit 1) and touches nothing.
    ROOT may be s3://BUCKET/PREFIX or gs://BUCKET/PREFIX: STAGING is then
    uploaded (any filesystem) and LATEST replaced by compare-and-set.

    \b
    Example:
      toolkit checkpoint publish /ckpt/.staging-$DISPATCH_ATTEMPT /ckpt --keep 3
    """
    epoch_value, attempt_value = _run(checkpoint.execution, epoch, attempt, cli=True)
    found = _run(checkpoint.publish, staging, root, epoch=epoch_value, attempt=attempt_value, keep=keep)
    click.echo(found.path)


@checkpoint_cmd.command("latest", context_settings=_SETTINGS)
@click.argument("root", metavar="ROOT")
def latest_cmd(root: str) -> None:
    """Print the path of the checkpoint ROOT/LATEST names; nothing (exit 0) before the first publish.

    \b
    Example:
      ckpt=$(toolkit checkpoint latest /ckpt) && [ -n "$ckpt" ] && resume_from "$ckpt"
    """
    found = _run(checkpoint.latest, root)
    if found is not None:
        click.echo(found.path)
