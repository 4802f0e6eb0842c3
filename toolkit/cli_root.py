"""The `toolkit` click group: one-line errors, shared helpers, and the
commands over the pure core (wrap, render, check-runtime, check-image,
identity).

`toolkit.cli` (the entry points, standard library only) imports this module
for every run that is not `toolkit wrap`'s fast path. The group knows each
subcommand only as "module:attribute" (`cli.COMMANDS`), or as an entry
point another package contributes (`cli.ENTRY_POINTS`), and imports it when
it is invoked; `--help` and shell completion list every command from its
first sentence in `cli.SUMMARIES`, so listing them imports none.

Exit status: 0 ok, 1 a check failed (click.ClickException), 2 usage or bad
input (click.UsageError, BadInput). Every error is ONE line on stderr,
`toolkit <command>: <message>`, never a traceback for a user's mistake:
`LazyGroup.main` catches click's exceptions and prints them that way instead
of click's multi-line usage block. Manifests go to stdout (or
--output-file FILE, written atomically), diagnostics to stderr.

Options are spelled as kubectl spells them, and one letter means one thing
in every command: `-o` is the output format (`toolkit.cli_output`), `-n` the
namespace, `-A` every namespace, `-l` a label selector, `-h` help. A
spelling that is gone (`-o FILE`, `identity -n`, `wrap --format`) is refused
in one line that names the new one (`renamed`), exit 2. Completion:
`toolkit completion bash|zsh|fish` (`toolkit.cli_completion`). The same
commands are the kubectl plugin `kubectl-dispatch` (`cli.kubectl_plugin`),
and kubectl completes them through `kubectl_complete-dispatch`.
"""

from __future__ import annotations

import errno
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click
import click.shell_completion

from toolkit import cli, cli_output


class BadInput(click.ClickException):
    """Bad user input (a file, a field, a value): exit 2."""

    exit_code = 2


class CheckFailed(click.ClickException):
    """A check found the input wanting: exit 1."""

    exit_code = 1


def with_context(exc: click.ClickException) -> click.ClickException:
    # click's UsageError carries the context; ours get it here, so the one
    # line names the command (`toolkit render trainjob: ...`).
    exc.ctx = click.get_current_context(silent=True)  # type: ignore[attr-defined]
    return exc


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


# -- shared helpers -----------------------------------------------------


def fail(message: str) -> NoReturn:
    """A check failed: exit 1 with one line."""
    raise with_context(CheckFailed(message))


def bad_input(message: str) -> NoReturn:
    """Bad input: exit 2 with one line."""
    raise with_context(BadInput(message))


def write_output(text: str, output: str | None) -> None:
    """To stdout, or atomically to FILE: a temporary file in the same
    directory, fsynced, then renamed over FILE, so a reader never sees half."""
    if output is None or output == "-":
        click.echo(text, nl=False)
        return
    import tempfile  # not at the top: `toolkit wrap` never writes a file

    directory = os.path.dirname(os.path.abspath(output))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(output)}.", suffix=".tmp")
    except OSError as exc:
        bad_input(f"--output-file {output}: cannot write in {directory}: {exc.strerror}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except OSError as exc:
        os.unlink(tmp)
        bad_input(f"--output-file {output}: cannot write: {exc.strerror}")
    except BaseException:
        os.unlink(tmp)
        raise


def _user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the pure modules' input errors (ValueError subclasses) into BadInput."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except ValueError as exc:
            # Only our own input errors (identity.BoundError, request.RequestError,
            # yamlio.LoadError, render.RenderError, ...); a ValueError from
            # anywhere else is a bug and keeps its traceback.
            if not type(exc).__module__.startswith("toolkit."):
                raise
            bad_input(str(exc))

    return wrapper


output_file_option = click.option(
    "--output-file", metavar="FILE", default=None, help="Write to FILE (atomically) instead of stdout."
)


def renamed(old: str, *, now: str, takes_value: bool = True) -> Callable[[Any], Any]:
    """A hidden option for a spelling that is gone: given, it is bad input
    answered with one line naming what to write now (exit 2). So no option
    letter ever means two things, and an old command line fails loudly
    instead of meaning something else."""

    def refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None and value is not False:
            raise click.UsageError(f"{old} is gone: {now}", ctx=ctx)

    return click.option(old, f"renamed_{old.lstrip('-').replace('-', '_')}", hidden=True, expose_value=False,
                        is_flag=not takes_value, default=None, callback=refuse, is_eager=True)


# -- wrap ---------------------------------------------------------------


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workdir", metavar="DIR", help="Directory the prologue enters before the command (DISPATCH_K8S_WORKDIR).")
@cli_output.format_option(("json", "yaml", "shell"), default="json", hint=None)
@renamed("--format", now="the format is -o/--output (json, yaml or shell)")
@click.argument("cmd", nargs=-1, required=True, metavar="-- CMD [ARG...]")
@_user_errors
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


# -- render -------------------------------------------------------------


@click.group(cls=click.Group, context_settings={"help_option_names": ["-h", "--help"]})
def render() -> None:
    """Render a TrainJob from a StartRequest, or prepare a runtime.

    \b
    Examples:
      toolkit render trainjob examples/start-request.yaml --output-file trainjob.yaml
      toolkit render runtime torch_distributed.yaml --sidecar-image reg/sidecar:1.0
    """


def _file_hint(value: str) -> str:
    return f"to write a file, --output-file {value}"


manifest_format_option = cli_output.format_option(("yaml", "json"), default="yaml", hint=_file_hint)


def write_manifests(docs: list[Any], *, output: str, output_file: str | None) -> None:
    """One document as itself; several as a YAML stream, or in json a v1 List (as kubectl prints them)."""
    if output == "json":
        data = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        write_output(cli_output.dumps("json", data), output_file)
        return
    from toolkit import yamlio

    write_output(yamlio.dump_all(docs), output_file)


@render.command("trainjob")
@click.argument("request_file", metavar="REQUEST")
@manifest_format_option
@output_file_option
@_user_errors
def render_trainjob(request_file: str, output: str, output_file: str | None) -> None:
    """Render the suspended TrainJob for a StartRequest (YAML, or JSON by .json; - is stdin).

    \b
    Example:
      toolkit render trainjob examples/start-request.yaml --output-file trainjob.yaml
    """
    from toolkit import render as render_mod
    from toolkit import request

    req = request.load(request_file)
    write_manifests([render_mod.trainjob(req)], output=output, output_file=output_file)


@render.command("runtime")
@click.argument("runtime_file", metavar="RUNTIME")
@manifest_format_option
@output_file_option
@click.option("--sidecar-image", metavar="IMAGE", default=None,
              help="The sidecar verifier's image (default: the recorded release's, REGISTRY/dispatch/sidecar:TAG@sha256:...).")
@click.option(
    "--service-account", metavar="NAME", default=None, help="The ServiceAccount the sidecar runs as."
)
@_user_errors
def render_runtime(runtime_file: str, output: str, output_file: str | None, sidecar_image: str | None, service_account: str | None) -> None:
    """Add restartPolicy Never, backoffLimit 0 and the sidecar to a (Cluster)TrainingRuntime.

    Every document of RUNTIME is rendered; the output is idempotent (render
    it again and nothing changes). Failure policies are left as they are:
    check them with `toolkit check-runtime`.

    \b
    Example:
      toolkit render runtime torch_distributed.yaml --output-file torch_distributed.dispatch.yaml
    """
    from toolkit import names, yamlio
    from toolkit import render as render_mod

    docs = yamlio.load_documents(runtime_file)
    out = []
    for i, doc in enumerate(docs):
        try:
            out.append(
                render_mod.runtime(
                    doc,
                    sidecar_image=sidecar_image,
                    service_account=service_account or names.SIDECAR_SERVICE_ACCOUNT,
                )
            )
        except render_mod.RenderError as exc:
            where = f"{runtime_file}" + (f" (document {i + 1})" if len(docs) > 1 else "")
            bad_input(f"{where}: {exc}")
    write_manifests(out, output=output, output_file=output_file)


# -- check-runtime ------------------------------------------------------


@click.command("check-runtime", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--allow-rank-restart", is_flag=True, help="Accept runtimes that replace a failed rank (allowRankRestart).")
@click.pass_context
@_user_errors
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
                _stderr(f"{path}: {name}: {refusal}")
            if refusals:
                refused = True
            else:
                click.echo(f"{path}: {name}: ok")
    if refused:
        ctx.exit(1)


# -- check-image --------------------------------------------------------


@click.command("check-image", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="IMAGE|DIR")
@click.option("--timeout", type=click.FloatRange(min=1), default=60, show_default=True, help="Seconds to wait for the run.")
@_user_errors
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
        fail(str(exc))
    click.echo(f"{target}: ok: {result}")


# -- identity -----------------------------------------------------------


@click.command("identity", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--job-id", metavar="ID", help="The job id (JobID).")
@click.option("-g", "--generation", metavar="G", help="The job's generation G.")
@click.option("--submission", metavar="N", help="The submission number N.")
@renamed("-n", now="-n is the namespace in every toolkit command; the submission number is --submission")
@click.option("--attempt", metavar="K", help="The attempt.")
@click.option("-a", "--admission", metavar="A", help="The admission count A (>= 1).")
@click.option("-j", "--restart", metavar="J", help="The JobSet restart count J.")
@click.option("--parse", "parse_epoch", metavar="EPOCH", help="Take an epoch apart into G, N and R instead.")
@_user_errors
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
