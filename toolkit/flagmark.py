"""The foreign flag as it is written on a TrainJob: the cause annotations
and a label, always together.

The causes live in annotations (`toolkit.causes`: whole lines, bounded), which
a person reads but no selector can find. So every write that sets the flag
also sets the label `dispatch.phpboyscout.uk/foreign=true`, and the write that
clears it (`toolkit adopt`) removes both, in the same update. That makes the
flagged TrainJobs a label query away, for anyone and for the controller's
own filtered watch:

    kubectl get trainjobs -A -l dispatch.phpboyscout.uk/foreign=true
    toolkit list -A --foreign

Invariant: on every object this module writes, the label is present exactly
when `is_flagged` is true. A TrainJob flagged by a writer that knew no label
gets it the next time its flag is written (`needs_label`), without a second
Event. The label alone is a flag too: when the apiserver refuses even the
bounded causes (the object's annotations are full), the label still goes
out (`toolkit.adapter.flag_foreign`), with the cause in a Warning Event, so
a flag is never lost.

Pure: plain dicts in and out, no I/O.
"""

from __future__ import annotations

from typing import Any

from toolkit import causes, names

Obj = dict[str, Any]

LABEL = names.FOREIGN_LABEL
VALUE = "true"
# The label selector of the flagged TrainJobs.
SELECTOR = f"{LABEL}={VALUE}"


def is_flagged(trainjob: Obj) -> bool:
    """Flagged: a cause kept or one counted as dropped, or the label (a flag whose causes the
    apiserver could not take)."""
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(names.FOREIGN_ANNOTATION) or annotations.get(causes.DROPPED_ANNOTATION)
                or is_labelled(trainjob))


def is_labelled(trainjob: Obj) -> bool:
    return ((trainjob.get("metadata") or {}).get("labels") or {}).get(LABEL) == VALUE


def needs_label(trainjob: Obj) -> bool:
    """Flagged but not (or wrongly) labelled."""
    return is_flagged(trainjob) and not is_labelled(trainjob)


def write(trainjob: Obj, flag: causes.Causes) -> None:
    """Set the causes and the label on `trainjob` (in place)."""
    meta = trainjob.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    foreign, dropped = causes.render(flag)
    if foreign:
        annotations[names.FOREIGN_ANNOTATION] = foreign
    if dropped is not None:
        annotations[causes.DROPPED_ANNOTATION] = dropped
    meta["annotations"] = annotations
    label(trainjob)


def label(trainjob: Obj) -> None:
    """Set the label alone (the causes are there already)."""
    meta = trainjob.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), LABEL: VALUE}


def clear(trainjob: Obj) -> None:
    """Remove the causes and the label from `trainjob` (in place)."""
    meta = trainjob.setdefault("metadata", {})
    for key in (names.FOREIGN_ANNOTATION, causes.DROPPED_ANNOTATION):
        (meta.get("annotations") or {}).pop(key, None)
    (meta.get("labels") or {}).pop(LABEL, None)
