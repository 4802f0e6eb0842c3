"""`toolkit identity`: an execution's DISPATCH_EPOCH and DISPATCH_ATTEMPT from
its counts, or an epoch taken apart.

The formula and every bound are `toolkit.identity`'s (docs/prologue.md); this
command only parses the options and prints. Every count is required unless
`--parse` is given, and `--parse` takes no other option: a command line that
mixes them is a usage error (exit 2), and a value out of its bound is bad
input naming the option (exit 2). `-n` is the namespace in every toolkit
command, so the submission number is `--submission` (`renamed`).
"""

from __future__ import annotations

import click

from toolkit import cli_errors


@click.command("identity", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--job-id", metavar="ID", help="The job id (JobID).")
@click.option("-g", "--generation", metavar="G", help="The job's generation G.")
@click.option("--submission", metavar="N", help="The submission number N.")
@cli_errors.renamed("-n", now="-n is the namespace in every toolkit command; the submission number is --submission")
@click.option("--attempt", metavar="K", help="The attempt.")
@click.option("-a", "--admission", metavar="A", help="The admission count A (>= 1).")
@click.option("-j", "--restart", metavar="J", help="The JobSet restart count J.")
@click.option("--parse", "parse_epoch", metavar="EPOCH", help="Take an epoch apart into G, N and R instead.")
@cli_errors.user_errors
def identity_command(
    job_id: str | None,
    generation: str | None,
    submission: str | None,
    attempt: str | None,
    admission: str | None,
    restart: str | None,
    parse_epoch: str | None,
) -> None:
    """Print DISPATCH_EPOCH and DISPATCH_ATTEMPT for an execution, or take an epoch apart.

    \b
    Examples:
      toolkit identity --job-id train-42 -g 1 --submission 2 --attempt 0 -a 3 -j 0
      toolkit identity --parse 1000002000003
    """
    from toolkit import identity

    given = {
        "--job-id": job_id,
        "--generation": generation,
        "--submission": submission,
        "--attempt": attempt,
        "--admission": admission,
        "--restart": restart,
    }
    if parse_epoch is not None:
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise click.UsageError(f"--parse takes no other option, found {', '.join(extra)}")
        parsed = identity.parse(parse_epoch)
        click.echo(f"G={parsed.generation}\nN={parsed.submission}\nR={parsed.r}")
        return
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)} (or give --parse EPOCH)")
    assert job_id is not None and generation is not None and submission is not None
    assert attempt is not None and admission is not None and restart is not None
    g = identity.parse_decimal("-g/--generation", generation)
    n = identity.parse_decimal("--submission", submission)
    k = identity.parse_decimal("--attempt", attempt)
    a = identity.parse_decimal("-a/--admission", admission)
    j = identity.parse_decimal("-j/--restart", restart)
    epoch = identity.execution_epoch(generation=g, submission=n, admission=a, restart=j)
    token = identity.attempt_token(job_id=job_id, submission=n, attempt=k, admission=a, restart=j)
    click.echo(f"DISPATCH_EPOCH={epoch}\nDISPATCH_ATTEMPT={token}")
