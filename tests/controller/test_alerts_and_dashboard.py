"""The optional alerts and dashboard (deployments/monitoring/) against what
the controller really exports: every expression of the PrometheusRule and of
the Grafana dashboard is parsed and evaluated by Prometheus's own PromQL
parser and engine (tests/controller/promqleval, built from its Go module)
over the series scraped from the controller, as a ServiceMonitor scrapes
them (its `job` label added). Every metric an expression selects is one the
controller exports. A flagged TrainJob makes the flagged alert's expression
non-empty for its namespace; `toolkit adopt` empties it."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import prometheus_client.parser
import kubernetes.utils
import pytest
import yaml

from devcluster import metrics
from tests.adapter import kit
from tests.controller.conftest import ControllerProcess, wait_until
from toolkit import adapter, flagmark, paths

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
MONITORING = REPO / "deployments" / "monitoring"
EVALUATOR = pathlib.Path(__file__).resolve().parent / "promqleval"
JOB = "dispatch-controller-metrics"  # the Service's name: the job label a ServiceMonitor scrape gets


@pytest.fixture(scope="module")
def promqleval(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    binary = tmp_path_factory.mktemp("promqleval") / "promqleval.test"
    built = subprocess.run(["go", "test", "-c", "-o", str(binary), "."], cwd=EVALUATOR, capture_output=True,
                           text=True, timeout=1800, env={**os.environ, "GOFLAGS": "-mod=readonly"})
    assert built.returncode == 0, built.stderr[-3000:]
    return binary


def alert_exprs() -> dict[str, str]:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def load_block(exposition: str) -> tuple[str, set[str]]:
    """The scraped samples as a promqltest load block (each series twice, a minute
    apart, so range functions have two points), with the job label a scrape adds;
    and every series name the exposition declares (a labelled family with no
    child yet has no sample, but its TYPE names the series it will have)."""
    lines, names = ["load 1m"], set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    for family in prometheus_client.parser.text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        for s in family.samples:
            names.add(s.name)
            labels = {**s.labels, "job": JOB}
            inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
            value = repr(float(s.value)) if s.value == s.value else "NaN"
            lines.append(f"  {s.name}{{{inner}}} {value} {value}")
    return "\n".join(lines) + "\n", names


def evaluate(binary: pathlib.Path, tmp_path: pathlib.Path, exposition: str, exprs: list[str]) -> list[dict[str, Any]]:
    load, _ = load_block(exposition)
    given, got = tmp_path / "in.json", tmp_path / "out.json"
    given.write_text(json.dumps({"load": load, "at": "1m", "exprs": exprs}))
    ran = subprocess.run([str(binary), "-test.run", "TestEvaluate", "-test.count", "1"], cwd=tmp_path,
                         env={**os.environ, "PROMQLEVAL_IN": str(given), "PROMQLEVAL_OUT": str(got)},
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    out: list[dict[str, Any]] = json.loads(got.read_text())
    return out


def test_every_expression_parses_selects_exported_metrics_and_the_flag_alert_follows_the_flag(
        promqleval: pathlib.Path, tmp_path: pathlib.Path, admin, namespace: str, start_controller) -> None:
    alerts = alert_exprs()
    assert {"DispatchTrainJobFlaggedForeign", "DispatchCheckWaitHigh", "DispatchNoLeader"} <= set(alerts)
    panels = list(dashboard_exprs())
    assert panels
    exprs = [*alerts.values(), *(e for _, e in panels)]

    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    kit.create_jobset(admin, tj)
    adapter.open_(admin, namespace=namespace, name=name)
    ctl: ControllerProcess = start_controller()
    admin.delete(paths.JOBSET, name=name, namespace=namespace)
    kit.create_jobset(admin, tj)  # a new UID: flagged
    gauge = f'dispatch_flagged_trainjobs{{namespace="{namespace}"}}'
    wait_until(lambda: metrics.sample(ctl.get("/metrics")[1], gauge) == 1, what="the flagged gauge")
    status, exposition = ctl.get("/metrics")
    assert status == 200
    _, exported = load_block(exposition)

    (tmp_path / "flagged").mkdir()
    results = evaluate(promqleval, tmp_path / "flagged", exposition, exprs)
    assert len(results) == len(exprs)
    for result in results:
        assert result["error"] == "", result
        for metric in result["metrics"]:
            assert metric in exported, (result["expr"], metric)
    by_expr = {r["expr"]: r for r in results}
    flagged = by_expr[alerts["DispatchTrainJobFlaggedForeign"]]["result"]
    assert {"labels": {"namespace": namespace}, "value": 1.0} in flagged
    assert by_expr[alerts["DispatchNoLeader"]]["result"] == []  # this replica leads

    adopted = adapter.adopt(admin, namespace=namespace, name=name, reason="checked",
                            reviewed=adapter.status(admin, namespace=namespace, name=name).foreign_fingerprint)
    assert not flagmark.is_flagged(admin.get(paths.TRAINJOB, name=name, namespace=namespace)) and adopted.causes
    wait_until(lambda: metrics.sample(ctl.get("/metrics")[1], gauge) is None, what="the gauge's series gone")
    (tmp_path / "adopted").mkdir()
    after = evaluate(promqleval, tmp_path / "adopted", ctl.get("/metrics")[1],
                     [alerts["DispatchTrainJobFlaggedForeign"]])
    assert [r for r in after[0]["result"] if r["labels"].get("namespace") == namespace] == []


def test_every_alert_links_its_runbook() -> None:
    doc = (REPO / "docs" / "operating.md").read_text()
    anchors = {"-".join("".join(c for c in line[3:].lower() if c.isalnum() or c in " -").split())
               for line in doc.splitlines() if line.startswith("## ")}
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    assert alerts
    base = "https://github.com/phpboyscout/dispatch-k8s/blob/main/docs/operating.md#"
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(base) and url.removeprefix(base) in anchors, (alert["alert"], url)


def test_the_scrape_presents_a_token_the_file_ships_and_the_role_allows(admin, api_client) -> None:
    # No deprecated bearerTokenFile: the ServiceMonitor names a token Secret of its own ServiceAccount,
    # which the apiserver fills and which is allowed to get /metrics.
    docs = [d for d in yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text()) if d]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert "bearerTokenFile" not in endpoint
    secret_ref = endpoint["authorization"]["credentials"]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert (secret["metadata"]["name"], secret["type"]) == (secret_ref["name"], "kubernetes.io/service-account-token")
    reader = yaml.safe_load((REPO / "deployments" / "k8s" / "base" / "controller" / "metrics-reader.yaml").read_text())
    made = []
    try:
        for doc in [reader, *(d for d in docs if d["kind"] != "ServiceMonitor")]:
            if doc["kind"] == "ServiceAccount" or doc["kind"] == "Secret":
                namespace = doc["metadata"]["namespace"]
                if not any(n["metadata"]["name"] == namespace for n in admin.list(NAMESPACE)[0]):
                    admin.create(NAMESPACE, {"metadata": {"name": namespace}})
            try:
                kubernetes.utils.create_from_dict(api_client, doc)
                made.append(doc)
            except kubernetes.utils.FailToCreateError as e:
                assert all(x.status == 409 for x in e.api_exceptions), e
        filled = wait_until(lambda: (admin.get(paths.SECRET, name=secret_ref["name"], namespace=secret["metadata"]["namespace"])
                                     .get("data") or {}).get(secret_ref["key"]), what="the token controller to fill it")
        token = base64.b64decode(filled).decode()
        review = admin.create(TOKEN_REVIEW, {"spec": {"token": token}})
        user = review["status"]["user"]
        access = admin.create(SUBJECT_ACCESS_REVIEW, {"spec": {
            "user": user["username"], "groups": user.get("groups", []),
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
        assert access["status"]["allowed"] is True, access["status"]
    finally:
        for doc in reversed(made):
            if doc["kind"] in ("ClusterRoleBinding", "ClusterRole"):
                res = paths.Resource("rbac.authorization.k8s.io", "v1", doc["kind"].lower() + "s", doc["kind"], False)
                admin.delete(res, name=doc["metadata"]["name"], missing_ok=True)


NAMESPACE = paths.Resource("", "v1", "namespaces", "Namespace", False)
TOKEN_REVIEW = paths.Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)
SUBJECT_ACCESS_REVIEW = paths.Resource("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                                       False)
