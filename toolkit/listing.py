"""`toolkit list`: the dispatch TrainJobs of one namespace or of all, one
row each, optionally only the flagged ones.

A row is computed from the TrainJob alone (`row`, pure): its state, how it
is admitted (plain or through Kueue), the A last written, how many
executions the controller recorded and the high-water mark of R, and the
foreign flag with its number of causes. No JobSet or pod is read, so a list
costs one paged request however many TrainJobs there are.

`--foreign` is a label query the apiserver answers
(`toolkit.flagmark.SELECTOR`), the same one `kubectl get trainjobs -l`
takes; other selectors are ANDed to it. TrainJobs that are not ours
(`marks.is_ours`) are never listed: nothing of ours acts on them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit import causes, flagmark, history, kube, marks, names, paths, raising

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Row:
    namespace: str
    name: str
    state: str  # "suspended" or "running"
    mode: str  # "kueue" (a queue-name label) or "plain"
    admission: int  # the A last written (0: never admitted)
    executions: int  # executions recorded in the history
    high_water: int  # the highest R recorded
    foreign: bool
    causes: int  # causes of the flag, kept and counted as dropped
    created: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def row(trainjob: Obj) -> Row:
    """Pure: the row of one TrainJob."""
    meta = trainjob.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    flag = causes.parse(annotations.get(names.FOREIGN_ANNOTATION), annotations.get(causes.DROPPED_ANNOTATION))
    recorded = history.of(trainjob)
    return Row(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        state="suspended" if raising.is_suspended(trainjob) else "running",
        mode="kueue" if names.KUEUE_QUEUE_LABEL in (meta.get("labels") or {}) else "plain",
        admission=raising.counts(trainjob).current,
        executions=len(recorded.executions) + recorded.dropped,
        high_water=recorded.high_water,
        foreign=flagmark.is_flagged(trainjob),
        causes=len(flag.kept) + flag.dropped,
        created=str(meta.get("creationTimestamp") or ""),
    )


def selector(*, foreign: bool, extra: str | None) -> str | None:
    """The label selector sent: the flag's, the caller's, both (ANDed), or none."""
    parts = [s for s in ((flagmark.SELECTOR if foreign else None), (extra or "").strip() or None) if s]
    return ",".join(parts) or None


def rows(client: kube.Client, *, namespace: str | None, foreign: bool = False,
         label_selector: str | None = None) -> list[Row]:
    """Our TrainJobs in `namespace` (None: every namespace), sorted by
    namespace and name."""
    found, _ = client.list(paths.TRAINJOB, namespace=namespace,
                           label_selector=selector(foreign=foreign, extra=label_selector))
    ours = [row(tj) for tj in found if marks.is_ours(tj)]
    return sorted(ours, key=lambda r: (r.namespace, r.name))
