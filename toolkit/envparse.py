"""The value parsers under every process's settings: one reading of the
environment's text as a whole number, a number of seconds or a boolean,
for the controller, the dispatcher and the sidecar.

Each process declares its table of variables for the table machinery
(toolkit.envtable), which reads them with these and words the one-line
refusal (the variable and what it takes). So a value means the same thing
to all three: `get` (a variable set to the empty string counts as unset,
as a Deployment that templates a value out leaves it), and the parsers,
which raise `Malformed` (the text is not of the type at all) or
`OutOfRange` (it is, but outside the bounds; `value` is what was read) for
the caller to word. A parser takes the text as given: a caller that allows
surrounding blanks strips them first.

Standard library only, and no I/O: the sidecar imports this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# The one boolean rule of every process's settings: `true` or `false` (a caller folds case and strips
# blanks first). Nothing else, not 1/0, yes/no or on/off: a setting is read by one rule everywhere,
# and a value written for another reader's looser rule is refused by name rather than guessed at.
BOOLS = {"true": True, "false": False}


class Malformed(ValueError):
    """The text is not a value of the type."""


class OutOfRange(ValueError):
    """The text is a value of the type, outside the bounds."""

    def __init__(self, value: float) -> None:
        super().__init__(f"{value} is out of range")
        self.value = value


def get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's text, or None when it is unset or empty."""
    raw = env.get(name)
    return None if raw is None or raw == "" else raw


def whole(text: str, *, low: int, high: int) -> int:
    """A whole number written in ASCII digits only (no sign, no blank, no
    underscore), from `low` to `high`."""
    if not text.isascii() or not text.isdigit():
        raise Malformed(text)
    value = int(text)
    if not low <= value <= high:
        raise OutOfRange(value)
    return value


def seconds(text: str, *, low: float, high: float) -> float:
    """A number (as Python's float reads it) from `low` to `high`; nan and
    infinity are out of any range."""
    try:
        value = float(text)
    except ValueError:
        raise Malformed(text) from None
    if math.isnan(value) or not low <= value <= high:
        raise OutOfRange(value)
    return value


def boolean(text: str) -> bool:
    """`true` or `false` (matched exactly: a caller folds case and strips first)."""
    if text not in BOOLS:
        raise Malformed(text)
    return BOOLS[text]
