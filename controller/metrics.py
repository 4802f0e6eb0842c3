"""The controller's Prometheus metrics: what an SRE alerts on, named and typed
by Prometheus's conventions (a counter ends in `_total`, a duration is in
seconds and ends in `_seconds`, a 0/1 state is a gauge, an `_info` gauge is 1
and carries its facts as labels).

| metric | type | labels | meaning |
| --- | --- | --- | --- |
| `dispatch_build_info` | gauge (1) | version, revision | the running build |
| `dispatch_leader_election_status` | gauge | lease | 1 while this replica holds the Lease, else 0 |
| `dispatch_flagged_trainjobs` | gauge | namespace | TrainJobs flagged foreign now (leader only) |
| `dispatch_reconcile_errors_total` | counter | kind | steps that failed and were retried |
| `dispatch_check_ready_seconds` | histogram | cluster_queue | a Workload's wait on our check: first sight of its reservation to Ready |
| `dispatch_workloads_awaiting_ready` | gauge | | Workloads waiting on our check now |
| `dispatch_raises_total` | counter | | A raised on a TrainJob |
| `dispatch_conflicts_retried_total` | counter | | 409s re-read and recomputed |
| `dispatch_foreign_flags_total` | counter | rule | causes flagged, by rule |
| `dispatch_sidecar_reports_total` | counter | outcome | sidecar reports, confirmed or not |
| `dispatch_api_requests_total` | counter | | Kubernetes API requests sent |

plus the process's own (`process_*`: CPU, memory, file descriptors, start
time) and the runtime's (`python_info`, `python_gc_*`), from
prometheus_client's collectors registered on a registry of our own: the
same series its default registry gives, without global state, so two
controllers in one test process do not collide.

`dispatch_flagged_trainjobs` is read from a watch of TrainJobs filtered by
the flag's label (`toolkit.flagmark.SELECTOR`), which only the leader runs;
a standby exports no series of it, so a sum over replicas counts each
TrainJob once. A namespace whose last flag is cleared drops out of the
series (absent, not 0), as Kueue's per-queue gauges do.

The revision is the image's: `DISPATCH_BUILD_REVISION`, set when the image
is built (a build fact, not a setting); `unknown` when it was not.
"""

from __future__ import annotations

import collections
import importlib.metadata
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import prometheus_client
import prometheus_client.core
import prometheus_client.registry

Obj = dict[str, Any]
REVISION_ENV = "DISPATCH_BUILD_REVISION"
# The ready latency's buckets (seconds): an admission waits on our check for a raise and a status write.
READY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def version() -> str:
    try:
        return importlib.metadata.version("dispatch-k8s")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def flagged_by_namespace(trainjobs: Iterable[Obj]) -> dict[str, int]:
    """Pure: how many of these (flagged) TrainJobs each namespace holds."""
    return dict(collections.Counter(str((tj.get("metadata") or {}).get("namespace") or "") for tj in trainjobs))


class _Live(prometheus_client.registry.Collector):
    """The series read at scrape time from the process's own state."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[prometheus_client.core.Metric]:
        requests = self.metrics.api_requests_source
        if requests is not None:
            yield prometheus_client.core.CounterMetricFamily(
                "dispatch_api_requests",
                "Kubernetes API requests sent by this process (each retry and each list or watch connection counted)",
                value=requests())
        flagged = self.metrics.flagged_source
        if flagged is not None:  # None: not leading; no series at all
            family = prometheus_client.core.GaugeMetricFamily(
                "dispatch_flagged_trainjobs", "TrainJobs flagged foreign now (label dispatch.phpboyscout.uk/foreign=true), "
                "by namespace; exported by the leader only", labels=["namespace"])
            for namespace, count in sorted(flagged_by_namespace(flagged()).items()):
                family.add_metric([namespace], count)
            yield family


class Metrics:
    def __init__(self, *, lease: str = "dispatch-controller") -> None:
        self.registry = prometheus_client.CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.registry)
        prometheus_client.PlatformCollector(registry=self.registry)
        prometheus_client.GCCollector(registry=self.registry)
        prometheus_client.Gauge(
            "dispatch_build_info", "The running build: 1, with its version and revision as labels",
            ["version", "revision"], registry=self.registry,
        ).labels(version=version(), revision=os.environ.get(REVISION_ENV) or "unknown").set(1)
        self.leader = prometheus_client.Gauge(
            "dispatch_leader_election_status", "1 while this replica holds the Lease, else 0", ["lease"],
            registry=self.registry,
        ).labels(lease=lease)
        self.reconcile_errors = prometheus_client.Counter(
            "dispatch_reconcile_errors", "Steps that failed with an error and were queued again, by kind of object",
            ["kind"], registry=self.registry,
        )
        self.raises = prometheus_client.Counter(
            "dispatch_raises", "A raised on a TrainJob", registry=self.registry
        )
        self.conflicts = prometheus_client.Counter(
            "dispatch_conflicts_retried", "409s re-read and recomputed", registry=self.registry
        )
        self.foreign_flags = prometheus_client.Counter(
            "dispatch_foreign_flags", "Causes flagged foreign, by rule", ["rule"], registry=self.registry
        )
        self.ready_latency = prometheus_client.Histogram(
            "dispatch_check_ready_seconds",
            "From the first sight of a Workload's reservation with our check Pending to the check Ready, "
            "by the ClusterQueue that reserved the quota",
            ["cluster_queue"], buckets=READY_BUCKETS, registry=self.registry,
        )
        self.awaiting_ready = prometheus_client.Gauge(
            "dispatch_workloads_awaiting_ready",
            "Workloads seen with quota reserved and our check Pending, not yet Ready",
            registry=self.registry,
        )
        self.sidecar_reports = prometheus_client.Counter(
            "dispatch_sidecar_reports",
            "Sidecar reports, by whether the controller's own re-read confirmed them",
            ["outcome"],
            registry=self.registry,
        )
        self.api_requests_source: Callable[[], int] | None = None
        self.flagged_source: Callable[[], list[Obj]] | None = None
        self.registry.register(_Live(self))

    def foreign(self, rule: str) -> None:
        self.foreign_flags.labels(rule=rule).inc()

    def sidecar_report(self, outcome: str) -> None:
        self.sidecar_reports.labels(outcome=outcome).inc()

    def scrape(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
