"""`toolkit start|open|hold|release|status|controller`: the adapter
operations and the controller against a cluster.

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


@click.command("status")
@click.argument("trainjob")
@_namespace_option
@_cluster_options
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text for people, json for machines.")
@_refusals
def status_cmd(trainjob: str, namespace: str, kubeconfig: str | None, context: str | None, output: str) -> None:
    """State, A, floor, J, R and the epoch of the next or current execution
    of TRAINJOB, its recorded JobSet UID and whether it is flagged foreign.

    \b
    Example:
      toolkit status llama-ft-7 -n training -o json
    """
    st = adapter.status(_client(kubeconfig, context), namespace=namespace, name=trainjob)
    if output == "json":
        click.echo(json.dumps(st.as_dict(), sort_keys=True))
        return
    rows = [
        ("trainjob", f"{st.namespace}/{st.name}"),
        ("state", st.state),
        ("admission (A)", str(st.admission)),
        ("floor", "-" if st.floor is None else str(st.floor)),
        ("restarts (J)", str(st.restarts)),
        (f"R ({st.next_or_current} execution)", str(st.r)),
        ("epoch", st.epoch or "-"),
        ("attempt", st.attempt or "-"),
        ("jobset uid (recorded)", st.jobset_uid or "-"),
        ("jobset uid (seen)", st.jobset_uid_seen or "-"),
        ("foreign", "yes" if st.foreign else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
    if st.foreign_cause:
        for line in st.foreign_cause.split("\n"):
            click.echo(f"{'cause':<{width}}  {line}")


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
