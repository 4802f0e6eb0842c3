"""`toolkit start|open|hold|release|status|executions|adopt|controller`:
the adapter operations and the controller against a cluster.

Thin commands: parse, call `toolkit.adapter` (or the controller's `run`),
print. A refusal (`adapter.AdapterError`, a bound, an API refusal) is one
line on stderr and exit 1; bad input is exit 2 (click's usage errors).
Loaded lazily by `toolkit.cli`, so `toolkit wrap` never imports the
kubernetes client.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from toolkit import adapter, cli, kube


def _cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--kubeconfig", envvar="KUBECONFIG", default=None,
        help="Kubeconfig path (default: $KUBECONFIG; without it, the pod's ServiceAccount where "
             "KUBERNETES_SERVICE_HOST is set, else ~/.kube/config).",
    )(fn)
    fn = click.option("--context", default=None, help="Kubeconfig context (default: the current one).")(fn)
    return fn


def _namespace_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-n", "--namespace", envvar="DISPATCH_NAMESPACE", default="default", show_default=True,
        help="Namespace of the TrainJob (env DISPATCH_NAMESPACE).",
    )(fn)


def _refusal(message: str) -> click.ClickException:
    """Exit 1 with one line that names the command (`toolkit open: ...`)."""
    return cli.with_context(click.ClickException(message))


def _refusals(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a refusal into one line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except adapter.AdapterError as exc:
            raise _refusal(str(exc)) from None
        except kube.ApiError as exc:
            raise _refusal(f"the apiserver refused: {exc}") from None

    return wrapper


def _client(kubeconfig: str | None, context: str | None) -> kube.Client:
    try:
        return kube.load(kubeconfig=kubeconfig, context=context)
    except kube.ConfigError as exc:
        raise _refusal(f"--kubeconfig: {exc}") from None


@click.command("start")
@click.argument("request_file", metavar="REQUEST", type=click.Path(dir_okay=False))
@_cluster_options
@_refusals
def start_cmd(request_file: str, kubeconfig: str | None, context: str | None) -> None:
    """Check the runtime on the cluster, then create the TrainJob of REQUEST
    (a StartRequest file, YAML or JSON) suspended with A = 0. A second start
    of the same job and submission finds it and changes nothing.

    \b
    Example:
      toolkit start examples/start-request.yaml --kubeconfig ~/.kube/config
    """
    from toolkit import render, request  # pure; loaded only for start

    try:
        req = request.load(request_file)
    except ValueError as exc:  # RequestError and LoadError: one line naming the field
        raise click.BadParameter(str(exc), param_hint="REQUEST") from None
    started = adapter.start(
        _client(kubeconfig, context), trainjob=render.trainjob(req), allow_rank_restart=req.allow_rank_restart
    )
    verb = "created" if started.created else "exists, unchanged"
    click.echo(f"trainjob {started.namespace}/{started.name} {verb}")


def _raise_command(name: str, op: Callable[..., adapter.Raised], doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("trainjob")
    @_namespace_option
    @_cluster_options
    @_refusals
    def cmd(trainjob: str, namespace: str, kubeconfig: str | None, context: str | None) -> None:
        raised = op(_client(kubeconfig, context), namespace=namespace, name=trainjob)
        click.echo(f"trainjob {namespace}/{trainjob} running with A = {raised.admission}")
        if raised.jobset_reset:
            click.echo(f"warning: flagged foreign: {raised.jobset_reset}", err=True)
        if raised.conflicts:
            click.echo(f"({raised.conflicts} conflicting writes re-read and retried)", err=True)

    return cmd


open_cmd = _raise_command(
    "open", adapter.open_, "Plain mode: raise A and unsuspend TRAINJOB in one preconditioned update."
    "\n\n\b\nExample:\n  toolkit open llama-ft-7 -n training"
)
release_cmd = _raise_command(
    "release", adapter.release, "Plain mode: resume a held TRAINJOB, raising A in the update that unsuspends;"
    " refused while pods of the held execution still run (they would be left below the raised floor)."
    "\n\n\b\nExample:\n  toolkit release llama-ft-7 -n training"
)


@click.command("hold")
@click.argument("trainjob")
@_namespace_option
@_cluster_options
@_refusals
def hold_cmd(trainjob: str, namespace: str, kubeconfig: str | None, context: str | None) -> None:
    """Suspend TRAINJOB (its pods stop; the next open or release raises A).

    \b
    Example:
      toolkit hold llama-ft-7 -n training
    """
    changed = adapter.hold(_client(kubeconfig, context), namespace=namespace, name=trainjob)
    click.echo(f"trainjob {namespace}/{trainjob} {'held' if changed else 'was already suspended'}")


_output_option = click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text",
                              show_default=True, help="text for people, json for machines.")


@click.command("status")
@click.argument("trainjob")
@_namespace_option
@_cluster_options
@_output_option
@_refusals
def status_cmd(trainjob: str, namespace: str, kubeconfig: str | None, context: str | None, output: str) -> None:
    """State of TRAINJOB, and A, J, R, epoch and attempt of one execution: the
    current one while it runs, the next one while it is suspended (each row
    says which). Also the floor, the high-water mark of R, the recorded JobSet
    UID (recorded now if it was not, a different one flagged) and the foreign
    flag with its causes.

    \b
    Example:
      toolkit status llama-ft-7 -n training -o json
    """
    st = adapter.status(_client(kubeconfig, context), namespace=namespace, name=trainjob)
    if output == "json":
        click.echo(json.dumps(st.as_dict(), sort_keys=True))
        return
    which = f"{st.execution} execution"
    rows = [
        ("trainjob", f"{st.namespace}/{st.name}"),
        ("state", st.state),
        (f"A ({which})", str(st.admission)),
        (f"J ({which})", str(st.restarts)),
        (f"R ({which})", str(st.r)),
        (f"epoch ({which})", st.epoch or (f"- ({st.bound})" if st.bound else "-")),
        (f"attempt ({which})", st.attempt or "-"),
        ("last A written", str(st.last_admission)),
        ("floor", "-" if st.floor is None else str(st.floor)),
        ("high-water R", str(st.high_water)),
        ("jobset uid (recorded)", st.jobset_uid or "-"),
        ("jobset uid (seen)", (st.jobset_uid_seen or "-") + (" (MISMATCH)" if st.jobset_uid_mismatch else "")),
        ("foreign", "yes" if st.foreign else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
    if st.foreign_cause:
        for line in st.foreign_cause.split("\n"):
            click.echo(f"{'cause':<{width}}  {line}")
    if st.foreign_dropped:
        click.echo(f"{'cause':<{width}}  ... and {st.foreign_dropped} more not kept (the list is bounded)")


def executions_table(ex: adapter.Executions) -> str:
    """The history as text: one row per execution, oldest first, then the
    high-water mark, the adoptions and the foreign causes."""
    h = ex.history
    header = ("A", "J", "R", "EPOCH", "ATTEMPT", "FIRST SEEN", "FIRST POD", "ENDED", "VERDICT")
    rows = [header] + [
        (str(e.a), str(e.j), str(e.r), e.epoch or "-", e.attempt or "-", e.first_seen, e.first_pod,
         e.ended or "-", e.verdict)
        for e in h.executions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"trainjob {ex.namespace}/{ex.name} ({ex.state})"]
    if h.unreadable:
        lines.append("history: unreadable (not written by dispatch): kept as found and flagged; "
                     "nothing is recorded until a person repairs or removes it")
    if h.dropped:
        lines.append(f"({h.dropped} older execution(s) not kept)")
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.append(f"high-water R: {h.high_water}")
    for d in h.adoptions:
        lines.append(f"adopted {d.time}: {d.reason} (high-water R {d.high_water}, next A at least {d.minimum}; "
                     f"{len(d.causes)} cause(s) cleared)")
        lines += [f"  cleared: {c}" for c in d.causes]
    if ex.foreign_causes or ex.foreign_dropped:
        lines.append("foreign:")
        lines += [f"  {c}" for c in ex.foreign_causes]
        if ex.foreign_dropped:
            lines.append(f"  ... and {ex.foreign_dropped} more not kept (the list is bounded)")
    else:
        lines.append("foreign: no")
    return "\n".join(lines)


@click.command("executions")
@click.argument("trainjob")
@_namespace_option
@_cluster_options
@_output_option
@_refusals
def executions_cmd(trainjob: str, namespace: str, kubeconfig: str | None, context: str | None, output: str) -> None:
    """Every execution of TRAINJOB the controller recorded (A, J, R, epoch,
    attempt, first pod, how it ended, verdict), the high-water mark of R, the
    adoptions and the foreign causes.

    \b
    Example:
      toolkit executions llama-ft-7 -n training
    """
    ex = adapter.executions(_client(kubeconfig, context), namespace=namespace, name=trainjob)
    if output == "json":
        click.echo(json.dumps(ex.as_dict(), sort_keys=True))
        return
    click.echo(executions_table(ex))


@click.command("adopt")
@click.argument("trainjob")
@click.option("--reason", required=True, help="Why the TrainJob may run again (kept in its history and an Event).")
@click.option("--check", "checks", multiple=True, metavar="NAME",
              help="Kueue mode: the AdmissionCheck(s) of ours to set Retry (repeatable). "
                   "Default: every AdmissionCheck whose controllerName is --controller-name.")
@click.option("--controller-name", default=adapter.CHECK_CONTROLLER_NAME, show_default=True,
              help="The AdmissionCheck controllerName our controller serves (its --controller-name).")
@_namespace_option
@_cluster_options
@_refusals
def adopt_cmd(trainjob: str, reason: str, checks: tuple[str, ...], controller_name: str, namespace: str,
              kubeconfig: str | None, context: str | None) -> None:
    """Clear the foreign flag of TRAINJOB after a person has judged it: the
    causes and REASON go into its history, the current JobSet UID is recorded,
    and the next execution's R is set above the high-water mark (a running
    TrainJob is held in plain mode, re-queued through the check in Kueue mode).
    Refused unless the TrainJob is ours and flagged, or past the R bound.

    \b
    Example:
      toolkit adopt llama-ft-7 -n training --reason "JobSet deleted by hand; checkpoints verified"
    """
    if not reason.strip():
        raise click.BadParameter("empty; say what was checked and why the TrainJob may run again",
                                 param_hint="--reason")
    done = adapter.adopt(_client(kubeconfig, context), namespace=namespace, name=trainjob, reason=reason,
                         checks=set(checks) if checks else None, controller_name=controller_name)
    click.echo(f"trainjob {namespace}/{trainjob} adopted: {len(done.causes)} cause(s) cleared and kept in its history")
    epoch = f", epoch {done.next_epoch}" if done.next_epoch else ""
    click.echo(f"next execution: A {done.minimum}, R {done.next_r}{epoch} (above the high-water R {done.high_water})")
    if done.held:
        click.echo(f"held: run `toolkit release {trainjob} -n {namespace}` once its pods have stopped", err=True)
    elif done.requeued:
        click.echo(f"re-queued through the admission check: {', '.join(done.requeued)}", err=True)
    elif done.running:
        click.echo("warning: still running and no admitted Workload with our check was found to re-queue; "
                   "until its next admission, a JobSet restart starts with the same A", err=True)


def _controller_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The controller's options, one for each row of the settings table
    (controller/settings.py). They pass their raw text on, and the
    table's parser reads it exactly as it reads the environment: no click
    type or `envvar=` here, so there is one rule book, not two."""
    from controller import settings

    for spec in reversed(settings.TABLE):
        text = spec.help_text
        if spec.kind == "bool":
            decl = f"{spec.option}/--no-{spec.option[2:]}"
            fn = click.option(decl, spec.field, default=None, help=text)(fn)
        else:
            metavar = "INTEGER" if spec.kind == "int" else spec.kind.upper().replace("-", "_")
            fn = click.option(spec.option, spec.field, default=None, metavar=metavar, help=text)(fn)
    return fn


@click.command("controller")
@_controller_options
def controller_cmd(**options: Any) -> None:
    """Run the admission-check controller and reset detector (JSON logs on stderr).

    Every option has an environment twin (DISPATCH_CONTROLLER_<OPTION>); an
    option beats its variable, which beats the default.

    \b
    Example:
      toolkit controller --kubeconfig ~/.kube/config --context dev --health-port 8081
    """
    from controller import app

    try:
        settings = app.Settings.from_env(**options)
    except app.SettingsError as exc:
        raise cli.with_context(cli.BadInput(str(exc))) from None
    try:
        code = app.run(settings)
    except kube.ConfigError as exc:
        where = "--kubeconfig" if settings.context is None else f"--kubeconfig, --context {settings.context}"
        raise _refusal(f"{where}: {exc}") from None
    sys.exit(code)
