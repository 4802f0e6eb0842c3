"""Reset detection rules (docs/adapter.md), as pure functions.

Both the controller and the sidecar verifier decide with these, so the two
can never disagree on what a violation is or how it is worded. Nothing here
does I/O or imports anything heavier than the standard library: the sidecar
runs in every pod and pays for every import.

A rule returns None when the object is fine, or a Violation whose `detail`
is the cause text kept in the foreign annotation and the Event message.
Detection reports; it never decides to stop anything.
"""

from __future__ import annotations

import collections
import datetime
import json
import re

from toolkit import names

# "0", or 1 to 6 digits without a leading zero: the prologue's own rule.
_COUNT = re.compile(r"0|[1-9][0-9]{0,5}")
# The apiserver's timestamps (creationTimestamp, managedFields time): UTC, to the second.
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


# A named tuple, not a dataclass: dataclasses imports inspect (ast, dis, tokenize...), ~1.7 MB of
# RSS in the sidecar, which imports this module in every pod.
class Violation(collections.namedtuple("Violation", "rule detail")):
    __slots__ = ()
    rule: str  # a short stable key: missing-admission, below-floor, ...
    detail: str  # the human cause text


def parse_count(value: str | None) -> int | None:
    """A or J as the prologue would accept it, else None."""
    if value is None or not _COUNT.fullmatch(value):
        return None
    return int(value)


def jobset_uid(*, recorded: str | None, seen: str) -> Violation | None:
    """A JobSet whose UID differs from the recorded one may have restarted J."""
    if not recorded or recorded == seen:
        return None
    return Violation(
        "jobset-uid",
        f"JobSet UID {seen} is not the recorded {recorded}: J may have been reset",
    )


def pod(
    *,
    pod_name: str,
    admission: str | None,
    restart: str | None,
    floor: int | None,
) -> Violation | None:
    """Check one pod's admission annotation and restart label against the floor.

    `admission` is None when the pod has no admission annotation, `restart`
    None when it has no restart label; `floor` None when the TrainJob has no
    floor yet (nothing was ever raised, so no pod can be legitimately running).
    """
    if admission is None:
        return Violation(
            "missing-admission",
            f"pod {pod_name} has no annotation dispatch.phpboyscout.uk/admission: "
            "it was not created from our runtime patch",
        )
    a = parse_count(admission)
    if a is None:
        return Violation(
            "invalid-admission",
            f"pod {pod_name} has admission {admission!r}, "
            "not 0 or a decimal of at most 6 digits without a leading zero",
        )
    if restart is not None and parse_count(restart) is None:
        return Violation(
            "invalid-restart",
            f"pod {pod_name} has restart-attempt {restart!r}, "
            "not 0 or a decimal of at most 6 digits without a leading zero",
        )
    if floor is not None and a < floor:
        return Violation(
            "below-floor",
            f"pod {pod_name} has admission {a}, below the floor {floor}: A may have been lowered",
        )
    return None


def now() -> str:
    """This machine's clock in the apiserver's timestamp format (UTC, to the second). For what
    we write for people to read (a condition's transition time, an Event, a history record's
    first sight); never to judge a pod: that takes the apiserver's own times."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_timestamp(value: str) -> bool:
    """The apiserver's format, in which text order is time order."""
    return bool(_TIMESTAMP.fullmatch(value))


# The clock skew allowed between the apiserver replicas that stamp the times the rules compare
# (docs/adapter.md, "Clocks"). A rule that flags on "B came after A" where the two stamps may come
# from different replicas flags only when B is more than this after A; a rule that flags on "B did
# not come after A" gives the same margin the other way.
SKEW_SECONDS = 1


def _seconds(value: str) -> int:
    return int(datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
               .replace(tzinfo=datetime.timezone.utc).timestamp())


def after(later: str, earlier: str, *, margin: int = SKEW_SECONDS) -> bool:
    """`later` is more than `margin` seconds after `earlier` (two apiserver stamps, to the second)."""
    return _seconds(later) - _seconds(earlier) > margin


def shifted(value: str, seconds: int) -> str:
    """An apiserver stamp moved by a number of seconds, in the same format."""
    moment = datetime.datetime.fromtimestamp(_seconds(value) + seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def stop_requested(meta: dict) -> str | None:
    """When the apiserver was first asked to delete a pod: its deletionTimestamp less its
    deletionGracePeriodSeconds. A later delete may only shorten the grace, and the apiserver then
    moves the deletionTimestamp back by as much, so the difference stays the first request's time,
    stamped by the apiserver's clock. None for a pod not being deleted."""
    stamp = meta.get("deletionTimestamp")
    grace = meta.get("deletionGracePeriodSeconds", 0)
    if not isinstance(stamp, str) or not is_timestamp(stamp) or type(grace) is not int or grace < 0:
        return None
    return shifted(stamp, -grace)


def resumed_after_stop(*, a: int, j: int, created: str | None, stopped: str) -> Violation:
    """A pod of an execution created after a pod of the same execution (A, J and JobSet) was stopped:
    the execution was stopped (a suspend, an eviction) and resumed without a new admission. A
    legitimate execution never creates a pod once one of its pods was deleted: a deleted trainer pod
    fails its Job (backoffLimit 0), which ends the execution (a JobSet restart, J + 1). `created`
    None: the sidecar's word for its own pod, whose creation time it cannot read."""
    return Violation(
        "r-repeat",
        f"the execution A={a} J={j}, R {a + j}, has a pod {'created at ' + created if created else 'starting now'}, "
        f"after a pod of it was stopped at {stopped}: it was resumed without a new admission, so its epoch repeats",
    )


def stopped_in_history(history_text: object, *, a: int, j: int, jobset_uid: str | None) -> str | None:
    """When the TrainJob's history (its annotation's text, toolkit.history's format) records the
    execution (A, J, JobSet) as stopped; None when it does not, or cannot be read. The sidecar's
    reading: plain JSON, no dataclasses (its memory budget)."""
    if not isinstance(history_text, str):
        return None
    try:
        doc = json.loads(history_text)
        for e in doc.get("executions") or []:
            if (e.get("a"), e.get("j"), e.get("jobsetUid")) == (a, j, jobset_uid):
                stopped = e.get("stopped")
                return stopped if isinstance(stopped, str) and is_timestamp(stopped) else None
    except (ValueError, AttributeError, TypeError):
        return None
    return None


def created_below_floor(*, pod_name: str, admission: int, floor: int, raised_at: str) -> Violation | None:
    """An ended pod judged by the floor as it stood when the pod was created: `floor` was set by a
    raise at `raised_at`, a second before the pod's creation or earlier (see controller.pod_rules)."""
    if admission >= floor:
        return None
    return Violation(
        "below-floor",
        f"pod {pod_name} had admission {admission}, below the floor {floor} raised at {raised_at} "
        "before the pod was created: A may have been lowered",
    )


def resumed_without_raise(*, pod_name: str, manager: str, time: str, raised_at: str | None) -> Violation:
    """A pod created after spec.suspend was set false by a writer other than a raise (and, in
    Kueue mode, with no admission of ours behind it): its execution runs with an A raised for an
    earlier one. Both times are the apiserver's."""
    since = f"the last raise at {raised_at}" if raised_at else "no raise"
    return Violation(
        "resumed-without-raise",
        f"pod {pod_name} started after spec.suspend was set false by {manager} at {time}, "
        f"not by a raise ({since}): its execution repeats an earlier one's A",
    )


# What the prologue reads from the trainer container's env (toolkit.wrap.dispatch_env).
PROLOGUE_INPUTS = (names.ENV_ADMISSION, names.ENV_RESTART, names.ENV_EPOCH_PREFIX, names.ENV_TOKEN_PREFIX)


def prologue_inputs(*, pod_name: str, containers: list) -> Violation | None:
    """A running trainer pod whose trainer container lacks the prologue's inputs runs the image's
    own command: no prologue, no DISPATCH_EPOCH (its runtime gave the TrainJob's spec.trainer to
    another replicated job, or to none)."""
    node = next((c for c in containers if isinstance(c, dict) and c.get("name") == names.TRAINER_CONTAINER), {})
    present = {e.get("name") for e in node.get("env") or [] if isinstance(e, dict)}
    missing = [name for name in PROLOGUE_INPUTS if name not in present]
    if not missing:
        return None
    return Violation(
        "missing-prologue",
        f"pod {pod_name}: its container {names.TRAINER_CONTAINER} has no {', '.join(missing)}: it runs without "
        "the prologue, so without DISPATCH_EPOCH (its runtime does not give the TrainJob's command to it)",
    )


def parse_floor(value: str | None) -> int | None:
    """The TrainJob's floor annotation; a malformed one reads as absent
    (the raise then starts from the patch, and a later raise rewrites it)."""
    if value is None:
        return None
    return parse_count(value)


def floor(value: str | None) -> Violation | None:
    """A floor annotation that is present but not a count was not written by
    dispatch (every raise writes a canonical decimal): report it, since A can
    no longer be checked against it. Absent is fine (nothing raised yet)."""
    if value is None or parse_count(value) is not None:
        return None
    return Violation(
        "invalid-floor",
        f"TrainJob annotation dispatch.phpboyscout.uk/admission-floor is {value!r}, "
        "not 0 or a decimal of at most 6 digits without a leading zero",
    )
