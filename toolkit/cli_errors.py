"""The CLI's refusals: every error a command raises is one line and an exit status.

Exit status: 0 ok, 1 a check failed (`CheckFailed`, `fail`), 2 usage or bad
input (click's UsageError, `BadInput`, `bad_input`). The line is printed by
the group (`toolkit.cli_root.LazyGroup.main`) as `toolkit <command>: <message>`,
never a traceback for a user's mistake; `with_context` gives an exception the
command it was raised in, so the line names it.

Two helpers every command shares:
- `user_errors` turns the pure modules' input errors (a `ValueError` raised
  by a module of `toolkit`) into `BadInput`; any other `ValueError` is a bug
  and keeps its traceback.
- `renamed` refuses a spelling that is gone in one line naming the new one,
  so no option letter ever means two things and an old command line fails
  loudly instead of meaning something else.

Only the CLI layer exits; these only raise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn

import click


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


def fail(message: str) -> NoReturn:
    """A check failed: exit 1 with one line."""
    raise with_context(CheckFailed(message))


def bad_input(message: str) -> NoReturn:
    """Bad input: exit 2 with one line."""
    raise with_context(BadInput(message))


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the pure modules' input errors (ValueError subclasses) into BadInput."""

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
