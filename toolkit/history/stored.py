"""The stored history: what the annotation holds, its format and its byte budget.

The controller records every execution it sees on the TrainJob itself
(annotation `dispatch.phpboyscout.uk/history`, JSON), where it lasts as long
as the job and survives any restart of the controller. This module is the
record's shape and the one reader and writer of its text; the rules that
change or judge it are the package's other modules.

What it holds:
- one record per execution, keyed by (A, J, JobSet UID) (`observations`
  says why the UID is part of the key). A record keeps A, J, R, the epoch
  and attempt token the prologue builds (none past the R bound), the first
  pod seen and when, when the record last changed, how the execution ended
  once known and the verdict (`ok`, or `foreign: <rule>`, which stays);
- the last `MAX_EXECUTIONS` records, ordered by R, and the count of older
  ones dropped;
- `high_water`: the highest R ever recorded. It only increases: every write
  is `max(old, new)`, and dropping a record never lowers it;
- the adoptions (`toolkit adopt`, see `adoptions`): when, the person's
  reason, the causes the flag held, the mark and the minimum A it set; the
  last `MAX_ADOPTIONS`, each bounded (`REASON_LIMIT`, `CAUSES_LIMIT`);
- `raised`: the highest A any raise wrote, written by the raise in its own
  update. It only increases, and the next raise goes above it
  (`highest_admission`), so a person who deletes the floor annotation and
  lowers our patch before the controller has recorded the executions that
  ran cannot lower A;
- `floors`: when each earlier raise set the floor, as (floor, time) with the
  apiserver's time of that raise (`toolkit.raising` moves the last raise's
  stamp here at the next raise, `with_floor`); the last `MAX_FLOORS`;
- `unsuspends`: the unsuspends by a writer other than a raise the controller
  has seen (`observations.with_unsuspend`); the last `MAX_UNSUSPENDS`.

The format is versioned (`FORMAT_VERSION`). A value this release cannot read
is kept as found and never written over: `parse` reads it as an empty
history marked `unreadable`, and the TrainJob is flagged
(`unreadable_violation`).

The byte budget: the apiserver refuses (422) an update whose annotations
pass 256 KiB together, and then the raise, the record and the flag would all
fail. So every write of ours keeps our annotations (every key under
`names.DOMAIN`, key and value, in UTF-8 bytes) within `BUDGET`, and the
history gives way: `store` writes it within the room our other annotations
and the flag's most (`causes.MOST`) leave (`room`), dropping the oldest
adoptions' causes, then the oldest adoptions, then the oldest executions
(`fit`), each counted as the limits count them. `high_water` is never
touched, so it never falls. `make_room` shrinks a history already written
when the flag grows past its reserve; an unreadable history is kept as
found, never shrunk.

No I/O: standard library and the other pure modules only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from toolkit import causes, detect, names

Obj = dict[str, Any]

HISTORY_ANNOTATION = names.HISTORY_ANNOTATION
# The history's format: `render` writes it as "version"; `parse` reads this version and a history
# with none (the same format), and keeps a newer one as found (an older controller never rewrites
# what a newer one wrote).
FORMAT_VERSION = 1
# The minimum A of the next raise, set by an adoption (toolkit.raising reads it).
MINIMUM_ANNOTATION = f"{names.DOMAIN}/admission-minimum"
MAX_EXECUTIONS = 20
MAX_ADOPTIONS = 5
MAX_FLOORS = 20
MAX_UNSUSPENDS = 10
REASON_LIMIT = 1024  # bytes of the reason as the annotation holds it (JSON-escaped)
CAUSES_LIMIT = 8192  # bytes of causes kept with one adoption, as the annotation holds them
# Our annotations together (every key under names.DOMAIN: key and value, UTF-8 bytes) at most: the
# apiserver's 256 KiB for all of an object's annotations, less a quarter for everyone else's.
BUDGET = 192 * 1024
# Left beside the history for our small annotations a write may set after it (a raise's record, a JobSet UID).
_BESIDE = 1024


@dataclasses.dataclass(frozen=True)
class Execution:
    a: int
    j: int
    jobset_uid: str | None
    r: int
    epoch: str | None
    attempt: str | None
    first_pod: str
    first_seen: str
    last_seen: str
    ended: str | None  # None while running; "succeeded", "stopped" or "failed"
    verdict: str  # "ok" or "foreign: <rule>"
    created: str | None = None  # the earliest creationTimestamp of its pods seen (the apiserver's)
    latest: str | None = None  # the latest creationTimestamp of its pods seen (the apiserver's)
    stopped: str | None = None  # the earliest time a pod of it was asked to stop (detect.stop_requested)


@dataclasses.dataclass(frozen=True)
class Adoption:
    time: str
    reason: str
    causes: list[str]
    dropped: int  # causes the flag had counted but not kept
    high_water: int
    minimum: int  # the minimum A of the next raise
    jobset_uid: str | None  # the JobSet UID recorded by the adoption


@dataclasses.dataclass(frozen=True)
class History:
    executions: tuple[Execution, ...] = ()
    dropped: int = 0
    high_water: int = 0
    adoptions: tuple[Adoption, ...] = ()
    adoptions_dropped: int = 0
    floors: tuple[tuple[int, str], ...] = ()  # (floor, the apiserver's time of the raise that set it)
    raised: int = 0  # the highest A a raise wrote
    # The unsuspends by a writer other than a raise that the controller has seen, as (field manager,
    # the TrainJob's generation, the earliest apiserver time seen for them): the last MAX_UNSUSPENDS.
    unsuspends: tuple[tuple[str, int, str], ...] = ()
    unreadable: bool = False  # the annotation was there but not ours to read
    newer_format: int = 0  # when unreadable because a newer dispatch wrote it: its format version


# -- reading and writing the annotation -----------------------------------


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"not text: {value!r}")
    return value


def _time(value: Any) -> str:
    if not isinstance(value, str) or not detect.is_timestamp(value):
        raise ValueError(f"not a timestamp: {value!r}")
    return value


def parse(value: str | None) -> History:
    """The history an annotation holds; an unreadable one reads as empty,
    marked `unreadable`. Nothing of ours writes over an unreadable history
    (the executions and the mark it held are unknown, so a new one would lower
    the mark): the value is kept as found, the TrainJob is flagged
    (`unreadable_violation`) and `adopt` refuses until a person repairs it."""
    if value is None:
        return History()
    try:
        doc = json.loads(value)
        version = doc.get("version", FORMAT_VERSION)
        if type(version) is not int or version < 1:
            raise ValueError(f"format version {version!r}")
        if version > FORMAT_VERSION:
            return History(unreadable=True, newer_format=version)
        executions = tuple(
            Execution(a=_int(e["a"]), j=_int(e["j"]), jobset_uid=_opt_str(e.get("jobsetUid")), r=_int(e["r"]), epoch=_opt_str(e.get("epoch")),
                      attempt=_opt_str(e.get("attempt")), first_pod=str(e["firstPod"]),
                      first_seen=str(e["firstSeen"]), last_seen=str(e["lastSeen"]),
                      ended=_opt_str(e.get("ended")), verdict=str(e["verdict"]),
                      created=None if e.get("created") is None else _time(e["created"]),
                      latest=None if e.get("latest") is None else _time(e["latest"]),
                      stopped=None if e.get("stopped") is None else _time(e["stopped"]))
            for e in doc.get("executions") or []
        )
        adoptions = tuple(
            Adoption(time=str(d["time"]), reason=str(d["reason"]), causes=[str(c) for c in d.get("causes") or []],
                     dropped=_int(d.get("dropped", 0)), high_water=_int(d["highWater"]),
                     minimum=_int(d["minimum"]), jobset_uid=_opt_str(d.get("jobsetUid")))
            for d in doc.get("adoptions") or []
        )
        return History(
            executions=executions,
            dropped=_int(doc.get("dropped", 0)),
            high_water=_int(doc.get("highWater", 0)),
            adoptions=adoptions,
            adoptions_dropped=_int(doc.get("adoptionsDropped", 0)),
            floors=tuple((_int(f[0]), _time(f[1])) for f in doc.get("floors") or []),
            raised=_int(doc.get("raised", 0)),
            unsuspends=tuple((str(u[0]), _int(u[1]), _time(u[2])) for u in doc.get("unsuspends") or []),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return History(unreadable=True)


def unreadable_violation(history: History) -> detect.Violation | None:
    """The flag an unreadable history raises (one line for the TrainJob, not one per pod)."""
    if not history.unreadable:
        return None
    if history.newer_format:
        return detect.Violation(
            "unreadable-history",
            f"TrainJob annotation {HISTORY_ANNOTATION} has format version {history.newer_format}, newer than this "
            f"dispatch reads ({FORMAT_VERSION}): it is kept as found and nothing of ours writes over it; run the "
            "release that wrote it",
        )
    return detect.Violation(
        "unreadable-history",
        f"TrainJob annotation {HISTORY_ANNOTATION} is not a history dispatch wrote: the executions and the "
        "high-water mark of R it held are unknown; it is kept as found and nothing of ours writes over it",
    )


def highest_admission(history: History) -> int:
    """The highest A the history knows was used or raised (its raised mark, its floors and its
    executions'): the raise goes above it, so deleting the floor annotation and lowering the patch
    cannot lower A."""
    return max((history.raised, *(floor for floor, _ in history.floors), *(e.a for e in history.executions)))


def render(history: History) -> str:
    doc = {
        "version": FORMAT_VERSION,
        "highWater": history.high_water,
        "dropped": history.dropped,
        "executions": [
            {"a": e.a, "j": e.j, "jobsetUid": e.jobset_uid, "r": e.r, "epoch": e.epoch, "attempt": e.attempt, "firstPod": e.first_pod,
             "firstSeen": e.first_seen, "lastSeen": e.last_seen, "ended": e.ended, "verdict": e.verdict,
             "created": e.created, "latest": e.latest, "stopped": e.stopped}
            for e in history.executions
        ],
        "adoptionsDropped": history.adoptions_dropped,
        "adoptions": [
            {"time": d.time, "reason": d.reason, "causes": d.causes, "dropped": d.dropped,
             "highWater": d.high_water, "minimum": d.minimum, "jobsetUid": d.jobset_uid}
            for d in history.adoptions
        ],
        "floors": [[floor, time] for floor, time in history.floors],
        "raised": history.raised,
        "unsuspends": [list(u) for u in history.unsuspends],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def of(trainjob: Obj) -> History:
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    return parse(annotations.get(HISTORY_ANNOTATION))


def with_floor(history: History, *, floor: int, time: str) -> History:
    """The history with the raise that set `floor` at `time` kept (the last `MAX_FLOORS`)."""
    if (floor, time) in history.floors:
        return history
    floors = (*history.floors, (floor, time))
    return dataclasses.replace(history, floors=floors[-MAX_FLOORS:], unreadable=False)


# -- the byte budget -------------------------------------------------------


def ours(annotations: dict[str, Any], *, without: tuple[str, ...] = ()) -> int:
    """Bytes of our annotations (keys under `names.DOMAIN`), keys and values, but `without`."""
    prefix = f"{names.DOMAIN}/"
    return sum(causes.encoded(key) + causes.encoded(value) for key, value in annotations.items()
               if key.startswith(prefix) and key not in without and isinstance(value, str))


def room(annotations: dict[str, Any]) -> int:
    """Bytes the history's value may take: `BUDGET` less our other annotations, its own key, the
    flag's most (or what the flag holds, when more), so a flag written later always fits, and
    `_BESIDE`."""
    flag = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
    others = ours(annotations, without=(HISTORY_ANNOTATION, names.FOREIGN_ANNOTATION, causes.DROPPED_ANNOTATION))
    return BUDGET - others - len(HISTORY_ANNOTATION) - max(causes.MOST, causes.size(flag)) - _BESIDE


def fit(history: History, *, limit: int) -> History:
    """The history whose rendering takes at most `limit` bytes, dropping as little as it must, in
    this order: the oldest adoptions' causes (counted in the adoption's `dropped`), then the oldest
    adoptions (`adoptions_dropped`), then the oldest executions (`dropped`). The mark, the floors
    and the raised mark stay; when even those do not fit, the least history is returned."""
    while len(render(history)) > limit:
        spent = next((i for i, d in enumerate(history.adoptions) if d.causes), None)
        if spent is not None:
            d = history.adoptions[spent]
            bare = dataclasses.replace(d, causes=[], dropped=d.dropped + len(d.causes))
            history = dataclasses.replace(
                history, adoptions=history.adoptions[:spent] + (bare,) + history.adoptions[spent + 1:])
        elif history.adoptions:
            history = dataclasses.replace(history, adoptions=history.adoptions[1:],
                                          adoptions_dropped=history.adoptions_dropped + 1)
        elif history.executions:
            history = dataclasses.replace(history, executions=history.executions[1:], dropped=history.dropped + 1)
        else:
            break
    return history


def store(annotations: dict[str, Any], history: History) -> bool:
    """Write `history` into `annotations` (in place) within its `room`; False when even the least
    history does not fit (our other annotations fill the budget: the caller refuses to write)."""
    limit = room(annotations)
    value = render(fit(history, limit=limit))
    annotations[HISTORY_ANNOTATION] = value
    return len(value) <= limit


def make_room(annotations: dict[str, Any]) -> None:
    """Shrink the history in `annotations` (in place) when it takes more than its room (a flag
    grown past the reserve, a history written before the budget); an unreadable one is kept."""
    value = annotations.get(HISTORY_ANNOTATION)
    if value is None or causes.encoded(value) <= room(annotations):
        return
    found = parse(value)
    if not found.unreadable:
        store(annotations, found)
