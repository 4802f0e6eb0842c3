"""A TrainJob's execution history and its high-water mark of R, as pure rules.

Why it exists: Events expire after an hour and `toolkit status` shows one
execution, so after a reset nobody could say which epochs had already been
used, nor what the next execution must exceed. The controller records every
execution it sees on the TrainJob itself (annotation
`dispatch.phpboyscout.uk/history`, JSON), where it lasts as long as the job
and survives any restart of the controller.

What it holds:
- one record per execution, keyed by (A, J, JobSet UID): every pod of one
  execution has the same A (from the pod template), J (JobSet's
  restart-attempt label) and JobSet (its jobset-uid label). The UID is part
  of the key because a reset can repeat A and J exactly: a recreated JobSet
  starts J at 0 again under the same A.
  A record keeps A, J, R, the epoch and attempt token the prologue builds
  (none past the R bound), the first pod seen and when, when the record last
  changed, how the execution ended once known (`failed` wins over `stopped`,
  which wins over `succeeded`) and the verdict (`ok`, or `foreign: <rule>`,
  which stays);
- the last `MAX_EXECUTIONS` records, ordered by R, and the count of older
  ones dropped;
- `high_water`: the highest R ever recorded. It only increases: every write
  is `max(old, new)`, and dropping a record never lowers it;
- the adoptions (`toolkit adopt`): when, the person's reason, the causes the
  flag held, the mark and the minimum A it set; the last `MAX_ADOPTIONS`,
  each bounded (in bytes as the annotation holds them: JSON escapes a
  character outside ASCII to 6 bytes, or 12 past the BMP);
- `raised`: the highest A any raise wrote, written by the raise in its own
  update. It only increases, and the next raise goes above it, so a person
  who deletes the floor annotation and lowers our patch before the
  controller has recorded the executions that ran cannot lower A;
- `floors`: when each earlier raise set the floor, as (floor, time) with the
  apiserver's time of that raise (`toolkit.raising` moves the last raise's
  stamp here at the next raise); the last `MAX_FLOORS`.

The rules that use it:
- `repeat`: a pod of an execution not yet recorded whose R is at or below
  the mark repeats an earlier execution's epoch (or goes back). Every
  legitimate boundary raises A or J, so a new execution's R is above every
  earlier one; only a reset produces this.
- `adopt`: the minimum A of the next raise, so that the next execution's R
  (with J as the current JobSet has it) is above the mark. Refused when that
  R would reach the bound 10^6.
- `adopted`: a pod created at or before the last adoption belongs to an
  execution a person has already judged; it is not flagged again while it
  winds down. Both times are the apiserver's, to the second: the pod's
  creationTimestamp, and the time the apiserver stamped on the adoption's own
  field manager (`adopted_at`); the adoption record's `time` is that stamp
  too, so a laptop's clock running fast cannot exempt pods created later.

The byte budget: the apiserver refuses (422) an update whose annotations
pass 256 KiB together, and then the raise, the record and the flag would all
fail. So every write of ours keeps our annotations (every key under
`names.DOMAIN`, key and value, in UTF-8 bytes) within `BUDGET`, and the
history gives way: `store` writes it within the room our other annotations
and the flag's most (`causes.MOST`) leave, dropping the oldest adoptions'
causes, then the oldest adoptions, then the oldest executions, each counted
as the limits count them. `high_water` is never touched, so it never falls.

Writes are never blind: `observe` and `adopt` return the new history, and
the caller writes it in one update preconditioned on the resourceVersion it
read (a 409 re-reads and recomputes). `observe` returns None when nothing
changed, so a job's many ranks cost one write per execution and state, not
one per pod event.

No I/O: standard library and the other pure modules only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from toolkit import causes as causes_mod
from toolkit import detect, identity, marks, names

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
_ENDED_RANK = {None: 0, "succeeded": 1, "stopped": 2, "failed": 3}


class AdoptRefused(Exception):
    """The adoption cannot give a next R above the mark; the message says why."""


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


@dataclasses.dataclass(frozen=True)
class Observation:
    a: int
    j: int
    jobset_uid: str | None
    epoch: str | None
    attempt: str | None
    pod: str
    time: str
    ended: str | None
    verdict: str
    created: str | None = None  # the pod's creationTimestamp
    stopped: str | None = None  # when the apiserver was first asked to delete the pod
    unsuspend: tuple[str, int, str] | None = None  # the TrainJob's unsuspend as read (raising.unsuspend_seen)


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


# -- identity of an execution --------------------------------------------


def _env_value(trainjob: Obj, key: str) -> str | None:
    for var in ((trainjob.get("spec") or {}).get("trainer") or {}).get("env") or []:
        if var.get("name") == key and "value" in var:
            return str(var["value"])
    return None


def identity_of(trainjob: Obj, *, admission: int, restart: int) -> tuple[str | None, str | None]:
    """The epoch and attempt token an execution with this A and J sees, as the
    prologue builds them; (None, None) where the prologue would refuse to run
    (A = 0, R at the bound) or the TrainJob has no prefixes."""
    try:
        r = identity.check_r(admission=admission, restart=restart)
    except identity.BoundError:
        return None, None
    prefix = _env_value(trainjob, names.ENV_EPOCH_PREFIX)
    token = _env_value(trainjob, names.ENV_TOKEN_PREFIX)
    epoch: str | None = None
    if prefix is not None:
        try:
            epoch = str(identity.epoch_from_prefix(prefix=prefix, r=r))
        except identity.BoundError:
            epoch = None
    return epoch, (f"{token}.{admission}.{restart}" if token else None)


def from_pod(pod: Obj, trainjob: Obj, *, now: str, verdict: str) -> Observation | None:
    """What a trainer pod says about its execution; None when it carries no
    usable A or J, or A = 0 (the prologue runs nothing then)."""
    meta = pod.get("metadata") or {}
    a = detect.parse_count(((meta.get("annotations") or {}).get(names.ADMISSION_ANNOTATION)))
    j = detect.parse_count(((meta.get("labels") or {}).get(names.RESTART_LABEL)))
    if a is None or j is None or a == 0:
        return None
    phase = (pod.get("status") or {}).get("phase")
    ended = {"Succeeded": "succeeded", "Failed": "failed"}.get(str(phase))
    if ended is None and not marks.is_live(pod):
        ended = "stopped"
    epoch, attempt = identity_of(trainjob, admission=a, restart=j)
    uid = (meta.get("labels") or {}).get(names.JOBSET_UID_LABEL)
    created = meta.get("creationTimestamp")
    return Observation(a=a, j=j, jobset_uid=uid, epoch=epoch, attempt=attempt, pod=str(meta.get("name")), time=now,
                       ended=ended, verdict=verdict,
                       created=created if isinstance(created, str) and detect.is_timestamp(created) else None,
                       stopped=detect.stop_requested(meta))


# -- the rules ------------------------------------------------------------


def with_unsuspend(history: History, unsuspend: tuple[str, int, str] | None) -> History:
    """The history with an unsuspend seen kept: for a (manager, generation) already kept, the earlier
    of the two times (a later write of the same manager to another field moves its managedFields time,
    never the generation), else a new entry (the last MAX_UNSUSPENDS)."""
    if unsuspend is None:
        return history
    manager, generation, time = unsuspend
    kept = list(history.unsuspends)
    for i, (m, g, t) in enumerate(kept):
        if (m, g) == (manager, generation):
            if time >= t:
                return history
            kept[i] = (m, g, time)
            return dataclasses.replace(history, unsuspends=tuple(kept))
    return dataclasses.replace(history, unsuspends=(*kept, unsuspend)[-MAX_UNSUSPENDS:])


def unsuspend_time(history: History, *, manager: str, generation: int | None, time: str) -> str:
    """The earliest time known of the unsuspend by `manager` at `generation`: the history's, when it
    kept an earlier one, else `time` (the managedFields time read now)."""
    for m, g, t in history.unsuspends:
        if (m, g) == (manager, generation) and t < time:
            return t
    return time


def observe(history: History, obs: Observation) -> History | None:
    """The history with this observation recorded, or None when it adds
    nothing (see the module docstring)."""
    before = history
    history = with_unsuspend(history, obs.unsuspend)
    changed = _observe(history, obs)
    if changed is None and history != before:
        return history
    return changed


def _observe(history: History, obs: Observation) -> History | None:
    r = obs.a + obs.j
    for i, e in enumerate(history.executions):
        if (e.a, e.j, e.jobset_uid) != (obs.a, obs.j, obs.jobset_uid):
            continue
        ended = obs.ended if _ENDED_RANK.get(obs.ended, 0) > _ENDED_RANK.get(e.ended, 0) else e.ended
        verdict = e.verdict if e.verdict != "ok" else obs.verdict
        created = min(filter(None, (e.created, obs.created)), default=None)
        latest = max(filter(None, (e.latest, e.created, obs.created)), default=None)
        stopped = min(filter(None, (e.stopped, obs.stopped)), default=None)
        if (ended, verdict, created, latest, stopped) == (e.ended, e.verdict, e.created, e.latest, e.stopped):
            return None
        changed = dataclasses.replace(e, ended=ended, verdict=verdict, created=created, latest=latest,
                                      stopped=stopped, last_seen=obs.time)
        return dataclasses.replace(
            history, executions=history.executions[:i] + (changed,) + history.executions[i + 1:]
        )
    full = len(history.executions) >= MAX_EXECUTIONS
    if full and history.executions and r < history.executions[0].r:
        return None  # a late pod of an execution already dropped
    new = Execution(a=obs.a, j=obs.j, jobset_uid=obs.jobset_uid, r=r, epoch=obs.epoch, attempt=obs.attempt, first_pod=obs.pod,
                    first_seen=obs.time, last_seen=obs.time, ended=obs.ended, verdict=obs.verdict, created=obs.created,
                    latest=obs.created, stopped=obs.stopped)
    executions = sorted((*history.executions, new), key=lambda e: (e.r, e.a))
    dropped = max(0, len(executions) - MAX_EXECUTIONS)
    return dataclasses.replace(
        history,
        executions=tuple(executions[dropped:]),
        dropped=history.dropped + dropped,
        high_water=max(history.high_water, r),
        unreadable=False,
    )


def recorded(history: History, *, a: int, j: int, jobset_uid: str | None) -> bool:
    return any((e.a, e.j, e.jobset_uid) == (a, j, jobset_uid) for e in history.executions)


def repeat(history: History, *, a: int, j: int, jobset_uid: str | None, pod: str) -> detect.Violation | None:
    """A pod of a new execution whose R is not above the mark."""
    r = a + j
    if recorded(history, a=a, j=j, jobset_uid=jobset_uid) or r > history.high_water:
        return None
    return detect.Violation(
        "r-repeat",
        f"pod {pod} runs A={a} J={j}, R {r}, not above the highest R {history.high_water} of an earlier "
        "execution: its epoch repeats or goes back",
    )


def _start(history: History, *, a: int, j: int, jobset_uid: str | None, created: str | None) -> str | None:
    """The earliest creation time known of the execution (A, J, JobSet): its record's and this pod's."""
    own = [e.created for e in history.executions if (e.a, e.j, e.jobset_uid) == (a, j, jobset_uid)]
    return min(filter(None, (created, *own)), default=None)


def _latest(history: History, *, a: int, j: int, jobset_uid: str | None, created: str | None) -> str | None:
    """The latest creation time known of the execution (A, J, JobSet): its record's and this pod's."""
    own = [e.latest or e.created for e in history.executions if (e.a, e.j, e.jobset_uid) == (a, j, jobset_uid)]
    return max(filter(None, (created, *own)), default=None)


def repeat_across_raise(history: History, *, a: int, j: int, jobset_uid: str | None, created: str | None,
                        raises: list[tuple[int, str]]) -> detect.Violation | None:
    """A pod of a recorded execution created on the other side of a raise from that execution's
    earliest pod: a raise lies between the two creation times (the apiserver's, to the second), more
    than the clock margin after the earlier one. A pod created after a raise carries an A at least that raise's, and every pod of an
    execution before it an A below it, so one execution's pods never straddle a raise: this pod
    runs an earlier execution's A, J and JobSet again (resumed without a raise, or our patch
    lowered back to an A the history had not recorded when the raise was computed)."""
    start = _start(history, a=a, j=j, jobset_uid=jobset_uid, created=None)
    if created is None or start is None:
        return None
    earlier, later = sorted((start, created))
    # The clock margin on the earlier side: a pod of the execution a raise began, created just after
    # it and stamped by a replica whose clock is behind, must not read as one from before it.
    between = sorted(time for _, time in raises if detect.after(time, earlier) and time < later)
    if not between:
        return None
    return detect.Violation(
        "r-repeat",
        f"the execution A={a} J={j}, R {a + j}, has pods created before and after the raise at {between[0]}: "
        "its epoch repeats an execution from before that raise",
    )


def repeat_across_unsuspend(history: History, *, a: int, j: int, jobset_uid: str | None, created: str | None,
                            unsuspended: str | None) -> detect.Violation | None:
    """A pod of an execution whose earliest pod was created before an unsuspend by a writer other
    than a raise (`unsuspended`, the apiserver's time: `raising.unsuspend_seen`), created at or after
    it: one execution's pods on both sides of an unsuspend. Every execution begins at an unsuspend
    and its pods are created after it; pods from before it belong to an execution that was stopped
    (a suspend by hand, undone by Kueue while its Workload stays admitted) and now runs again with
    the same A and J. The execution's start must be more than the clock margin before the unsuspend
    (`detect.SKEW_SECONDS`): stamped by another apiserver replica, a pod created just after it can
    read as a second before it."""
    start = _start(history, a=a, j=j, jobset_uid=jobset_uid, created=created)
    latest = _latest(history, a=a, j=j, jobset_uid=jobset_uid, created=created)
    if start is None or latest is None:
        return None
    # The unsuspend read now and every one kept: an execution ended and suspended again is judged too.
    times = sorted({*filter(None, [unsuspended]), *(t for _, _, t in history.unsuspends)})
    between = [t for t in times if detect.after(t, start) and latest >= t]
    if not between:
        return None
    return detect.Violation(
        "r-repeat",
        f"the execution A={a} J={j}, R {a + j}, has pods created before and after the unsuspend at {between[0]}: "
        "it was resumed without a new admission, so its epoch repeats",
    )


def repeat_after_stop(history: History, *, a: int, j: int, jobset_uid: str | None, created: str | None,
                      stopped: str | None) -> detect.Violation | None:
    """An execution with a pod created at or after a pod of it was stopped (`detect.resumed_after_stop`),
    by what its record and this pod say together: the latest creation known against the earliest stop
    known, so the rule holds whichever of the two pods the controller sees first, and for a pod
    judged long after it ended. Both times are the apiserver's, to the second, and a pod created in
    the same second as the stop is not taken for a repeat: a preemption can land in the second its
    execution's last pod was created. A resume that fast is left to the unsuspend rule
    (`repeat_across_unsuspend`), which compares with the unsuspend instead."""
    latest = _latest(history, a=a, j=j, jobset_uid=jobset_uid, created=created)
    first_stop = min(filter(None, (stopped, *(e.stopped for e in history.executions
                                               if (e.a, e.j, e.jobset_uid) == (a, j, jobset_uid)))), default=None)
    if latest is None or first_stop is None or latest <= first_stop:
        return None
    return detect.resumed_after_stop(a=a, j=j, created=latest, stopped=first_stop)


def repeat_by_creation(history: History, *, a: int, j: int, jobset_uid: str | None,
                       created: str | None, adopted: str | None = None) -> detect.Violation | None:
    """An execution started (its earliest pod created, by the apiserver's clock, to the second) more
    than the clock margin after a recorded execution whose R is not below its own. Legitimate executions start in the order of
    their R, so this holds for a pod judged at any time, running or ended: an ended pod of an
    execution the controller never saw is judged as surely as a running one, which the high-water
    rule (`repeat`) cannot do (an old execution's pods may be seen after newer ones). An execution
    that started at or before the last adoption (`adopted`, the apiserver's time) was judged by a
    person, even through a pod of it created since."""
    start = _start(history, a=a, j=j, jobset_uid=jobset_uid, created=created)
    if start is None or (adopted is not None and start <= adopted):
        return None
    r = a + j
    before = [e for e in history.executions
              if (e.a, e.j, e.jobset_uid) != (a, j, jobset_uid) and e.created is not None
              and detect.after(start, e.created)
              and e.r >= r]
    if not before:
        return None
    e = max(before, key=lambda e: (e.r, e.created or ""))
    return detect.Violation(
        "r-repeat",
        f"the execution A={a} J={j}, R {r}, started at {start}, after the execution A={e.a} J={e.j}, R {e.r}, "
        f"started at {e.created}: its epoch repeats or goes back",
    )


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


def ours(annotations: dict[str, Any], *, without: tuple[str, ...] = ()) -> int:
    """Bytes of our annotations (keys under `names.DOMAIN`), keys and values, but `without`."""
    prefix = f"{names.DOMAIN}/"
    return sum(causes_mod.encoded(key) + causes_mod.encoded(value) for key, value in annotations.items()
               if key.startswith(prefix) and key not in without and isinstance(value, str))


def room(annotations: dict[str, Any]) -> int:
    """Bytes the history's value may take: `BUDGET` less our other annotations, its own key, the
    flag's most (or what the flag holds, when more), so a flag written later always fits, and
    `_BESIDE`."""
    flag = causes_mod.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes_mod.DROPPED_ANNOTATION))
    others = ours(annotations, without=(HISTORY_ANNOTATION, names.FOREIGN_ANNOTATION, causes_mod.DROPPED_ANNOTATION))
    return BUDGET - others - len(HISTORY_ANNOTATION) - max(causes_mod.MOST, causes_mod.size(flag)) - _BESIDE


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
    if value is None or causes_mod.encoded(value) <= room(annotations):
        return
    found = parse(value)
    if not found.unreadable:
        store(annotations, found)


def adopt(
    history: History,
    *,
    time: str,
    reason: str,
    causes: list[str],
    dropped: int,
    restarts: int,
    jobset_uid: str | None,
) -> tuple[History, int]:
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
    record = Adoption(
        time=time,
        reason=_cut(" ".join(reason.split()), REASON_LIMIT),
        causes=_bounded(causes, CAUSES_LIMIT),
        dropped=dropped + max(0, len(causes) - len(_bounded(causes, CAUSES_LIMIT))),
        high_water=history.high_water,
        minimum=minimum,
        jobset_uid=jobset_uid,
    )
    adoptions = (*history.adoptions, record)
    extra = max(0, len(adoptions) - MAX_ADOPTIONS)
    return (
        dataclasses.replace(history, adoptions=adoptions[extra:], adoptions_dropped=history.adoptions_dropped + extra),
        minimum,
    )


def with_floor(history: History, *, floor: int, time: str) -> History:
    """The history with the raise that set `floor` at `time` kept (the last `MAX_FLOORS`)."""
    if (floor, time) in history.floors:
        return history
    floors = (*history.floors, (floor, time))
    return dataclasses.replace(history, floors=floors[-MAX_FLOORS:], unreadable=False)


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
    docstring): never by the clock of the machine that ran `toolkit adopt`."""
    when = adopted_at(trainjob)
    if when is None or not created:
        return False
    return created <= when
