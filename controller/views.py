"""What the controller's caches keep of each object: the views its informers store (their
`transform`, like client-go's), each the part its handlers and the detector read, nothing more.

Why: a cache holds every object of its kind in the scope it watches, for as long as the leader
leads. A Workload's or JobSet's spec holds every pod template, a trainer pod carries the whole
prologue in its command and often a large environment, and every object's managedFields names
each writer of each field; none of it is read here, and a cache of a thousand admitted
TrainJobs' pods held it all (bench/admission). A cached Workload or JobSet is only a key and a
status to this controller: a Workload's says whether to look, and it is read fresh before its
status is written; the JobSet rule reads the UID. A pod is read fresh before a flag, too.

All pure: an object in, a smaller copy out; the object given is never changed.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def without_managed_fields(obj: Obj) -> Obj:
    """Pure: OBJ without metadata.managedFields (who wrote which field: never read here)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def names_only(obj: Obj) -> Obj:
    """Pure: OBJ's namespace and name, all the flagged gauge counts by."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("namespace", "name", "uid", "resourceVersion") if k in meta}}


def pod_view(pod: Obj) -> Obj:
    """Pure: what the detector reads of a pod: its metadata without managedFields, its status, and
    of its spec each container's name and its variables' names (whether the prologue's inputs are
    there), not their values. A trainer pod carries the whole prologue in its command and often a
    large environment: a cache of a thousand admitted TrainJobs' pods held them all (bench/admission)."""
    view = {k: v for k, v in without_managed_fields(pod).items() if k != "spec"}
    containers = (pod.get("spec") or {}).get("containers")
    if isinstance(containers, list):
        view["spec"] = {"containers": [
            {"name": c.get("name"), "env": [{"name": e.get("name")} for e in _list(c.get("env")) if isinstance(e, dict)]}
            for c in containers if isinstance(c, dict)]}
    return view


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def slim(obj: Obj) -> Obj:
    """Pure: OBJ without its spec and managedFields: the metadata and status the handlers read."""
    return {k: v for k, v in without_managed_fields(obj).items() if k != "spec"}
