"""What makes an object one of ours, whose it is, and whether a pod still
runs: one definition each, for the adapter, the controller and the CLI.

Why one module: the admission check, the detector and `release` each used
to carry their own copy of these predicates, and two copies of a rule drift
(a pod the detector judged and `release` ignored, or the reverse, is a false
foreign flag or a missed one).

- `is_ours(trainjob)`: the TrainJob carries a mark that only dispatch
  writes: our runtime-patch entry or the job-id annotation (both written by
  `toolkit start`), or the floor annotation (written by every raise). Any
  one is enough, so a reset that deletes our patch entry still leaves the
  TrainJob judged. A user's own TrainJob carries none of them, and nothing
  of ours may act on it.
- `owner_trainjob(obj)`: the name of the TrainJob in an object's
  ownerReferences (a Workload, a JobSet), or None; `owned_by(obj, trainjob)`:
  whether that reference names this TrainJob's UID (the name alone may be a
  deleted predecessor's).
- `is_live(pod)`: not terminating (no deletionTimestamp) and not finished
  (phase Succeeded or Failed). Only live pods are judged and only live pods
  block a release: a pod on its way out is not an execution any more.
- `is_trainer(pod)`: a pod of the trainer replicated job (`node`), the only
  one whose template carries A.

Pure: plain dicts in, plain values out; no I/O, standard library only.
"""

from __future__ import annotations

from typing import Any

from toolkit import names

Obj = dict[str, Any]

REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


def has_our_patch(trainjob: Obj) -> bool:
    return any(
        entry.get("manager") == names.PATCH_MANAGER
        for entry in (trainjob.get("spec") or {}).get("runtimePatches") or []
    )


def is_ours(trainjob: Obj | None) -> bool:
    """A TrainJob dispatch started (see the module docstring)."""
    if not trainjob:
        return False
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    return (
        has_our_patch(trainjob)
        or names.JOB_ID_ANNOTATION in annotations
        or names.FLOOR_ANNOTATION in annotations
    )


def owner_trainjob(obj: Obj) -> str | None:
    """The name of the TrainJob that owns `obj`, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "TrainJob" and str(ref.get("apiVersion", "")).startswith(f"{names.TRAINER_GROUP}/"):
            return str(ref.get("name"))
    return None


def owned_by(obj: Obj, trainjob: Obj) -> bool:
    """`obj` (a Workload, a JobSet) is owned by this very TrainJob: its ownerReferences name the
    TrainJob's UID, not only its name (a TrainJob deleted and created again under the same name
    is another object, and its predecessor's JobSet or Workload may linger until the garbage
    collector removes it)."""
    uid = (trainjob.get("metadata") or {}).get("uid")
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "TrainJob" and str(ref.get("apiVersion", "")).startswith(f"{names.TRAINER_GROUP}/"):
            return bool(uid) and ref.get("uid") == uid
    return False


def is_live(pod: Obj) -> bool:
    """Neither terminating nor finished."""
    meta = pod.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def is_trainer(pod: Obj) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(REPLICATED_JOB_LABEL) == names.TRAINER_REPLICATED_JOB
