"""The REST paths of the Kubernetes kinds the project reads and writes: one
copy for the shared client (toolkit.kube: the controller, the dispatcher) and the sidecar.

A `Resource` is the group, version and plural of a kind; `path` turns it,
a namespace, a name and a subresource into the URL path the apiserver
serves. Every segment is percent-quoted, so a value read from a pod's files
(the sidecar's namespace and name) can never add a segment of its own; a
valid Kubernetes name quotes to itself.

Standard library only, and no I/O: the sidecar imports this, and it pays
for every import in every training pod (tests/sidecar/test_sidecar_process.py
holds its import graph to that).
"""

from __future__ import annotations

import collections

from toolkit import names


# A named tuple, not a dataclass: dataclasses imports inspect (ast, dis, tokenize...), ~1.7 MB of
# RSS in the sidecar, which imports this module in every pod.
class Resource(collections.namedtuple("Resource", "group version plural kind namespaced", defaults=(True,))):
    __slots__ = ()
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{_segment(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{_segment(name)}"
        if sub:
            base += f"/{_segment(sub)}"
        return base


def _segment(value: str) -> str:
    # urllib.parse.quote(value, safe=""), written out: urllib.parse costs the sidecar ~0.5 MB of RSS in
    # every pod. Every byte but RFC 3986's unreserved characters is percent-encoded (UTF-8), so a name
    # can never add a path segment. tests/toolkit/test_paths.py holds it to quote's answers.
    return "".join(c if c in _UNRESERVED else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
                   for c in value)


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


TRAINJOB = Resource(names.TRAINER_GROUP, names.TRAINER_VERSION, "trainjobs", "TrainJob")
TRAINING_RUNTIME = Resource(names.TRAINER_GROUP, names.TRAINER_VERSION, "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIME = Resource(
    names.TRAINER_GROUP, names.TRAINER_VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime", False
)
JOBSET = Resource(names.JOBSET_GROUP, names.JOBSET_VERSION, "jobsets", "JobSet")
# Kueue v0.19 serves v1beta1 (deprecated) and v1beta2 (the storage version).
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
WORKLOAD = Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads", "Workload")
ADMISSION_CHECK = Resource(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", "AdmissionCheck", False)
CLUSTER_QUEUE = Resource(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", "ClusterQueue", False)
POD = Resource("", "v1", "pods", "Pod")
SECRET = Resource("", "v1", "secrets", "Secret")
CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")
JOB = Resource("batch", "v1", "jobs", "Job")
EVENT = Resource("", "v1", "events", "Event")
