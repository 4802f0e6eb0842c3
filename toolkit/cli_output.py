"""`-o/--output`: the output format, the same option in every command that
prints something a machine may read, as in kubectl.

- `format_option(choices, default=..., hint=...)`: the option. A value that
  is not a format is bad input (exit 2) answered in one line; `hint(value)`
  may name what the user meant (a file: `--output-file`; the old `text`:
  the table, which is the default).
- `emit(fmt, data, table=...)`: `json` (indented, keys sorted), `yaml`
  (`toolkit.yamlio`, block style), or the command's own `table` text.

Writing to a file is `--output-file` (`output_file_option`, `write_output`),
never `-o`: the file is written atomically (a temporary file in the same
directory, fsynced, then renamed over it), so a reader never sees half.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import click

from toolkit import cli_errors

TABLE = "table"


class OutputFormat(click.ParamType):
    """One of `choices`; anything else one line, with the hint when there is one."""

    name = "format"

    def __init__(self, choices: Sequence[str], hint: Callable[[str], str | None] | None = None) -> None:
        self.choices = tuple(choices)
        self.hint = hint

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "|".join(self.choices)

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[click.shell_completion.CompletionItem]:
        return [click.shell_completion.CompletionItem(c) for c in self.choices if c.startswith(incomplete)]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value in self.choices:
            return str(value)
        extra = self.hint(str(value)) if self.hint else None
        self.fail(f"{value!r} is not an output format ({', '.join(self.choices)})" + (f"; {extra}" if extra else ""),
                  param, ctx)


def _old_text(value: str) -> str | None:
    return "the text table is -o table, the default" if value == "text" else None


def format_option(choices: Sequence[str] = (TABLE, "json", "yaml"), *, default: str = TABLE,
                  hint: Callable[[str], str | None] | None = _old_text) -> Callable[[Any], Any]:
    return click.option("-o", "--output", "output", type=OutputFormat(choices, hint), default=default,
                        show_default=True, help="Output format: " + ", ".join(choices) + ".")


def dumps(fmt: str, data: Any) -> str:
    """`data` as json or yaml text, ending in a newline."""
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    if fmt == "yaml":
        from toolkit import yamlio

        return yamlio.dump(data)
    raise ValueError(f"not a data format: {fmt}")


def emit(fmt: str, data: Any, *, table: Callable[[], str]) -> None:
    """Print `data` in `fmt`; the table is built only when asked for."""
    if fmt == TABLE:
        text = table()
        click.echo(text if text.endswith("\n") or not text else text + "\n", nl=False)
        return
    click.echo(dumps(fmt, data), nl=False)


def columns(rows: Sequence[Sequence[str]]) -> str:
    """Rows as kubectl prints them: each column as wide as its widest cell,
    three spaces between, no trailing space."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows) + "\n"


output_file_option = click.option(
    "--output-file", metavar="FILE", default=None, help="Write to FILE (atomically) instead of stdout."
)


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
        cli_errors.bad_input(f"--output-file {output}: cannot write in {directory}: {exc.strerror}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except OSError as exc:
        os.unlink(tmp)
        cli_errors.bad_input(f"--output-file {output}: cannot write: {exc.strerror}")
    except BaseException:
        os.unlink(tmp)
        raise
