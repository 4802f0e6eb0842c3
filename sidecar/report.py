"""What the sidecar says: JSON log lines, and the Warning Event on the TrainJob.

Log lines go to stderr, one JSON object a line, in the record all three
processes write (toolkit.jsonlog: `time`, `level`, `component`, `message`,
then the fields); the token is never logged. A violation is logged at every
check that sees it, but reported as an Event once per process for each
distinct violation (rule and detail): the Event is the controller's signal to flag the TrainJob, and
sending it again every interval would only add load and noise. A new value
(another floor, another UID) is a distinct violation and reported again.

The Event is core/v1 with involvedObject the TrainJob (its uid included, so
the controller can ignore a report about an earlier TrainJob of the same
name), reason `names.SIDECAR_VIOLATION_REASON`, type Warning, and the message
from `check.message`.
"""

from __future__ import annotations

import sys
import time

from toolkit import detect, jsonlog, names

COMPONENT = "dispatch-sidecar"
REPORTING_CONTROLLER = f"{names.DOMAIN}/sidecar"


def log(message: str, *, level: str = "info", **fields: object) -> None:
    record = jsonlog.record(component=COMPONENT, level=level, message=message, fields=fields)
    sys.stderr.write(jsonlog.line(record) + "\n")
    sys.stderr.flush()


def event(*, namespace: str, trainjob: dict[str, object], pod: str, message: str) -> dict[str, object]:
    meta = trainjob.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = str(meta.get("name") or "")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # The apiserver appends a random suffix: Event names carry no meaning.
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": f"{names.TRAINER_GROUP}/{names.TRAINER_VERSION}",
            "kind": "TrainJob",
            "name": name,
            "namespace": namespace,
            "uid": str(meta.get("uid") or ""),
        },
        "reason": names.SIDECAR_VIOLATION_REASON,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": REPORTING_CONTROLLER,
        "reportingInstance": pod,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class Reported:
    """The distinct violations this process has already sent an Event for."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def is_new(self, violation: detect.Violation) -> bool:
        return (violation.rule, violation.detail) not in self._seen

    def add(self, violation: detect.Violation) -> None:
        self._seen.add((violation.rule, violation.detail))
