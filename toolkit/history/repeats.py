"""The rules that find an execution repeating an earlier one's epoch.

Every legitimate boundary raises A or J, so a new execution's R is above
every earlier one and executions start in the order of their R; only a reset
breaks that. Each rule reads the history and one pod, and returns the
violation (`r-repeat`) or None; the controller's detector asks them in turn
and flags the first that answers.

- `repeat`: a pod of an execution not yet recorded whose R is at or below
  the high-water mark repeats an earlier execution's epoch (or goes back).
- `repeat_by_creation`: an execution that started after a recorded one
  whose R is not below its own, by the apiserver's creation times: it judges
  a pod seen at any time, running or ended, which the high-water rule cannot.
- `repeat_across_raise`, `repeat_across_unsuspend`, `repeat_after_stop`: one
  execution's pods on both sides of a raise, of an unsuspend by another
  writer, or of a stop: the same A, J and JobSet run again.

Times are the apiserver's, to the second, and a rule that flags on "B came
after A" where the two stamps may come from different apiserver replicas
allows the clock margin (`detect.after`, `detect.SKEW_SECONDS`).

No I/O: standard library and the other pure modules only.
"""

from __future__ import annotations

from toolkit import detect
from toolkit.history import stored


def recorded(history: stored.History, *, a: int, j: int, jobset_uid: str | None) -> bool:
    return any((e.a, e.j, e.jobset_uid) == (a, j, jobset_uid) for e in history.executions)


def repeat(history: stored.History, *, a: int, j: int, jobset_uid: str | None, pod: str) -> detect.Violation | None:
    """A pod of a new execution whose R is not above the mark."""
    r = a + j
    if recorded(history, a=a, j=j, jobset_uid=jobset_uid) or r > history.high_water:
        return None
    return detect.Violation(
        "r-repeat",
        f"pod {pod} runs A={a} J={j}, R {r}, not above the highest R {history.high_water} of an earlier "
        "execution: its epoch repeats or goes back",
    )


def _start(history: stored.History, *, a: int, j: int, jobset_uid: str | None, created: str | None) -> str | None:
    """The earliest creation time known of the execution (A, J, JobSet): its record's and this pod's."""
    own = [e.created for e in history.executions if (e.a, e.j, e.jobset_uid) == (a, j, jobset_uid)]
    return min(filter(None, (created, *own)), default=None)


def _latest(history: stored.History, *, a: int, j: int, jobset_uid: str | None, created: str | None) -> str | None:
    """The latest creation time known of the execution (A, J, JobSet): its record's and this pod's."""
    own = [e.latest or e.created for e in history.executions if (e.a, e.j, e.jobset_uid) == (a, j, jobset_uid)]
    return max(filter(None, (created, *own)), default=None)


def repeat_across_raise(history: stored.History, *, a: int, j: int, jobset_uid: str | None, created: str | None,
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


def repeat_across_unsuspend(history: stored.History, *, a: int, j: int, jobset_uid: str | None, created: str | None,
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


def repeat_after_stop(history: stored.History, *, a: int, j: int, jobset_uid: str | None, created: str | None,
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


def repeat_by_creation(history: stored.History, *, a: int, j: int, jobset_uid: str | None,
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
