"""The verdict for one pod: pure, no I/O.

`Seen` is everything one check looked at: the pod's own values (from the
Downward API) and the TrainJob's and JobSet's (from the two reads). The rules
are `toolkit.detect`, the same functions the controller applies, so the two
can never disagree on what a violation is or how its cause is worded; this
module only gathers the inputs and words the Event message around them.
"""

from __future__ import annotations

import collections

from toolkit import detect, names

# core/v1 Event messages are not length-checked by the apiserver, but
# events.k8s.io caps a note at 1 kB and readers truncate: stay under it.
MESSAGE_LIMIT = 1024
_VALUE_LIMIT = 80  # a seen value quoted in the message; a malformed one may be long


# Named tuples, not dataclasses: dataclasses imports inspect (ast, dis, tokenize...), ~1.7 MB of
# RSS in every pod (bench/sidecar).
class Seen(collections.namedtuple("Seen", "pod admission restart floor recorded_uid jobset_uid stopped",
                                  defaults=(None,))):
    __slots__ = ()
    pod: str
    admission: str | None  # pod annotation; None when absent
    restart: str | None  # pod label jobset.sigs.k8s.io/restart-attempt
    floor: str | None  # TrainJob annotation
    recorded_uid: str | None  # TrainJob annotation dispatch.phpboyscout.uk/jobset-uid
    jobset_uid: str | None  # the pod's JobSet; None when it could not be learnt
    stopped: str | None  # when the TrainJob's history records this pod's execution stopped; None: not


def violations(seen: Seen) -> list[detect.Violation]:
    """Every rule the pod breaks, in a stable order (empty when ok)."""
    found = []
    bad_floor = detect.floor(seen.floor)
    if bad_floor is not None:
        found.append(bad_floor)
    pod = detect.pod(pod_name=seen.pod, admission=seen.admission, restart=seen.restart,
                     floor=detect.parse_floor(seen.floor))
    if pod is not None:
        found.append(pod)
    if seen.jobset_uid is not None:
        uid = detect.jobset_uid(recorded=seen.recorded_uid, seen=seen.jobset_uid)
        if uid is not None:
            found.append(uid)
    a, j = detect.parse_count(seen.admission), detect.parse_count(seen.restart)
    if pod is None and seen.stopped is not None and a is not None and j is not None:
        # This pod starts in an execution whose pods were already being stopped: resumed without a
        # new admission (a suspend by hand undone by Kueue, an unsuspend by hand while evicted).
        # Its own creation time is not in the Downward API; the controller confirms by it.
        found.append(detect.resumed_after_stop(a=a, j=j, created=None, stopped=seen.stopped))
    return found


def _shown(value: str | None) -> str:
    if value is None:
        return "absent"
    text = repr(value)
    return text if len(text) <= _VALUE_LIMIT else text[:_VALUE_LIMIT - 4] + "...'"


def message(violation: detect.Violation, seen: Seen) -> str:
    """The Event message: rule key, the shared cause detail, then what was seen.

    The controller keeps this whole text as the foreign cause, so it leads
    with the rule and the detail and ends with the values."""
    values = (f"pod={seen.pod} admission={_shown(seen.admission)} restart-attempt={_shown(seen.restart)} "
              f"floor={_shown(seen.floor)} jobset-uid={_shown(seen.jobset_uid)} "
              f"recorded-jobset-uid={_shown(seen.recorded_uid)}")
    text = f"{violation.rule}: {violation.detail} [seen by the sidecar of {values}]"
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 3] + "..."


def seen_from(*, pod_name: str, labels: dict[str, str], annotations: dict[str, str],
              trainjob: dict[str, object], jobset_uid: str | None) -> Seen:
    meta = trainjob.get("metadata")
    tj_annotations = (meta.get("annotations") if isinstance(meta, dict) else None) or {}
    if not isinstance(tj_annotations, dict):
        tj_annotations = {}
    floor = tj_annotations.get(names.FLOOR_ANNOTATION)
    recorded = tj_annotations.get(names.JOBSET_UID_ANNOTATION)
    a = detect.parse_count(annotations.get(names.ADMISSION_ANNOTATION))
    j = detect.parse_count(labels.get(names.RESTART_LABEL))
    stopped = (None if a is None or j is None else
               detect.stopped_in_history(tj_annotations.get(names.HISTORY_ANNOTATION), a=a, j=j, jobset_uid=jobset_uid))
    return Seen(
        pod=pod_name,
        admission=annotations.get(names.ADMISSION_ANNOTATION),
        restart=labels.get(names.RESTART_LABEL),
        floor=floor if isinstance(floor, str) else None,
        recorded_uid=recorded if isinstance(recorded, str) else None,
        jobset_uid=jobset_uid,
        stopped=stopped,
    )
