"""What docs/install.md and docs/operating.md state about our objects is what the manifests under
deployments/ and the code's constants say, read from them, not copied: the ports and endpoints the
controller serves (install.md's "fact | value" table), which Workloads the controller raises
(install.md's table under "The ClusterQueue", decided by the controller's own pure functions), the
ports the NetworkPolicy table names, and the alerts (operating.md's table: every alert of
prometheusrule.yaml once, with its `for`, and its runbook_url a section of operating.md). A table
row without its check, or a check without its row, fails too.

No cluster: the health server is the controller's own, on a port of this host, with the flags a
standby sets (`controller.app`: ready, not leading).
"""

from __future__ import annotations

import pathlib
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import prometheus_client
import yaml

from controller import admission, health, metrics, settings
from toolkit import marks, names, render
from toolkit import request as request_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALL = ROOT / "docs" / "install.md"
OPERATING = ROOT / "docs" / "operating.md"
CONTROLLER = ROOT / "deployments" / "k8s" / "base" / "controller"
MONITORING = ROOT / "deployments" / "monitoring"
Obj = dict[str, Any]


def table(page: pathlib.Path, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the table on PAGE whose header row starts with HEADER."""
    lines = page.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"| {header} |")), None)
    assert start is not None, f"{page.name} has no table headed {header!r}"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def code(cell: str) -> list[str]:
    """The `code` spans of a cell, in order."""
    return re.findall(r"`([^`]*)`", cell)


def manifest(path: pathlib.Path, kind: str) -> Obj:
    (found,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return dict(found)


def container() -> Obj:
    (found,) = manifest(CONTROLLER / "deployment.yaml", "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(found)


def ports() -> dict[str, int]:
    """The controller container's ports, by name."""
    return {p["name"]: p["containerPort"] for p in container()["ports"]}


def env() -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container()["env"]}


def port(name: str, setting: str) -> str:
    """The port NAME as the Deployment and the settings give it: each source the same number."""
    default = settings.Settings.__dataclass_fields__[setting].default
    declared = env()[f"DISPATCH_CONTROLLER_{setting.upper()}"]
    assert {ports()[name], default, int(declared)} == {ports()[name]}, (name, ports()[name], default, declared)
    return f"{ports()[name]} ({name})"


def answers(path: str, *, leading: bool) -> int:
    """The status the controller's health server answers PATH with, on a replica that is ready and
    leads (LEADING) or stands by."""
    server = health.HealthServer(host="127.0.0.1", port=0)
    server.live.set()
    server.ready.set()
    if leading:
        server.leading.set()
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        return e.code
    finally:
        server.stop()


def probe(kind: str) -> str:
    get = container()[kind]["httpGet"]
    assert get["port"] == "health", (kind, get)
    return str(get["path"])


def readiness() -> str:
    path = probe("readinessProbe")
    assert (answers(path, leading=True), answers(path, leading=False)) == (200, 200)
    return path


def leader_alone() -> str:
    assert (answers("/leaderz", leading=True), answers("/leaderz", leading=False)) == (200, 503)
    return "/leaderz"


def metrics_service() -> str:
    service = manifest(CONTROLLER / "service.yaml", "Service")
    (entry,) = service["spec"]["ports"]
    assert entry["targetPort"] == "metrics", entry
    assert service["spec"]["selector"].items() <= container_labels().items()
    return f"{service['metadata']['name']}, port {entry['port']}"


def container_labels() -> dict[str, str]:
    return dict(manifest(CONTROLLER / "deployment.yaml", "Deployment")["spec"]["template"]["metadata"]["labels"])


def scraped() -> str:
    monitor = manifest(MONITORING / "servicemonitor.yaml", "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    service = manifest(CONTROLLER / "service.yaml", "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    return f"port {endpoint['port']}, scheme {endpoint['scheme']}, path {endpoint['path']}"


def lease() -> str:
    namespace = manifest(CONTROLLER / "namespace.yaml", "Namespace")["metadata"]["name"]
    assert names.CONTROLLER_NAMESPACE == namespace
    return f"{settings.Settings.__dataclass_fields__['lease_name'].default} in {namespace}"


# The install page's "fact | value" table, each row's value as the manifests and the code give it.
FACTS: dict[str, Callable[[], str]] = {
    "the probes' port, plain HTTP": lambda: port("health", "health_port"),
    "liveness probe": lambda: probe("livenessProbe"),
    "readiness probe, 200 on the leader and on the standby": readiness,
    "200 on the leader alone": leader_alone,
    "the metrics port, HTTPS": lambda: port("metrics", "metrics_port"),
    "the metrics path": lambda: "/metrics",
    "the Service of the metrics port": metrics_service,
    "what the ServiceMonitor scrapes": scraped,
    "the Lease": lease,
}


def prose(cell: str) -> str:
    """A cell as plain words: its code spans unquoted."""
    return cell.replace("`", "")


def test_every_fact_of_the_install_table_is_the_manifests_and_the_codes() -> None:
    rows = {row[0]: prose(row[1]) for row in table(INSTALL, "fact")}
    assert sorted(rows) == sorted(FACTS), "a row without its check, or a check without its row"
    found = {fact: FACTS[fact]() for fact in rows}
    assert found == rows


def test_the_metrics_path_is_the_one_served_and_scraped() -> None:
    monitor = manifest(MONITORING / "servicemonitor.yaml", "ServiceMonitor")
    assert [e["path"] for e in monitor["spec"]["endpoints"]] == ["/metrics"]
    assert answers("/metrics", leading=True) == 404  # not on the probes' port: on its own, HTTPS


def workload(*, reserved: bool, state: str, admitted: bool = False) -> Obj:
    conditions = [{"type": "QuotaReserved", "status": "True" if reserved else "False"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    return {"metadata": {"name": "w", "uid": "u"},
            "status": {"conditions": conditions, "admissionChecks": [{"name": CHECK, "state": state}]}}


CHECK = manifest(CONTROLLER / "admissioncheck.yaml", "AdmissionCheck")["metadata"]["name"]


def started_trainjob() -> Obj:
    """A TrainJob as `toolkit start` writes it."""
    return render.trainjob(request_mod.from_dict({
        "jobId": "docs.job", "generation": 1, "submission": 1, "attempt": 1, "command": ["true"],
        "namespace": "training", "runtimeRef": {"kind": "TrainingRuntime", "name": "torch-distributed"}}))


def test_the_check_the_docs_list_is_the_one_the_controller_serves() -> None:
    check = manifest(CONTROLLER / "admissioncheck.yaml", "AdmissionCheck")
    assert check["spec"]["controllerName"] == admission.CONTROLLER_NAME
    assert f"- name: {CHECK}" in INSTALL.read_text()


def test_which_workloads_the_controller_raises_is_the_install_table() -> None:
    rows = table(INSTALL, "a Workload in the queue")
    assert [row[0] for row in rows] == [
        "of a dispatch TrainJob, quota reserved, the check Pending",
        "of any other job, quota reserved, the check Pending",
        "already admitted, or without a quota reservation"]
    ours, other, untouched = (code(row[2]) for row in rows)
    waiting = workload(reserved=True, state="Pending")
    # Rows one and two: a Workload the check waits on, raised when its TrainJob is ours.
    assert admission.pending_checks(waiting, {CHECK}) == [CHECK]
    assert marks.is_ours(started_trainjob())
    assert not marks.is_ours({"metadata": {"name": "plain"}, "spec": {"trainer": {"command": ["python"]}}})
    ready = admission.with_check_ready(waiting, checks=[CHECK], admission=7)["status"]["admissionChecks"]
    assert [(e["state"], e["message"]) for e in ready] == [("Ready", ours[0].replace("N", "7"))]
    assert other == [admission.UNTOUCHED]
    # Row three: nothing waits.
    assert untouched == []
    assert admission.pending_checks(workload(reserved=True, state="Ready", admitted=True), {CHECK}) == []
    assert admission.pending_checks(workload(reserved=False, state="Pending"), {CHECK}) == []


def test_the_network_policy_table_names_the_controllers_ports() -> None:
    named = {}
    for row in table(INSTALL, "port"):
        found = re.fullmatch(r"(\d+) \(`([a-z-]+)`\)", row[0])
        assert found, row[0]
        named[found.group(2)] = int(found.group(1))
    assert named == ports()


def alert_rules() -> dict[str, Obj]:
    rule = manifest(MONITORING / "prometheusrule.yaml", "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r}


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors of PAGE's sections, as GitHub makes them from the headings."""
    return {"-".join("".join(c for c in line.lstrip("#").lower() if c.isalnum() or c in " -").split())
            for line in page.read_text().splitlines() if re.match(r"#{2,} ", line)}


def test_the_alert_table_is_the_rules_with_their_for() -> None:
    rules = alert_rules()
    rows = table(OPERATING, "alert")
    assert sorted(code(row[0])[0] for row in rows) == sorted(rules)
    for row in rows:
        rule = rules[code(row[0])[0]]
        written = row[2].replace(" ", "")
        assert rule.get("for", "0s") == ("0s" if written == "atonce" else written), (row, rule.get("for"))


def test_every_runbook_url_and_every_link_of_the_watch_table_is_a_section_of_operating() -> None:
    sections = anchors(OPERATING)
    base = "https://github.com/phpboyscout/dispatch-k8s/blob/main/docs/operating.md#"
    for name, rule in alert_rules().items():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(base) and url.removeprefix(base) in sections, (name, url)
    links = [link for row in table(OPERATING, "signal") for link in re.findall(r"\]\(#([^)]+)\)", row[-1])]
    assert links and [link for link in links if link not in sections] == []


def served_series() -> set[str]:
    """Every series name the controller's registry exposes (a counter's with its `_total`), the
    scrape-time series' sources set."""
    served = metrics.Metrics()
    served.flagged_source = lambda: [{"metadata": {"namespace": "training"}}]
    served.api_requests_source = lambda: 0
    text = prometheus_client.generate_latest(served.registry).decode()
    return set(re.findall(r"^# TYPE (dispatch_\S+) \S+$", text, re.MULTILINE))


def test_every_series_the_pages_name_is_served() -> None:
    named = {m for page in (INSTALL, OPERATING) for m in re.findall(r"\bdispatch_[a-z_]+\b", page.read_text())}
    assert named and sorted(named - served_series()) == []


def test_every_label_and_annotation_the_pages_name_is_ours() -> None:
    ours = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    named = {m for page in (INSTALL, OPERATING)
             for m in re.findall(rf"\b{re.escape(names.DOMAIN)}/[a-z-]+", page.read_text())}
    assert named and sorted(named - ours) == []
    binding = manifest(CONTROLLER / "identity-policy.yaml", "MutatingAdmissionPolicyBinding")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    assert selector == {names.IDENTITY_NAMESPACE_LABEL: "enabled"}
    assert f"{names.IDENTITY_NAMESPACE_LABEL}=enabled" in INSTALL.read_text()
