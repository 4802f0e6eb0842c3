"""The raise of A (docs/adapter.md), as pure logic.

A raise reads a TrainJob and returns the object to write back: our runtime
patch entry carries `max(A in our patch, floor) + 1` and the floor
annotation carries the same value, in ONE object, so a single update
preconditioned on the resourceVersion read writes both or neither.

Invariants this module keeps:
- A never falls. The new value is computed from the largest of the patch,
  the floor and every A the history holds (the highest A a raise wrote,
  which every raise records there in the same update, its floors and its
  executions),
  so a patch rewritten lower, made unreadable or deleted, even with the
  floor annotation deleted too, cannot lower the next raise.
- Only a suspended TrainJob is raised. A pod reads A once when it starts, and
  Trainer's webhook refuses runtime-patch changes while the TrainJob runs;
  refusing here gives a clear error instead of a webhook rejection.
- The input is never mutated: `raised()` deep-copies, so a caller's cached
  object (an informer's) stays what the server said.
- Nothing here does I/O. The read-compute-write loops with the 409 retry are
  `toolkit.adapter.raise_admission`'s and the admission check's
  (`controller.writes`); a 409 there means "recompute from a fresh read",
  never "write the old result again".

`merge_patch_of` is what a raise writes as a JSON merge patch: the fields the
raise changed, each list sent whole (a merge patch replaces a list: our
runtime-patch entry goes with every other manager's entry as read), and the
resourceVersion read as its precondition, which is what makes sending a list
computed from a copy safe. It needs only the fields the raise reads, so a
cache's slimmed copy of a TrainJob can be raised without a fresh read.

An adoption (`toolkit adopt`, see `toolkit.history`) may leave a minimum
for the next A (annotation `admission-minimum`): the raise writes at least
that, and removes it in the same update, since the floor then holds it.

`record` is an optional marker of what the raise was for (the Kueue
controller writes the Workload admission it raised for, see
`controller.admission`). It goes in the same update as the raise.

When each floor was set: the raise's update is written under a field
manager of its own (`names.RAISE_FIELD_MANAGER`), so the apiserver stamps
that manager's managedFields entry with its own clock at every raise and at
nothing else (`last_raise`). The next raise moves that stamp, with the floor
it set, into the history (`history.floors`) before it is overwritten.
`floor_when_created` reads both: the highest floor set by a raise a second
or more before a given creation time. Stamps and creation times are the
apiserver's, to the second, so no client clock is trusted, and a pod created
within the clock margin of a raise (`detect.SKEW_SECONDS`: the replicas of the
apiserver may disagree by that much) is never judged by it (it may be older).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from toolkit import detect, history, names

Obj = dict[str, Any]

# Where A lives inside our runtime-patch entry (docs/toolkit.md).
_PATCH_PATH = ("trainingRuntimeSpec", "template", "spec", "replicatedJobs")
# The highest A the prologue accepts with J = 0 (R < 10^6).
MAX_ADMISSION = 999_999


class RaiseRefused(Exception):
    """The TrainJob cannot be raised now; the message names why."""


@dataclasses.dataclass(frozen=True)
class Counts:
    """A as our patch says it, the floor annotation, and what they give."""

    patch: int | None  # None: no patch entry, or A unreadable
    floor: int | None  # None: no floor annotation, or malformed
    minimum: int | None = None  # an adoption's minimum for the next A
    recorded: int = dataclasses.field(default=0, compare=False)  # the highest A the history holds

    @property
    def current(self) -> int:
        """The A a pod created now would get if the patch were honest:
        the larger of patch and floor (0 when neither is set), and never
        below an A the history holds."""
        return max(self.patch or 0, self.floor or 0, self.recorded)

    @property
    def next(self) -> int:
        return max(self.current + 1, self.minimum or 0)


def _our_patch(trainjob: Obj) -> Obj | None:
    for entry in (trainjob.get("spec") or {}).get("runtimePatches") or []:
        if entry.get("manager") == names.PATCH_MANAGER:
            return entry
    return None


def _node_annotations(patch: Obj) -> dict[str, str] | None:
    node: Any = patch
    for key in _PATCH_PATH:
        node = (node or {}).get(key)
    for rjob in node or []:
        if rjob.get("name") == names.TRAINER_REPLICATED_JOB:
            template = (((rjob.get("template") or {}).get("spec") or {}).get("template")) or {}
            return (template.get("metadata") or {}).get("annotations")
    return None


def patch_admission(trainjob: Obj) -> int | None:
    """A as written in our runtime patch, or None when absent or malformed."""
    patch = _our_patch(trainjob)
    if patch is None:
        return None
    annotations = _node_annotations(patch) or {}
    return detect.parse_count(annotations.get(names.ADMISSION_ANNOTATION))


def counts(trainjob: Obj) -> Counts:
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    return Counts(
        patch=patch_admission(trainjob),
        floor=detect.parse_floor(annotations.get(names.FLOOR_ANNOTATION)),
        minimum=detect.parse_count(annotations.get(history.MINIMUM_ANNOTATION)),
        recorded=history.highest_admission(history.of(trainjob)),
    )


def last_raise(trainjob: Obj) -> tuple[int, str] | None:
    """The floor annotation and the apiserver's time of the last raise that wrote it, or None."""
    floor = detect.parse_floor(((trainjob.get("metadata") or {}).get("annotations") or {}).get(names.FLOOR_ANNOTATION))
    for entry in (trainjob.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, dict) or entry.get("manager") != names.RAISE_FIELD_MANAGER:
            continue
        time = entry.get("time")
        if entry.get("operation") == "Update" and isinstance(time, str) and detect.is_timestamp(time) and floor:
            return floor, time
    return None


def unsuspended_by(trainjob: Obj) -> tuple[str, str] | None:
    """Who last set spec.suspend false, when that was not a raise: the field manager the
    apiserver records as owning spec.suspend and the apiserver's time of its entry. None when the
    TrainJob is suspended, when our raise's manager owns the field (plain mode's open and release
    unsuspend in the raise's own update), or when the apiserver keeps no owner of it."""
    if is_suspended(trainjob):
        return None
    owners: list[tuple[str, str]] = []
    for entry in (trainjob.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, dict) or entry.get("subresource"):
            continue
        spec = ((entry.get("fieldsV1") or {}).get("f:spec")) or {}
        time = entry.get("time")
        if isinstance(spec, dict) and "f:suspend" in spec and isinstance(time, str) and detect.is_timestamp(time):
            owners.append((str(entry.get("manager") or "?"), time))
    if not owners or any(manager == names.RAISE_FIELD_MANAGER for manager, _ in owners):
        return None
    return max(owners, key=lambda owner: owner[1])


def unsuspend_seen(trainjob: Obj) -> tuple[str, int, str] | None:
    """The TrainJob's last unsuspend by a writer other than a raise (`unsuspended_by`) as the history
    keeps it: (field manager, the TrainJob's generation, the apiserver's time of that manager's
    entry). The time is that manager's last write to any field it owns, so a later write of the same
    manager to a label moves it; the generation moves only with the spec. The history keeps the
    earliest time seen for one (manager, generation) (`history.unsuspend_time`)."""
    writer = unsuspended_by(trainjob)
    generation = (trainjob.get("metadata") or {}).get("generation")
    if writer is None or type(generation) is not int:
        return None
    return writer[0], generation, writer[1]


def unsuspended_at(trainjob: Obj, recorded: history.History | None = None) -> tuple[str, str] | None:
    """`unsuspended_by`, its time the earliest known for this unsuspend (`unsuspend_seen`)."""
    seen = unsuspend_seen(trainjob)
    if seen is None:
        return unsuspended_by(trainjob)
    recorded = history.of(trainjob) if recorded is None else recorded
    return seen[0], history.unsuspend_time(recorded, manager=seen[0], generation=seen[1], time=seen[2])


def raises(trainjob: Obj, recorded: history.History | None = None) -> list[tuple[int, str]]:
    """Every raise known, as (the floor it set, the apiserver's time of it): the history's and the last.
    `recorded`: the TrainJob's history, when the caller has read it already."""
    recorded = history.of(trainjob) if recorded is None else recorded
    return [*recorded.floors, *filter(None, [last_raise(trainjob)])]


def floor_when_created(trainjob: Obj, created: str | None) -> tuple[int, str] | None:
    """The highest floor a raise set more than the clock margin (`detect.SKEW_SECONDS`) before
    `created` (an apiserver timestamp), with the time of that raise; None when no raise is known to
    be earlier."""
    if not created or not detect.is_timestamp(created):
        return None
    # More than the clock margin before: a pod created just before a raise, stamped by a replica
    # whose clock is ahead, must not be judged by the floor that raise set.
    earlier = [(floor, time) for floor, time in raises(trainjob) if detect.after(created, time)]
    return max(earlier, default=None)


def is_suspended(trainjob: Obj) -> bool:
    return bool((trainjob.get("spec") or {}).get("suspend"))


def patch_entry(admission: int) -> Obj:
    """Our runtime-patch entry setting A on the `node` pod template."""
    return {
        "manager": names.PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": names.TRAINER_REPLICATED_JOB,
                            "template": {
                                "spec": {
                                    "template": {
                                        "metadata": {
                                            "annotations": {
                                                names.ADMISSION_ANNOTATION: str(admission)
                                            }
                                        }
                                    }
                                }
                            },
                        }
                    ]
                }
            }
        },
    }


def _set_patch_admission(spec: Obj, admission: int) -> None:
    """Write A into our entry, keeping the rest of the entry (and every other
    manager's entry) as it was; rebuild the path where it is missing."""
    patches = spec.get("runtimePatches") or []
    spec["runtimePatches"] = patches
    entry = next((p for p in patches if p.get("manager") == names.PATCH_MANAGER), None)
    if entry is None:
        patches.append(patch_entry(admission))
        return
    node: Obj = entry
    for key in _PATCH_PATH[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    rjobs = node.get(_PATCH_PATH[-1]) or []
    node[_PATCH_PATH[-1]] = rjobs
    rjob = next((r for r in rjobs if r.get("name") == names.TRAINER_REPLICATED_JOB), None)
    if rjob is None:
        rjob = {"name": names.TRAINER_REPLICATED_JOB}
        rjobs.append(rjob)
    cursor: Obj = rjob
    for key in ("template", "spec", "template", "metadata", "annotations"):
        if not isinstance(cursor.get(key), dict):
            cursor[key] = {}
        cursor = cursor[key]
    cursor[names.ADMISSION_ANNOTATION] = str(admission)


def raised(
    trainjob: Obj,
    *,
    unsuspend: bool = False,
    record: tuple[str, str] | None = None,
) -> tuple[Obj, int]:
    """The TrainJob to write back with A raised, and the new A.

    `unsuspend` sets spec.suspend false in the same object (plain mode's
    Open and Release). `record` is an extra (annotation, value) written in
    the same object. Raises RaiseRefused for a running TrainJob or at the
    bound of A.
    """
    name = (trainjob.get("metadata") or {}).get("name", "?")
    if not is_suspended(trainjob):
        raise RaiseRefused(
            f"TrainJob {name}: spec.suspend is false; A is only raised while the TrainJob is suspended"
        )
    new = counts(trainjob).next
    if new > MAX_ADMISSION:
        raise RaiseRefused(
            f"TrainJob {name}: admission would be {new}, above the bound {MAX_ADMISSION} (R < 10^6)"
        )
    out = copy.deepcopy(trainjob)
    spec = out.setdefault("spec", {})
    _set_patch_admission(spec, new)
    meta = out.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    meta["annotations"] = annotations
    annotations[names.FLOOR_ANNOTATION] = str(new)
    annotations.pop(history.MINIMUM_ANNOTATION, None)
    recorded = history.of(trainjob)
    if not recorded.unreadable:  # an unreadable one is kept as found
        previous = last_raise(trainjob)
        if previous is not None:
            recorded = history.with_floor(recorded, floor=previous[0], time=previous[1])
        recorded = dataclasses.replace(recorded, raised=max(recorded.raised, new))
        history.store(annotations, recorded)  # within its room; the raise goes out even past it
    # A raise that is not for a Workload admission (open, release) leaves no marker behind that a
    # later pass of the admission check could take for its own raise.
    annotations.pop(names.RAISED_FOR_ANNOTATION, None)
    if record is not None:
        annotations[record[0]] = record[1]
    if unsuspend:
        spec["suspend"] = False
    return out, new


def merge_diff(old: Obj, new: Obj) -> Obj:
    """Pure: the JSON merge patch (RFC 7386) that turns OLD into NEW: a key added or changed is
    sent, a key removed is sent as null, and a list or value that differs is sent whole."""
    patch: Obj = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key, _ABSENT)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_diff(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    return patch


_ABSENT = object()


def merge_patch_of(before: Obj, after: Obj) -> Obj:
    """Pure: what writing AFTER (a raise of BEFORE, `raised`) sends as a JSON merge patch,
    preconditioned on BEFORE's metadata.resourceVersion (a 409 when the TrainJob moved on since)."""
    version = (before.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise ValueError("a raise is preconditioned on the resourceVersion read: the copy has none")
    patch = merge_diff(before, after)
    patch.setdefault("metadata", {})["resourceVersion"] = version
    return patch
