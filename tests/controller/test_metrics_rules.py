"""The controller's metrics as pure rules (controller/metrics.py): the
flagged gauge counts by namespace and has no series at all until this
replica leads; the build's facts are labels of a 1; the exposition parses
with prometheus_client's own parser. The endpoint itself, on the real
apiserver: test_metrics_endpoint.py."""

from __future__ import annotations

import prometheus_client.parser
import pytest

from controller import metrics


def _families(m: metrics.Metrics) -> dict[str, prometheus_client.parser.Metric]:
    return {f.name: f for f in prometheus_client.parser.text_string_to_metric_families(m.scrape().decode())}


def test_flagged_trainjobs_are_counted_by_namespace() -> None:
    tjs = [{"metadata": {"namespace": ns, "name": n}} for ns, n in (("a", "x"), ("b", "y"), ("a", "z"))]
    assert metrics.flagged_by_namespace(tjs) == {"a": 2, "b": 1}
    assert metrics.flagged_by_namespace([]) == {}


def test_the_flagged_gauge_exists_only_while_leading() -> None:
    m = metrics.Metrics(lease="l")
    assert "dispatch_flagged_trainjobs" not in _families(m)
    m.flagged_source = lambda: [{"metadata": {"namespace": "training", "name": "x"}}]
    (sample,) = _families(m)["dispatch_flagged_trainjobs"].samples
    assert (sample.labels, sample.value) == ({"namespace": "training"}, 1.0)
    m.flagged_source = lambda: []
    assert _families(m)["dispatch_flagged_trainjobs"].samples == []


def test_build_info_leader_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(metrics.REVISION_ENV, "abc1234")
    m = metrics.Metrics(lease="dispatch-controller")
    m.leader.set(1)
    m.reconcile_errors.labels(kind="workload").inc()
    m.ready_latency.labels(cluster_queue="cq").observe(0.2)
    m.api_requests_source = lambda: 7
    families = _families(m)
    (build,) = families["dispatch_build_info"].samples
    assert build.labels == {"version": metrics.version(), "revision": "abc1234"} and build.value == 1
    assert families["dispatch_leader_election_status"].samples[0].value == 1
    errors = [s for s in families["dispatch_reconcile_errors"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in errors] == [({"kind": "workload"}, 1.0)]
    counts = [s for s in families["dispatch_check_ready_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels, s.value) for s in counts] == [({"cluster_queue": "cq"}, 1.0)]
    assert families["dispatch_api_requests"].samples[0].value == 7
    assert {"process_cpu_seconds", "python_info"} <= set(families)


def test_two_metrics_objects_do_not_share_a_registry() -> None:
    a, b = metrics.Metrics(), metrics.Metrics()
    a.raises.inc()
    assert _families(b)["dispatch_raises"].samples[0].value == 0
