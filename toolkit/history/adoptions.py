"""A person's adoption (`toolkit adopt`): the next raise's minimum A, and the pods it exempts.

- `adopt`: the history with the adoption recorded, and the minimum A of the
  next raise, so that the next execution's R (with J as the current JobSet
  has it) is above the high-water mark. Refused when that R would reach the
  bound 10^6. The adoption keeps the person's reason and the causes the flag
  held, bounded in bytes as the annotation holds them (JSON escapes a
  character outside ASCII to 6 bytes, or 12 past the BMP). Like `observe`,
  it returns the new history for the caller to write in one preconditioned
  update.
- `adopted`: a pod created at or before the last adoption belongs to an
  execution a person has already judged; it is not flagged again while it
  winds down. Both times are the apiserver's, to the second: the pod's
  creationTimestamp, and the time the apiserver stamped on the adoption's own
  field manager (`adopted_at`); the adoption record's `time` is that stamp
  too, so a laptop's clock running fast cannot exempt pods created later.

No I/O: standard library and the other pure modules only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from toolkit import detect, identity, names
from toolkit.history import stored

Obj = dict[str, Any]


class AdoptRefused(Exception):
    """The adoption cannot give a next R above the mark; the message says why."""


def _escaped(text: str) -> int:
    """Bytes of `text` inside the rendered history (JSON-escaped, ASCII; quotes not counted)."""
    return len(json.dumps(text)) - 2


def _cut(text: str, limit: int) -> str:
    """The longest start of `text` that takes at most `limit` bytes JSON-escaped."""
    total = 0
    for i, char in enumerate(text):
        total += _escaped(char)
        if total > limit:
            return text[:i]
    return text


def _bounded(lines: list[str], limit: int) -> list[str]:
    """The first lines that fit `limit` bytes together, JSON-escaped (a first line longer than
    that is cut to it)."""
    kept: list[str] = []
    total = 0
    for line in lines:
        line = _cut(line, limit)
        if total + _escaped(line) > limit:
            break
        kept.append(line)
        total += _escaped(line)
    return kept


def adopt(
    history: stored.History,
    *,
    time: str,
    reason: str,
    causes: list[str],
    dropped: int,
    restarts: int,
    jobset_uid: str | None,
) -> tuple[stored.History, int]:
    """The history with this adoption recorded, and the minimum A of the next
    raise: with J = `restarts` (the current JobSet's), the next R is then
    above the mark."""
    next_r = history.high_water + 1
    if next_r >= identity.R_LIMIT:
        raise AdoptRefused(
            f"the next R would be {next_r} (above the high-water mark {history.high_water}); "
            f"R {next_r} is not below the bound 10^6"
        )
    minimum = max(1, next_r - restarts)
    record = stored.Adoption(
        time=time,
        reason=_cut(" ".join(reason.split()), stored.REASON_LIMIT),
        causes=_bounded(causes, stored.CAUSES_LIMIT),
        dropped=dropped + max(0, len(causes) - len(_bounded(causes, stored.CAUSES_LIMIT))),
        high_water=history.high_water,
        minimum=minimum,
        jobset_uid=jobset_uid,
    )
    adoptions = (*history.adoptions, record)
    extra = max(0, len(adoptions) - stored.MAX_ADOPTIONS)
    return (
        dataclasses.replace(history, adoptions=adoptions[extra:], adoptions_dropped=history.adoptions_dropped + extra),
        minimum,
    )


def adopted_at(trainjob: Obj) -> str | None:
    """The apiserver's time of the last adoption: the managedFields entry of the adopt's own field
    manager (`names.ADOPT_FIELD_MANAGER`), or None when there is none."""
    for entry in (trainjob.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, dict) or entry.get("manager") != names.ADOPT_FIELD_MANAGER or entry.get("subresource"):
            continue
        time = entry.get("time")
        if entry.get("operation") == "Update" and isinstance(time, str) and detect.is_timestamp(time):
            return time
    return None


def adopted(trainjob: Obj, *, created: str | None) -> bool:
    """The pod was created at or before the last adoption, both by the apiserver's clock (see the
    module docstring): never by the clock of the machine that ran `toolkit adopt`."""
    when = adopted_at(trainjob)
    if when is None or not created:
        return False
    return created <= when
