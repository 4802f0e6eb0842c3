"""`toolkit controller` and `python -m controller`: the controller's command.

The controller owns its command line: the options are built here from the
settings table (`controller.settings`), so the toolkit's CLI never imports
the controller. `toolkit controller` reaches this command through the entry
point group `dispatch_k8s.toolkit_commands` (dev/pyproject.toml), the way any
package contributes a `toolkit` subcommand; `python -m controller` (the
container's entry point) runs it directly.

Thin: parse, build `Settings`, call `app.run`, exit with its code. A refusal
is one line and exit 1 (a kubeconfig that cannot be loaded, a metrics
certificate that cannot be read); bad settings are exit 2. Only this layer
exits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from toolkit import clusterconfig, envtable


class BadInput(click.ClickException):
    """A setting refused (`settings.SettingsError`): exit 2."""

    exit_code = 2


def _one_line(exc: click.ClickException) -> click.ClickException:
    # The context names the command in the one line `toolkit` prints (`toolkit controller: ...`).
    exc.ctx = click.get_current_context(silent=True)  # type: ignore[attr-defined]
    return exc


def _help(spec: envtable.Setting) -> str:
    """An option's help: what it is, its variable, what it takes and its default."""
    parts = [f"env {spec.name}", spec.kind.expected]
    if spec.shown is not None:
        parts.append(f"default {spec.shown.replace('`', '')}")
    elif spec.default not in (None, ""):
        parts.append(f"default {str(spec.default).lower() if spec.kind is envtable.BOOLEAN else spec.default}")
    return f"{spec.help} ({'; '.join(parts)})."


def _controller_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The controller's options, one for each row of the settings table
    (controller/settings.py). They pass their raw text on, and the
    table's parser reads it exactly as it reads the environment: no click
    type or `envvar=` here, so there is one rule book, not two."""
    from controller import settings

    for spec in reversed(settings.TABLE):
        assert spec.option is not None
        if spec.kind is envtable.BOOLEAN:
            decl = f"{spec.option}/--no-{spec.option[2:]}"
            fn = click.option(decl, spec.field, default=None, help=_help(spec))(fn)
        else:
            metavar = "INTEGER" if spec.kind.name == "int" else spec.kind.name.upper().replace("-", "_")
            fn = click.option(spec.option, spec.field, default=None, metavar=metavar, help=_help(spec))(fn)
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
    from controller import app, certs

    try:
        settings = app.Settings.from_env(**options)
    except app.SettingsError as exc:
        raise _one_line(BadInput(str(exc))) from None
    try:
        code = app.run(settings)
    except clusterconfig.ConfigError as exc:
        where = "--kubeconfig" if settings.context is None else f"--kubeconfig, --context {settings.context}"
        raise _one_line(click.ClickException(f"{where}: {exc}")) from None
    except certs.CertificateError as exc:
        raise _one_line(click.ClickException(f"--metrics-cert-dir: {exc}")) from None
    sys.exit(code)
