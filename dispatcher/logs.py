"""JSON-lines logging with a `component` field, on stderr.

Tokens never reach a log: no code path passes one to a log call (the Claim
type keeps its token out of repr), and as a second line of defence the
formatter replaces the service token wherever it would appear. Structured
fields go in `extra={"fields": {...}}`.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

from dispatcher import names


class JsonFormatter(logging.Formatter):
    def __init__(self, *, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self._secrets = tuple(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "component": names.COMPONENT,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info).splitlines()[-1]
        line = json.dumps(entry, default=str, sort_keys=False)
        for secret in self._secrets:
            line = line.replace(secret, "[redacted]")
        return line


def configure(*, level: str, secrets: tuple[str, ...] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets=secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client libraries' own chatter (urllib3 retries, kubernetes debug) is not ours.
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fields(**values: object) -> dict[str, dict[str, object]]:
    """`log.info("...", extra=logs.fields(job_id=...))`."""
    return {"fields": values}
