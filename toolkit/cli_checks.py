"""`toolkit check-runtime` and `toolkit check-image`: the runtime requirements
and the prologue, checked before anything runs on a cluster.

Exit 0 when everything passes, 1 when a check fails (each refusal one line
on stderr naming what was found), 2 for input that cannot be read. The
rules are the pure modules' (`toolkit.runtime_check`, `toolkit.image_check`
over the Docker API or chroot); the commands only read, call and print, and
import them when they run.
"""

from __future__ import annotations

import click

from toolkit import cli_errors


@click.command("check-runtime", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--allow-rank-restart", is_flag=True, help="Accept runtimes that replace a failed rank (allowRankRestart).")
@click.pass_context
@cli_errors.user_errors
def check_runtime(ctx: click.Context, files: tuple[str, ...], allow_rank_restart: bool) -> None:
    """Check (Cluster)TrainingRuntimes against the runtime requirements.

    Exit 0 when every runtime passes (one `ok` line each on stdout), 1 with
    one line per refusal on stderr, naming the field and the value found.

    \b
    Example:
      toolkit check-runtime runtimes/*.yaml
    """
    from toolkit import runtime_check, yamlio

    refused = False
    for path in files:
        for doc in yamlio.load_documents(path):
            name = runtime_check.describe(doc)
            refusals = runtime_check.check(doc, allow_rank_restart=allow_rank_restart)
            for refusal in refusals:
                click.echo(f"{path}: {name}: {refusal}", err=True)
            if refusals:
                refused = True
            else:
                click.echo(f"{path}: {name}: ok")
    if refused:
        ctx.exit(1)


@click.command("check-image", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="IMAGE|DIR")
@click.option("--timeout", type=click.FloatRange(min=1), default=60, show_default=True, help="Seconds to wait for the run.")
@cli_errors.user_errors
def check_image(target: str, timeout: float) -> None:
    """Prove that an image (or a root filesystem directory) runs the prologue.

    Runs the prologue there with sample values, through the Docker API
    (DOCKER_HOST: Docker, or podman's Docker-compatible service) for an
    image, or chroot for a directory, and checks the DISPATCH_EPOCH and
    DISPATCH_ATTEMPT the command saw. Exit 1 when it does not.

    \b
    Examples:
      toolkit check-image localhost/dispatch-base/busybox:1.35-static
      sudo toolkit check-image ./rootfs
    """
    from toolkit import image_check

    try:
        result = image_check.check(target, timeout=timeout)
    except image_check.CheckFailed as exc:
        cli_errors.fail(str(exc))
    click.echo(f"{target}: ok: {result}")
