"""The settings table under every process: one row per setting, one reader,
one wording of a refusal, and the reference docs written from the same rows.

The controller, the dispatcher and the sidecar each declare their settings as
a tuple of `Setting` rows (controller/settings.py, dispatcher/settings.py,
sidecar/settings.py): the variable, the field of the process's typed
`Settings` it fills, its `Kind` (what a value is: in words, and as a parser),
its default and its help. Three things are read off the rows:

- the values (`read`), by one precedence: an option given (the controller's
  command line; None is not given) > the variable, set and not empty (a
  Deployment that templates a value out leaves it empty) > the row's
  default. A row whose name ends in `*` gathers every variable with that
  prefix into its field, as sorted (name, value) pairs.
- the refusal (`SettingsError`): one line, `NAME=VALUE: expected WHAT`, the
  value quoted as given, or a number outside its bounds as it was read; a
  secret's value is never written (`NAME: ...`). A required row that is
  unset: `NAME is required and not set`.
- the reference table (`markdown`) that each process's docs page carries,
  whose value column is the same WHAT; tests/lint/test_settings_docs.py
  holds every page to its table.

What stays with a process is what ties its settings together (a default
derived from another, a bound between two) and the words it says there.

Standard library only, and cheap to import: the sidecar, which starts in
every training pod, imports this. So a row is a plain class with slots (no
dataclasses, which import inspect; no typing module), the values are read by
toolkit.envparse's parsers, and toolkit.formats is imported when a DNS label
is first read, which the sidecar never does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from toolkit import envparse

TYPE_CHECKING = False
if TYPE_CHECKING:  # for type checkers only: the typing module is one more import in every pod
    from typing import Any


class SettingsError(ValueError):
    """A setting a process cannot run with: one line naming it and the bound."""


class Invalid(ValueError):
    """A kind's parser refusing a text. `reason` replaces the kind's words
    ("expected ..."); `shown` is the value as the message writes it (None:
    quoted as given)."""

    def __init__(self, reason: str | None = None, *, shown: str | None = None) -> None:
        super().__init__(reason or "")
        self.reason = reason
        self.shown = shown


class Kind:
    """What a value is: `expected`, in words; `name`, a short tag (the command
    line's metavar); `parse`, text -> value, raising Invalid."""

    __slots__ = ("name", "expected", "parse")

    def __init__(self, name: str, expected: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self.expected = expected
        self.parse = parse


def whole(low: int, high: int) -> Kind:
    """A whole number in ASCII digits from `low` to `high`; blanks around it ignored."""
    def parse(text: str) -> int:
        try:
            return envparse.whole(text.strip(), low=low, high=high)
        except envparse.Malformed:
            raise Invalid() from None
        except envparse.OutOfRange as e:
            raise Invalid(shown=str(e.value)) from None
    return Kind("int", f"a whole number from {low} to {high}", parse)


def seconds(low: float, high: float) -> Kind:
    """A number of seconds from `low` to `high`; blanks around it ignored."""
    def parse(text: str) -> float:
        try:
            return envparse.seconds(text.strip(), low=low, high=high)
        except envparse.Malformed:
            raise Invalid() from None
        except envparse.OutOfRange as e:
            raise Invalid(shown=f"{e.value:g}") from None
    return Kind("seconds", f"a number of seconds from {low:g} to {high:g}", parse)


def text(name: str, expected: str, ok: Callable[[str], bool]) -> Kind:
    """Text taken as given (blanks are part of it) where `ok(text)`."""
    def parse(raw: str) -> str:
        if not ok(raw):
            raise Invalid()
        return raw
    return Kind(name, expected, parse)


def choice(*words: str) -> Kind:
    """One of `words`, any case; blanks around it ignored."""
    def parse(raw: str) -> str:
        word = raw.strip().lower()
        if word not in words:
            raise Invalid()
        return word
    return Kind("choice", f"one of {', '.join(words[:-1])} or {words[-1]}", parse)


def _boolean(raw: str) -> bool:
    try:
        return envparse.boolean(raw.strip().lower())
    except envparse.Malformed:
        raise Invalid() from None


def _dns_label(raw: str) -> bool:
    # Imported here, deliberately: the sidecar imports this module and reads no Kubernetes name.
    from toolkit import formats
    return formats.dns_label(raw)


BOOLEAN = Kind("bool", "true or false", _boolean)
TEXT = text("text", "any text", lambda raw: True)
PATH = text("path", "a path", lambda raw: "\0" not in raw)
DNS_LABEL = text("dns-label", "a DNS-1123 label (lowercase letters, digits and '-', at most 63)", _dns_label)


class Setting:
    """One row: the variable `name` (ending in `*`: every variable with that
    prefix), the `field` it fills, its `kind` and `help`; its `default` (for
    unset and empty alike) or `required`; `shown`, the default in words where
    the process derives it (the docs' default column); `option`, its
    command-line twin; `secret`, a value never written in a message."""

    __slots__ = ("name", "field", "kind", "help", "default", "required", "shown", "option", "secret")

    def __init__(self, name: str, field: str, kind: Kind, help: str, *, default: Any = None,
                 required: bool = False, shown: str | None = None, option: str | None = None,
                 secret: bool = False) -> None:
        self.name = name
        self.field = field
        self.kind = kind
        self.help = help
        self.default = default
        self.required = required
        self.shown = shown
        self.option = option
        self.secret = secret

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, {self.field!r}, {self.kind.name})"


def parse(setting: Setting, raw: str, *, source: str | None = None) -> Any:
    """`raw` as the setting's kind, or SettingsError naming `source` (the
    variable unless given: the option it came from)."""
    where = source or setting.name
    try:
        return setting.kind.parse(raw)
    except Invalid as e:
        reason = e.reason or f"expected {setting.kind.expected}"
        if setting.secret:
            raise SettingsError(f"{where}: {reason}") from None
        raise SettingsError(f"{where}={repr(raw) if e.shown is None else e.shown}: {reason}") from None


def value(setting: Setting, env: Mapping[str, str], *, given: object = None) -> Any:
    """One row's value: `given` (an option: its text, or a typed value) unless
    None, else the variable unless unset or empty, else the default."""
    if given is not None:
        source = setting.option or setting.name
        if isinstance(given, str):
            return parse(setting, given, source=source)
        if setting.kind is BOOLEAN and isinstance(given, bool):
            return given
        if setting.kind.name == "int" and isinstance(given, int) and not isinstance(given, bool):
            return parse(setting, str(given), source=source)
        raise SettingsError(f"{source}={given!r}: expected {setting.kind.expected}")
    raw = envparse.get(env, setting.name)
    if raw is None:
        if setting.required:
            raise SettingsError(f"{setting.name} is required and not set")
        return setting.default
    return parse(setting, raw)


def read(table: Iterable[Setting], env: Mapping[str, str], *,
         options: Mapping[str, object] | None = None) -> dict[str, Any]:
    """Field -> value for every row of `table` (see the module docstring);
    `options` by field, for the rows that have one."""
    rows = tuple(table)
    options = options or {}
    unknown = set(options) - {s.field for s in rows if s.option}
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    gathered: dict[str, list[tuple[str, str]]] = {}
    for s in rows:
        if s.name.endswith("*"):
            pairs = gathered.setdefault(s.field, [])
            pairs += [(k, v) for k, v in env.items() if k.startswith(s.name[:-1])]
            values[s.field] = tuple(sorted(pairs))
        else:
            values[s.field] = value(s, env, given=options.get(s.field))
    return values


def markdown(table: Iterable[Setting]) -> str:
    """The reference table of `table` as a docs page carries it: a row per
    setting, in the table's order; an option column where any has one."""
    rows = tuple(table)
    with_options = any(s.option for s in rows)
    head = ["option"] * with_options + ["variable", "default", "value", "meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in rows:
        cells = [_option(s)] * with_options + [f"`{s.name}`", _default(s), s.kind.expected, s.help]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _option(s: Setting) -> str:
    if not s.option:
        return "—"
    if s.kind is BOOLEAN:
        return f"`{s.option}/--no-{s.option[2:]}`"
    return f"`{s.option}`"


def _default(s: Setting) -> str:
    if s.required:
        return "**required**"
    if s.shown is not None:
        return s.shown
    if s.default is None or (isinstance(s.default, (str, tuple)) and not s.default):
        return "—"
    if isinstance(s.default, bool):
        return f"`{str(s.default).lower()}`"
    if isinstance(s.default, float):
        return f"`{s.default:g}`"
    return f"`{s.default}`"
