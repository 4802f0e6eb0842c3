"""/metrics as an SRE scrapes it, on the real apiserver with the controller
as a real process under its shipped RBAC: HTTPS on a port of its own, a
bearer token the apiserver authenticates (TokenReview) and authorizes for
`get` on /metrics (SubjectAccessReview, granted by the shipped
dispatch-metrics-reader); the probes on the health port, without a token.
The exposition is read with prometheus_client's own parser, and every
family is held to Prometheus's naming conventions."""

from __future__ import annotations

import socket

import prometheus_client.parser
import pytest

from devcluster import metrics
from tests.controller.conftest import ControllerProcess
from toolkit import kube

pytestmark = pytest.mark.cluster


def _families(body: str) -> dict[str, prometheus_client.parser.Metric]:
    return {f.name: f for f in prometheus_client.parser.text_string_to_metric_families(body)}


def test_metrics_answer_only_a_token_allowed_to_get_them(admin: kube.Client, namespace: str, start_controller,
                                                        metrics_token: str) -> None:
    ctl: ControllerProcess = start_controller()
    port = ctl.metrics_port
    assert port is not None and port != ctl.port
    unbound = metrics.reader_token(admin, namespace=namespace, account="not-a-scraper", bind=False)

    assert metrics.scrape(port, token=None) == (401, "Unauthorized\n")
    assert metrics.scrape(port, token="not-a-token") == (401, "Unauthorized\n")
    assert metrics.scrape(port, token=unbound) == (403, "Forbidden\n")  # authenticated, not allowed
    status, body = metrics.scrape(port, token=metrics_token)
    assert status == 200 and "dispatch_build_info" in body
    assert metrics.scrape(port, token=metrics_token, path="/healthz")[0] == 404

    # The probes: plain HTTP on their own port, no token; /metrics is not served there.
    assert ctl.get("/healthz") == (200, "ok\n") and ctl.get("/readyz") == (200, "ok\n")
    assert ctl.get("/metrics/")[0] == 404
    # Plain HTTP to the metrics port: no TLS, no answer (the server drops it).
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_the_exposition_follows_prometheus_conventions(namespace: str, start_controller, metrics_token: str) -> None:
    ctl: ControllerProcess = start_controller()
    status, body = metrics.scrape(ctl.metrics_port, token=metrics_token)  # type: ignore[arg-type]
    assert status == 200
    families = _families(body)
    # The standard process and runtime families, as the default registry has them.
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds",
            "python_info", "python_gc_collections"} <= set(families)
    (build,) = families["dispatch_build_info"].samples
    assert build.value == 1 and set(build.labels) == {"version", "revision"} and build.labels["version"]
    (leader,) = families["dispatch_leader_election_status"].samples
    assert (leader.labels, leader.value) == ({"lease": "dispatch-controller"}, 1.0)
    assert families["dispatch_api_requests"].type == "counter"
    assert families["dispatch_api_requests"].samples[0].name == "dispatch_api_requests_total"
    for name in ("dispatch_raises", "dispatch_conflicts_retried"):
        assert families[name].type == "counter", name
    assert families["dispatch_workloads_awaiting_ready"].type == "gauge"
    # The leader exports the flagged gauge; with nothing flagged, the family has no sample.
    assert families["dispatch_flagged_trainjobs"].type == "gauge"
    assert families["dispatch_flagged_trainjobs"].samples == []
    for family in families.values():
        if family.name.startswith("dispatch_"):
            assert family.documentation, family.name
            if family.type == "counter":
                assert all(s.name in (f"{family.name}_total", f"{family.name}_created") for s in family.samples)
            if family.type == "histogram":
                assert family.name.endswith("_seconds"), family.name


def test_a_standby_replica_exports_no_flagged_gauge_and_says_it_does_not_lead(namespace: str, start_controller,
                                                                             metrics_token: str) -> None:
    leader: ControllerProcess = start_controller()
    standby: ControllerProcess = start_controller(wait=False)
    assert standby.started.wait(20)
    status, body = metrics.scrape(standby.metrics_port, token=metrics_token)  # type: ignore[arg-type]
    assert status == 200
    families = _families(body)
    assert "dispatch_flagged_trainjobs" not in families
    (sample,) = families["dispatch_leader_election_status"].samples
    assert sample.value == 0
    assert "dispatch_flagged_trainjobs" in _families(metrics.scrape(leader.metrics_port, token=metrics_token)[1])  # type: ignore[arg-type]
