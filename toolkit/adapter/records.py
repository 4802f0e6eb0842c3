"""What the adapter and the controller both record: the foreign flag, the JobSet UID, the history.

Detection, not prevention: flagging foreign only adds annotations, a label
and an Event (`flag_foreign`); nothing here stops, suspends or deletes a
workload because of a detected reset. Only a person's `adopt` clears the
flag, and it keeps the causes in the history.

- The JobSet's UID is recorded the first time it is seen
  (`record_jobset_uid`); a different one later is the jobset-uid violation,
  flagged (`check_jobset`). The controller's detector, open, release and
  status all record it the same way.
- What a pod shows of its execution is recorded in the history
  (`record_execution`, the controller's), within the history's room.

Every write is one update of our annotations preconditioned on the TrainJob
read (`trainjobs.write_annotations`), within the byte budget
(`history.BUDGET`): the flag goes first, and the history gives way to it.
"""

from __future__ import annotations

from typing import Any

from toolkit import causes, detect, flagmark, history, kube, marks, names, paths
from toolkit.adapter import trainjobs

Obj = dict[str, Any]


def check_jobset(client: kube.Client, *, namespace: str, name: str, jobset: Obj | None,
                 component: str = trainjobs.COMPONENT) -> str | None:
    """Record the JobSet's UID the first time it is seen (docs/adapter.md, by the
    adapter as by the controller); a different one is flagged foreign. The
    cause, or None."""
    if jobset is None or (jobset.get("metadata") or {}).get("deletionTimestamp"):
        return None
    violation = record_jobset_uid(client, namespace=namespace, name=name, uid=jobset["metadata"]["uid"])
    if violation is None:
        return None
    flag_foreign(client, namespace=namespace, name=name, violation=violation, component=component)
    return violation.detail


def flag_foreign(
    client: kube.Client,
    *,
    namespace: str,
    name: str,
    violation: detect.Violation,
    component: str = trainjobs.COMPONENT,
) -> bool:
    """Keep the cause detail on the TrainJob and emit a Warning Event.

    Each cause is written and announced once (`toolkit.causes`: whole lines,
    bounded, the dropped ones counted once), with the label that finds it
    (`toolkit.flagmark`) in the same update. Only the flag changes; the
    workload is left running. True when the cause was new.

    Within the byte budget (`history.BUDGET`): the flag goes first, so a
    history past its room is shrunk in the same update (`history.make_room`),
    and a cause that does not fit the room left is counted as dropped. When
    the apiserver refuses even that (others' annotations fill the object),
    the label alone is written and the Warning Event still goes out: a flag
    is never lost.
    """

    def compute(trainjob: Obj) -> tuple[Obj | None, Obj | None]:
        annotations = trainjob["metadata"].get("annotations") or {}
        trainjob["metadata"]["annotations"] = annotations
        current = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
        history.make_room(annotations)
        flag_keys = (names.FOREIGN_ANNOTATION, causes.DROPPED_ANNOTATION)
        room = (history.BUDGET - history.ours(annotations, without=flag_keys) - sum(map(len, flag_keys))
                - causes.DROPPED_MOST)
        added = causes.add(current, violation.detail, limit=min(causes.LIMIT, room))
        if added is None:
            if flagmark.needs_label(trainjob):  # flagged without the label: label it, announce nothing again
                flagmark.label(trainjob)
                return trainjob, None
            return None, None
        flagmark.write(trainjob, added)
        return trainjob, trainjob

    def label_only(trainjob: Obj) -> tuple[Obj | None, Obj]:
        if flagmark.is_labelled(trainjob):
            return None, trainjob
        flagmark.label(trainjob)
        return trainjob, trainjob

    try:
        flagged, _ = trainjobs.write_annotations(client, namespace=namespace, name=name, compute=compute)
    except trainjobs.AnnotationsRefused:
        # The causes cannot be kept on the object: the label and the Event carry the flag.
        try:
            flagged, _ = client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=label_only)
        except kube.NotFound:
            return False
        client.warn(involved=flagged, reason=names.FOREIGN_REASON,
                    message=f"{causes.fold(violation.detail)} (not kept on the TrainJob: its annotations are full)",
                    component=component)
        return True
    except kube.NotFound:
        return False
    if flagged is None:
        return False
    client.warn(involved=flagged, reason=names.FOREIGN_REASON, message=causes.fold(violation.detail),
                component=component)
    return True


def record_jobset_uid(client: kube.Client, *, namespace: str, name: str, uid: str,
                      first: Obj | None = None) -> detect.Violation | None:
    """Record the JobSet UID the first time it is seen; a different one later
    is the jobset-uid violation (returned, for the caller to flag). `first`: the
    TrainJob as the caller just read it from the server (saves the read)."""

    def compute(trainjob: Obj) -> tuple[Obj | None, detect.Violation | None]:
        annotations = trainjob["metadata"].get("annotations") or {}
        recorded = annotations.get(names.JOBSET_UID_ANNOTATION)
        if recorded:
            return None, detect.jobset_uid(recorded=recorded, seen=uid)
        annotations[names.JOBSET_UID_ANNOTATION] = uid
        trainjob["metadata"]["annotations"] = annotations
        return trainjob, None

    try:
        violation, _ = trainjobs.write_annotations(client, namespace=namespace, name=name, compute=compute,
                                                   first=first)
    except kube.NotFound:
        return None
    return violation


def record_execution(client: kube.Client, *, namespace: str, name: str, observation: history.Observation,
                     first: Obj | None = None) -> bool:
    """Record what a pod showed of its execution (`history.observe`), in one
    update preconditioned on the TrainJob read; nothing is written when it
    adds nothing. True when written. The history is written within its room
    (`history.store`); `trainjobs.AnnotationsRefused` when even the least history does
    not fit, or the apiserver refuses the write."""

    def compute(trainjob: Obj) -> tuple[Obj | None, bool]:
        if not marks.is_ours(trainjob):
            return None, False
        if history.of(trainjob).unreadable:
            return None, False  # kept as found: the detector flags it (history.unreadable_violation)
        new = history.observe(history.of(trainjob), observation)
        if new is None:
            return None, False
        annotations = trainjob["metadata"].get("annotations") or {}
        if not history.store(annotations, new):
            raise trainjobs.refused(namespace=namespace, name=name, trainjob=trainjob,
                                    detail="our other annotations leave the history no room")
        trainjob["metadata"]["annotations"] = annotations
        return trainjob, True

    try:
        written, _ = trainjobs.write_annotations(client, namespace=namespace, name=name, compute=compute,
                                                 first=first)
    except kube.NotFound:
        return False
    return written
