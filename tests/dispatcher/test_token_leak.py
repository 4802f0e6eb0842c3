"""No token leaks: the dispatcher as the release's pod, on the real control plane and node under the
shipped Role, against the real reference backend (real HTTP, its SQLite file); its log as the
kubelet keeps it (`pods/log`).

Each case drives every path a token travels with a token made to leak (a
newline, a carriage return, a quote, a backslash, non-ASCII between two
random halves, so that no half of it may be seen either):
- the claim: the backend hands the bad token out (written into its run
  table, as a backend that minted it would): the run is refused, never
  given a Job, and the dispatcher goes on with the next run;
- the read-back: a Job left by an earlier dispatcher whose Secret holds the
  bad token; its driver (run by the kubelet with that token) fails; the
  token is not used (no header, no report);
- the death report: a run with a good token whose driver's own termination
  message quotes its token, and an Event quotes it and the service token;
  the report the backend stores carries neither.
Then: no half of the bad token in any log line, any stored report body, any
Event or any non-Secret object in the namespace; no good token and no
service token in any log line or report body.
"""

from __future__ import annotations

import json
import pathlib
import sqlite3
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from dispatcher import backend as backend_client
from dispatcher import jobspec, settings
from tests.dispatcher import cluster
from tests.refbackend import proc

pytestmark = pytest.mark.cluster

LEAKY = {"newline": "\n", "carriage-return": "\r", "quote": '"', "backslash": "\\", "non-ascii": "\u00e9\u2603"}


@pytest.fixture
def ref() -> Iterator[proc.Backend]:
    with proc.Backend(host=cluster.BACKEND_HOST) as b:
        yield b


def db(ref: proc.Backend) -> sqlite3.Connection:
    return sqlite3.connect(pathlib.Path(ref.dir.name) / "runs.db", timeout=30)


def set_token(ref: proc.Backend, run_id: str, token: str) -> None:
    conn = db(ref)
    try:
        with conn:
            conn.execute("UPDATE runs SET token = ? WHERE id = ?", (token, run_id))
    finally:
        conn.close()


def stored_reports(ref: proc.Backend) -> str:
    conn = db(ref)
    try:
        return "\n".join(row[0] for row in conn.execute("SELECT body FROM reports"))
    finally:
        conn.close()


def get(api: kubernetes.client.ApiClient, path: str) -> Any:
    method, url, headers, body, post = api.param_serialize("GET", path, auth_settings=["BearerToken"])
    response = api.call_api(method, url, headers, body, post)
    response.read()
    assert response.status == 200, (path, response.status)
    return json.loads(response.data)


def non_secret_objects(api: kubernetes.client.ApiClient, namespace: str) -> dict[str, str]:
    """Every namespaced object but Secrets, as JSON text by resource (read through discovery)."""
    versions = ["/api/v1"] + [f"/apis/{g['preferredVersion']['groupVersion']}" for g in get(api, "/apis")["groups"]]
    found: dict[str, str] = {}
    for version in versions:
        for resource in get(api, version)["resources"]:
            name = resource["name"]
            if "/" in name or not resource["namespaced"] or "list" not in resource["verbs"] or (
                    version == "/api/v1" and name == "secrets"):
                continue
            found[f"{version}/{name}"] = json.dumps(get(api, f"{version}/namespaces/{namespace}/{name}"),
                                                    ensure_ascii=False)
    assert "/api/v1/events" in found and "/apis/batch/v1/jobs" in found and "/api/v1/pods" in found
    return found


@pytest.mark.parametrize("kind", sorted(LEAKY))
def test_a_token_made_to_leak_reaches_no_log_no_report_no_event_and_no_object(
        kind: str, api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str,
        driver_image: str, ref: proc.Backend) -> None:
    halves = (uuid.uuid4().hex[:14], uuid.uuid4().hex[:14])
    bad = f"{halves[0]}{LEAKY[kind]}{halves[1]}"
    core = kubernetes.client.CoreV1Api(api_client)
    batch = kubernetes.client.BatchV1Api(api_client)
    config = settings.from_env({"TCAB_BACKEND_URL": ref.url, "TCAB_BACKEND_SERVICE_TOKEN": ref.token,
                                "TCAB_DISPATCHER_DRIVER_IMAGE": driver_image, "TCAB_DISPATCHER_NAMESPACE": namespace})

    # An earlier dispatcher claimed `left` and made its Job; its Secret holds the bad token.
    left = ref.enqueue(launch_request=cluster.launch("fail"))
    code, claimed = ref.call("POST", "/jobs/next", {})
    assert (code, claimed["id"]) == (200, left["id"])
    left_claim = backend_client.Claim(job_id=left["id"], token=left["token"], launch_request=cluster.launch("fail"))
    left_job = batch.create_namespaced_job(namespace, jobspec.job(left_claim, config))
    core.create_namespaced_secret(namespace, {**jobspec.secret(left_claim, config, job_uid=left_job.metadata.uid),
                                              "stringData": {"token": bad}})
    # The backend hands out the bad token for `refused`; `fine` has a good one.
    refused, fine = ref.enqueue(), ref.enqueue(launch_request=cluster.launch("leak", wait=True))
    set_token(ref, refused["id"], bad)

    d = cluster.Dispatcher(api_client, namespace=namespace, backend=ref)
    try:
        d.start()
        refusal = cluster.wait(lambda: next((line for line in d.lines() if line["message"].startswith(
            "run refused: its token is not a bearer token")), None), what="the refusal")
        assert refusal["job_id"] == refused["id"] and refusal["report_status"] == 200  # the backend took it
        fine_name, left_name = jobspec.job_name(fine["id"]), jobspec.job_name(left["id"])

        # The driver's own words quote its token (its termination message); an Event quotes it and the
        # service token.
        core.create_namespaced_event(namespace, {
            "metadata": {"name": f"leak-{uuid.uuid4().hex[:8]}"},
            "involvedObject": {"kind": "Job", "name": fine_name, "namespace": namespace},
            "reason": "Leak", "type": "Warning", "count": 1,
            "message": f"driver said Authorization: Bearer {fine['token']} (service {ref.token})",
            "firstTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
        fine_pod = cluster.wait(lambda: (p := cluster.driver_pod(api_client, namespace, fine_name)) and
                                p.status.phase == "Running" and p, timeout=60, what="fine's driver Running")
        cluster.release(api_client, namespace, fine_pod.metadata.name)  # it ends, quoting its token
        cluster.wait(lambda: ref.get(fine["id"])["state"] == "failed", timeout=60, what="fine's death report")
        cluster.wait(lambda: any(line["message"].startswith("no token for the run") and line.get("job") == left_name
                                 for line in d.lines()), timeout=60, what="left's report given up")
        assert cluster.terminated(cluster.driver_pod(api_client, namespace, left_name)).exit_code == 3
        assert d.terminate() == 0
        lines, raw_log = d.lines(), d.text()
    finally:
        d.close()

    # The bad token was refused, never given a Job, and the refusal reached the backend (service token).
    assert jobspec.job_name(refused["id"]) not in {j.metadata.name for j in cluster.jobs(api_client, namespace)}
    refused_run = ref.get(refused["id"])
    assert refused_run["state"] == "failed", refused_run
    assert [r["body"]["error"]["reason"] for r in refused_run["reports"]] == ["InvalidJobToken"]
    assert all(not line.get("unparsed") for line in lines)
    assert any(line["message"] == "the token in the job's Secret is not a bearer token; it is not used"
               for line in lines)
    # The good report went, with the driver's words redacted.
    error = ref.get(fine["id"])["reports"][0]["body"]["error"]
    assert error["message"] == "urllib3: Invalid header value b'Bearer [redacted]'"
    assert any(e["reason"] == "Leak" and "[redacted]" in e["message"] for e in error["events"])
    assert ref.get(left["id"])["reports"] == []

    log_text = raw_log + json.dumps(lines, ensure_ascii=False)
    reports = stored_reports(ref)
    for half in halves:
        assert half not in log_text, "a half of the bad token is in the dispatcher's log"
        assert half not in reports, "a half of the bad token is in a report body"
    for secret in (fine["token"], ref.token, left["token"]):
        assert secret not in log_text and secret not in reports
    objects = non_secret_objects(api_client, namespace)
    for where, text in objects.items():
        assert not any(half in text for half in halves), f"a half of the bad token is in {where}"
    # What the dispatcher wrote (its Jobs) carries no token at all.
    assert not any(s in objects["/apis/batch/v1/jobs"] for s in (fine["token"], ref.token, *halves))
