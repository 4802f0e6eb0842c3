"""The JSON log record: one schema for the controller, the dispatcher and the
sidecar, so one query reads all three components' logs.

A record is one JSON object on one line, its keys in this order:

    time       RFC 3339, UTC, milliseconds: 2026-12-03T13:32:47.123Z
    level      debug, info, warning, error or critical
    component  dispatch-controller, dispatcher, dispatch-sidecar
    message    what happened, a fixed text a query can match
    ...        the fields: the values that vary (names, counts, an `error`)

An exception adds `error`, the last line of its text (one line, what a
reader needs); a process that wants the whole trace asks for `traceback`.
Values JSON cannot hold are written as their str.

The sidecar builds records with `record` and writes them itself; the
controller and the dispatcher go through the logging package, and turn a
`logging.LogRecord` into a record with `from_log_record` (its `extra`
attributes become fields; a `fields` dict among them is merged in). This
module never imports logging: the sidecar would pay for it in every pod.

Standard library only, and no I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

MYPY = False
if MYPY:  # for type checkers only (typing.TYPE_CHECKING would import typing): the sidecar never loads logging
    import logging

# The attributes every logging.LogRecord has, which are not fields. Written
# out rather than read from logging, so the sidecar need not import it.
_LOG_RECORD_ATTRS = frozenset({
    "name", "msg", "args", "levelname", "levelno", "pathname", "filename", "module", "exc_info", "exc_text",
    "stack_info", "lineno", "funcName", "created", "msecs", "relativeCreated", "thread", "threadName",
    "processName", "process", "taskName", "message", "asctime",
})


def timestamp(created: float) -> str:
    """`created` (seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)  # truncated, as logging's msecs
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def record(*, component: str, level: str, message: str, created: float | None = None,
           fields: Mapping[str, object] | None = None) -> dict[str, object]:
    """One record: the four keys of the schema, then `fields` (which cannot replace them)."""
    out: dict[str, object] = {
        "time": timestamp(time.time() if created is None else created),
        "level": level,
        "component": component,
        "message": message,
    }
    for key, value in (fields or {}).items():
        out.setdefault(key, value)
    return out


def line(rec: Mapping[str, object]) -> str:
    """The record as one JSON line (without the newline)."""
    return json.dumps(rec, separators=(",", ":"), default=str)


def from_log_record(log_record: logging.LogRecord, *, component: str, traceback: bool = False) -> dict[str, object]:
    """A `logging.LogRecord` as a record: its logger name and `extra` as fields."""
    fields: dict[str, object] = {"logger": log_record.name}
    for key, value in vars(log_record).items():
        if key in _LOG_RECORD_ATTRS:
            continue
        if key == "fields" and isinstance(value, dict):
            fields.update(value)
        else:
            fields[key] = value
    if log_record.exc_info:
        import traceback as tb  # only where a LogRecord exists, so logging (which imports it) is loaded

        text = "".join(tb.format_exception(*log_record.exc_info)).rstrip("\n")
        fields["error"] = text.splitlines()[-1]
        if traceback:
            fields["traceback"] = text
    return record(component=component, level=log_record.levelname.lower(), message=log_record.getMessage(),
                  created=log_record.created, fields=fields)
