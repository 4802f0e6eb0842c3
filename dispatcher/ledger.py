"""The in-flight ledger and the limiter: which driver Jobs are unfinished (pure).

The dispatcher may claim only while `unfinished() < max_inflight`. The
ledger is owned by the main loop alone (no lock): the informer's events and
the create results are applied to it there, in order.

An entry is unfinished from the moment a claim is taken (`reserve`, before
the create is even sent, so concurrent creates cannot overshoot the cap)
until its Job is seen finished (Complete or Failed) or deleted. The slot is
released on finish OR delete: a Job deleted before it finished (by a person,
by a namespace teardown, or by TTL after a finish we missed) must not hold a
slot forever (the most-reported bug of the closest peer).

A Job whose driver never started (see `app` and the start deadline) is
`expire`d: its report is made then, and the Job is deleted to free the slot.
The slot stays taken until the delete is seen, so the cap holds; that
DELETED is not a second "vanished" death. So is a Job found without its
token Secret (its creator died between the two creates): it gets a
tombstone and is deleted, and that DELETED is not a death either.

`secret_ok` says this process has seen to the Job's Secret (written it, or
read it back); a Job seen unfinished without it, and with no create of its
own in hand here (`start_create` .. `end_create`, kept apart from the entry:
a create outlives a Job deleted under it), is `unchecked`, and the main loop
checks its Secret once.

Relists: `sync` replaces what the informer knew with a full list. An entry
created after the list began cannot be in it and is kept; an entry created
before the list began and absent from it is gone (its DELETED event was
missed) and is released. The clock is the caller's monotonic clock.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any

from dispatcher import jobspec, starts

Obj = dict[str, Any]


class Phase(enum.Enum):
    CREATING = "creating"  # claimed; the create has not been confirmed yet
    ACTIVE = "active"  # the Job exists and has not finished
    COMPLETE = "complete"
    FAILED = "failed"


UNFINISHED = (Phase.CREATING, Phase.ACTIVE)


@dataclasses.dataclass
class Entry:
    name: str
    job_id: str
    phase: Phase
    since: float  # monotonic time of the reservation or of the first sighting
    uid: str = ""
    seen: bool = False  # observed through the informer (list or watch)
    expired: bool = False  # past the start deadline: reported, and its delete sent
    created: float | None = None  # the Job's creationTimestamp (seconds since the epoch), once seen
    secret_ok: bool = False  # its token Secret was written or read back here


@dataclasses.dataclass(frozen=True)
class Change:
    """What the main loop must act on after applying an event."""

    kind: str  # "failed": a Job failed; "vanished": a Job was deleted before it finished
    name: str
    job_id: str
    job: Obj | None


class Ledger:
    def __init__(self, *, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self._entries: dict[str, Entry] = {}
        self._unfinished = 0
        self._creating: set[str] = set()  # Job names whose create is in hand

    # -- reading ------------------------------------------------------------

    def unfinished(self) -> int:
        return self._unfinished

    def free(self) -> int:
        return max(0, self.max_inflight - self._unfinished)

    def get(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def __len__(self) -> int:
        return len(self._entries)

    def unchecked(self, name: str) -> bool:
        """An unfinished Job seen here whose Secret nobody here has seen to (created by a process now gone)."""
        entry = self._entries.get(name)
        return (entry is not None and entry.phase is Phase.ACTIVE and entry.seen and not entry.secret_ok
                and not entry.expired and name not in self._creating)

    def create_in_hand(self, name: str) -> bool:
        return name in self._creating

    def oldest_age(self, *, now: float, wall: float) -> float:
        """Seconds the oldest unfinished, unexpired Job has existed (0.0 if none).

        Its creationTimestamp against the wall clock `wall` once seen; before that, the time since
        its reservation on the monotonic clock `now`. No driver pod can have waited longer than
        its Job has existed, so the start check need not look while this is under the deadline.
        """
        oldest = 0.0
        for entry in self._entries.values():
            if entry.phase not in UNFINISHED or entry.expired:
                continue
            age = wall - entry.created if entry.created is not None else now - entry.since
            oldest = max(oldest, age)
        return oldest

    # -- writing ------------------------------------------------------------

    def _set(self, entry: Entry, phase: Phase) -> None:
        self._unfinished += (phase in UNFINISHED) - (entry.phase in UNFINISHED)
        entry.phase = phase

    def _drop(self, name: str) -> Entry | None:
        entry = self._entries.pop(name, None)
        if entry is not None and entry.phase in UNFINISHED:
            self._unfinished -= 1
        return entry

    def reserve(self, *, name: str, job_id: str, now: float) -> bool:
        """Take a slot for a claimed run; False if the Job is already known (a claim offered again)."""
        if name in self._entries:
            return False
        self._entries[name] = Entry(name=name, job_id=job_id, phase=Phase.CREATING, since=now)
        self._unfinished += 1
        return True

    def start_create(self, name: str) -> None:
        """A create (of the Job, or of the Secret of a known one) is submitted for it."""
        self._creating.add(name)

    def end_create(self, name: str) -> None:
        """The create's answer is back (whatever it was)."""
        self._creating.discard(name)

    def created(self, name: str, *, uid: str, now: float) -> None:
        """The create (or an AlreadyExists) confirmed the Job exists, at `now`."""
        entry = self._entries.get(name)
        if entry is not None and entry.phase is Phase.CREATING:
            entry.uid = entry.uid or uid
            if not entry.seen:
                # A list that began before this moment may not hold it yet.
                entry.since = now
            self._set(entry, Phase.ACTIVE)

    def secret_confirmed(self, name: str) -> None:
        """The Job's Secret exists and serves it (written by the create here, or read back)."""
        entry = self._entries.get(name)
        if entry is not None:
            entry.secret_ok = True

    def abandon(self, name: str) -> None:
        """The create failed for good: release the reservation."""
        entry = self._entries.get(name)
        if entry is not None and entry.phase is Phase.CREATING and not entry.seen:
            self._drop(name)

    def expire(self, name: str) -> bool:
        """Mark an unfinished Job whose driver never started; False if it is not one (or already marked)."""
        entry = self._entries.get(name)
        if entry is None or entry.phase is not Phase.ACTIVE or entry.expired:
            return False
        entry.expired = True
        return True

    def unexpire(self, name: str) -> None:
        """The expiry could not be carried out (its delete never went through): judge the Job again."""
        entry = self._entries.get(name)
        if entry is not None:
            entry.expired = False

    def observe(self, event_type: str, job: Obj, *, now: float) -> list[Change]:
        """Apply one watch event (ADDED, MODIFIED, DELETED)."""
        meta = job.get("metadata") or {}
        name = str(meta.get("name"))
        job_id = jobspec.job_id_of(job) or ""
        if event_type == "DELETED":
            entry = self._drop(name)
            if entry is not None and entry.phase in UNFINISHED and not entry.expired:
                return [Change("vanished", name, entry.job_id or job_id, job)]
            return []
        entry = self._entries.get(name)
        if entry is None:
            entry = Entry(name=name, job_id=job_id, phase=Phase.ACTIVE, since=now)
            self._entries[name] = entry
            self._unfinished += 1
        entry.seen = True
        if entry.created is None:
            entry.created = starts.timestamp(meta.get("creationTimestamp"))
        entry.uid = str(meta.get("uid") or entry.uid)
        entry.job_id = entry.job_id or job_id
        state = jobspec.finished(job)
        if state is None:
            if entry.phase is Phase.CREATING:
                self._set(entry, Phase.ACTIVE)
            return []
        phase = Phase.COMPLETE if state == "Complete" else Phase.FAILED
        if entry.phase is phase:
            return []
        self._set(entry, phase)
        if phase is Phase.FAILED and not entry.expired:  # an expired Job was reported when it expired
            return [Change("failed", name, entry.job_id, job)]
        return []

    def sync(self, jobs: Iterable[Obj], *, list_started: float, now: float) -> list[Change]:
        """Apply a full list taken at `list_started` (see the module docstring)."""
        changes: list[Change] = []
        listed: set[str] = set()
        for job in jobs:
            listed.add(str((job.get("metadata") or {}).get("name")))
            changes.extend(self.observe("MODIFIED", job, now=now))
        for name, entry in list(self._entries.items()):
            if name in listed or entry.since >= list_started:
                continue
            if entry.phase is Phase.CREATING and not entry.seen:
                continue  # its create is still in hand; the create's answer decides
            self._drop(name)
            if entry.phase in UNFINISHED and not entry.expired:
                changes.append(Change("vanished", name, entry.job_id, None))
        return changes
