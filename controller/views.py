"""What the controller's caches keep of each object: the views its informers store (their
`transform`, like client-go's), each the part its handlers and the detector read, nothing more.

Why: a cache holds every object of its kind in the scope it watches, for as long as the leader
leads. A Workload's or JobSet's spec holds every pod template, a trainer pod carries the whole
prologue in its command and often a large environment, and every object's managedFields names
each writer of each field; none of it is read here, and a cache of a thousand admitted
TrainJobs' pods held it all (bench/admission). A cached Workload or JobSet is only a key and a
status to this controller: a Workload's says whether to look, and it is read fresh before its
status is written; the JobSet rule reads the UID. A pod is read fresh before a flag, too.

The admission check starts from the cached Workload and TrainJob and writes from them (merge
patches preconditioned on their resourceVersion, `controller.writes`), so those two views keep
whole what those writes send whole: a Workload's status.admissionChecks, a TrainJob's
spec.runtimePatches. A TrainJob keeps what the raise reads (`toolkit.raising`): its metadata with,
of managedFields, only the raise's own entries' manager, operation and time (`raising.last_raise`),
and of its spec whether it is suspended, its runtime and its runtime patches.

All pure: an object in, a smaller copy out; the object given is never changed.
"""

from __future__ import annotations

from typing import Any

from toolkit import names

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


def metadata_only(obj: Obj) -> Obj:
    """Pure: OBJ's metadata without managedFields (a JobSet: the reset rule reads its UID and owner)."""
    return {k: v for k, v in without_managed_fields(obj).items() if k in ("apiVersion", "kind", "metadata")}


def workload_view(workload: Obj) -> Obj:
    """Pure: what the admission check reads of a Workload: its metadata without managedFields, its
    conditions' types and statuses, its admission checks whole (a Ready is written as the whole
    list) and the ClusterQueue that reserved its quota (a metric's label)."""
    view = metadata_only(workload)
    status = workload.get("status") or {}
    view["status"] = {
        "conditions": [{"type": c.get("type"), "status": c.get("status")}
                       for c in _list(status.get("conditions")) if isinstance(c, dict)],
        "admissionChecks": _list(status.get("admissionChecks")),
        "admission": {"clusterQueue": (status.get("admission") or {}).get("clusterQueue")},
    }
    return view


_TRAINJOB_SPEC = ("suspend", "runtimeRef", "runtimePatches")


def trainjob_view(trainjob: Obj) -> Obj:
    """Pure: what the admission check's raise reads of a TrainJob (see the module docstring)."""
    meta = trainjob.get("metadata") or {}
    view = metadata_only(trainjob)
    raises = [{k: e.get(k) for k in ("manager", "operation", "time")} for e in _list(meta.get("managedFields"))
              if isinstance(e, dict) and e.get("manager") == names.RAISE_FIELD_MANAGER]
    if raises:
        view["metadata"] = {**view["metadata"], "managedFields": raises}
    spec = trainjob.get("spec") or {}
    view["spec"] = {k: spec[k] for k in _TRAINJOB_SPEC if k in spec}
    return view
