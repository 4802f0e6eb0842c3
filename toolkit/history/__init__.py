"""A TrainJob's execution history and its high-water mark of R, as pure rules.

Why it exists: Events expire after an hour and `toolkit status` shows one
execution, so after a reset nobody could say which epochs had already been
used, nor what the next execution must exceed. The controller records every
execution it sees on the TrainJob itself (annotation
`dispatch.phpboyscout.uk/history`, JSON), where it lasts as long as the job
and survives any restart of the controller.

The parts, one job each:
- `stored`: what the annotation holds (the records, the high-water mark,
  the adoptions, the raises' floors and marks, the unsuspends seen), its
  bounds, its format and its byte budget, within which the history gives
  way (`store`, `make_room`): the one reader and writer of its text;
- `observations`: what a trainer pod says of its execution, and how the
  history records it (`observe`);
- `repeats`: the rules that find an execution repeating an earlier one's
  epoch (`repeat`, `repeat_by_creation`, `repeat_across_raise`,
  `repeat_across_unsuspend`, `repeat_after_stop`);
- `adoptions`: a person's adoption, the next raise's minimum A it sets and
  the pods it exempts (`adopt`, `adopted`).

Writes are never blind: `observe` and `adopt` return the new history, and
the caller writes it in one update preconditioned on the resourceVersion it
read (a 409 re-reads and recomputes).

This module is the history's one surface for its callers (the raise, the
adapter, the controller, the tests): `history.of(...)`,
`history.repeat(...)`. It holds no code, only the parts' public names, bound
here from the module that defines each. A deliberate exception to importing
modules, not names: every caller looks a rule up in one place, so a test that
takes a rule away (the identity model's) takes it away for every caller. The
parts import each other's modules, never this one.

No I/O: standard library and the other pure modules only.
"""

from __future__ import annotations

from toolkit.history import adoptions, observations, repeats, stored

# The stored record: its types, bounds and format, and its byte budget.
HISTORY_ANNOTATION = stored.HISTORY_ANNOTATION
FORMAT_VERSION = stored.FORMAT_VERSION
MINIMUM_ANNOTATION = stored.MINIMUM_ANNOTATION
MAX_EXECUTIONS = stored.MAX_EXECUTIONS
MAX_ADOPTIONS = stored.MAX_ADOPTIONS
MAX_FLOORS = stored.MAX_FLOORS
MAX_UNSUSPENDS = stored.MAX_UNSUSPENDS
REASON_LIMIT = stored.REASON_LIMIT
CAUSES_LIMIT = stored.CAUSES_LIMIT
Execution = stored.Execution
Adoption = stored.Adoption
History = stored.History
parse = stored.parse
render = stored.render
of = stored.of
unreadable_violation = stored.unreadable_violation
highest_admission = stored.highest_admission
with_floor = stored.with_floor

# What a pod says of its execution, and recording it.
Observation = observations.Observation
identity_of = observations.identity_of
from_pod = observations.from_pod
observe = observations.observe
with_unsuspend = observations.with_unsuspend
unsuspend_time = observations.unsuspend_time

# The rules of a repeated epoch.
recorded = repeats.recorded
repeat = repeats.repeat
repeat_across_raise = repeats.repeat_across_raise
repeat_across_unsuspend = repeats.repeat_across_unsuspend
repeat_after_stop = repeats.repeat_after_stop
repeat_by_creation = repeats.repeat_by_creation

# The byte budget.
BUDGET = stored.BUDGET
ours = stored.ours
room = stored.room
fit = stored.fit
store = stored.store
make_room = stored.make_room

# Adoptions.
AdoptRefused = adoptions.AdoptRefused
adopt = adoptions.adopt
adopted_at = adoptions.adopted_at
adopted = adoptions.adopted
