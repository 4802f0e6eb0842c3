"""A sidecar's report, read: the claim it makes and the evidence the controller reads itself.

The sidecar cannot update the TrainJob, by design, so it reports a violation as a Warning Event
with reason `names.SIDECAR_VIOLATION_REASON` on the TrainJob, and the controller records it. A
report is a hint, never evidence: the training container runs with the pod's ServiceAccount, so
its code can create the same Event with any message. So the claim is only read here (its rule,
the pod it names, one bounded line of text), and what decides is `confirmed`: every violation
the controller's own reads of the TrainJob, the named pod and the JobSet show, each read
ignored unless it belongs to this TrainJob, so a report cannot borrow another TrainJob's
evidence. `detector.Detector.event` reads, then flags what this confirms, the claim kept beside
the cause (CONFIRMED). Pure: nothing here reads or writes the cluster.
"""

from __future__ import annotations

import re
from typing import Any

from toolkit import detect, marks, names
from controller import pod_rules

Obj = dict[str, Any]
# A claim kept in the flag is bounded like the sidecar's own message
# (sidecar/check.py); a forged one can be any length.
CLAIM_LIMIT = 1024
# The sidecar's message names its pod (sidecar/check.py `message`); its
# Event's reportingInstance does too, and is read first.
CONFIRMED = "(confirmed by the controller; the sidecar reported:"
_CLAIMED_POD = re.compile(r"\[seen by the sidecar of pod=(\S+)")


def claim_text(event: Obj) -> str:
    """The report's message as one bounded line (the flag is one cause a line)."""
    text = " ".join(str(event.get("message") or "").split())
    return text if len(text) <= CLAIM_LIMIT else text[: CLAIM_LIMIT - 3] + "..."


def claimed_rule(claim: str) -> str | None:
    """The rule key the sidecar's message leads with (`<rule>: <detail> ...`)."""
    head, sep, _ = claim.partition(": ")
    return head if sep and re.fullmatch(r"[a-z][a-z-]*", head) else None


def claimed_pod(event: Obj) -> str | None:
    instance = event.get("reportingInstance")
    if isinstance(instance, str) and instance:
        return instance
    found = _CLAIMED_POD.search(str(event.get("message") or ""))
    return found.group(1).rstrip("]") if found else None


def confirmed(*, trainjob: Obj, pod: Obj | None, jobset: Obj | None) -> list[detect.Violation]:
    """Pure: every violation the controller's own reads show for this
    TrainJob. `pod` is the pod a report named (None when it does not exist),
    `jobset` the TrainJob's JobSet (None when there is none); either is
    ignored unless it belongs to this TrainJob, so a report cannot borrow
    another TrainJob's evidence."""
    name = trainjob["metadata"]["name"]
    annotations = trainjob["metadata"].get("annotations") or {}
    recorded = annotations.get(names.JOBSET_UID_ANNOTATION)
    found: list[detect.Violation] = []

    def add(violation: detect.Violation | None) -> None:
        if violation is not None and violation not in found:
            found.append(violation)

    add(detect.floor(annotations.get(names.FLOOR_ANNOTATION)))
    if pod is not None and ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOBSET_NAME_LABEL) == name:
        for violation in pod_rules.judge(pod, trainjob):
            add(violation)
    if jobset is not None and marks.owned_by(jobset, trainjob) and not jobset["metadata"].get("deletionTimestamp"):
        add(detect.jobset_uid(recorded=recorded, seen=jobset["metadata"]["uid"]))
    return found
