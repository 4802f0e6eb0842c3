"""The dispatcher as the release's pod on the real control plane and the real node, against the
reference backend, under the shipped Role.

Every driver pod is run by the kubelet in the test driver image (tests/dispatcher/cluster.py): it
reports to the backend itself, waits to be released, fails, is OOM-killed by the kernel under a
LimitRange's memory limit, or never starts (an image the node does not have, a tombstone Secret),
as each run's launch request says. Nothing here writes a pod's status.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable
from typing import Any

import kubernetes.client
import pytest

from dispatcher import backend as backend_client
from dispatcher import jobspec, settings
from devcluster import harness, node
from tests.dispatcher import cluster
from tests.refbackend import proc
from toolkit import clusterconfig, kube, paths

pytestmark = pytest.mark.cluster


@pytest.fixture
def backend() -> Any:
    with proc.Backend(host=cluster.BACKEND_HOST) as b:
        yield b


def running_pod(api: kubernetes.client.ApiClient, namespace: str, job_name: str) -> Any:
    pod = cluster.driver_pod(api, namespace, job_name)
    return pod if pod is not None and pod.status.phase == "Running" else None


def test_runs_become_jobs_with_the_exact_environment_the_cap_holds_and_slots_come_back(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, backend: proc.Backend) -> None:
    runs = [backend.enqueue(launch_request={"n": i}) for i in range(5)]
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                           TCAB_DISPATCHER_MAX_INFLIGHT="3", TCAB_K8S_NAMESPACE=namespace,
                           TCAB_K8S_NODE_SELECTOR="pool=runs", TCAB_CONTAINER_IMAGE_TAG="abc123",
                           TCAB_DISPATCHER_JOB_TTL_SECONDS="600")
    try:
        d.start()
        cluster.wait(lambda: len(cluster.jobs(api_client, namespace)) == 3, what="3 Jobs")
        time.sleep(1.5)
        assert len(cluster.jobs(api_client, namespace)) == 3, "more than MAX_INFLIGHT unfinished"

        first = next(j for j in cluster.jobs(api_client, namespace) if j.metadata.name == f"tcab-run-{runs[0]['id']}")
        spec = api_client.sanitize_for_serialization(first)["spec"]
        container = spec["template"]["spec"]["containers"][0]
        assert container["env"] == [
            {"name": "TCAB_BACKEND_URL", "value": backend.url},
            {"name": "TCAB_JOB_ID", "value": runs[0]["id"]},
            {"name": "TCAB_JOB_TOKEN", "valueFrom": {"secretKeyRef": {"name": first.metadata.name, "key": "token"}}},
            {"name": "TCAB_LAUNCH_REQUEST", "value": '{"n":0}'},
            {"name": "TCAB_DRIVER_RUNTIME", "value": "kubernetes"},
            {"name": "TCAB_DRIVER_POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
            {"name": "TCAB_CONTAINER_IMAGE_TAG", "value": "abc123"},
            {"name": "TCAB_K8S_NAMESPACE", "value": namespace},
            {"name": "TCAB_K8S_NODE_SELECTOR", "value": "pool=runs"},
        ]
        assert runs[0]["token"] not in json.dumps(api_client.sanitize_for_serialization(first))
        assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
        assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == (0, 600)
        assert first.metadata.labels["test-cabinet/job-id"] == runs[0]["id"]
        assert first.metadata.labels["app.kubernetes.io/managed-by"] == "test-cabinet-dispatcher"
        secret = kubernetes.client.CoreV1Api(api_client).read_namespaced_secret(first.metadata.name, namespace)
        assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [("Job", first.metadata.uid)]
        assert cluster.job_token(api_client, namespace, first.metadata.name) == runs[0]["token"]

        # A slot comes back when a Job finishes (its driver, let go, exits 0)...
        pod = cluster.wait(lambda: running_pod(api_client, namespace, first.metadata.name), timeout=60,
                           what="the first driver Running")
        cluster.release(api_client, namespace, pod.metadata.name)
        cluster.wait(lambda: len(cluster.jobs(api_client, namespace)) == 4, timeout=60, what="a 4th Job after a finish")
        assert cluster.terminated(cluster.driver_pod(api_client, namespace, first.metadata.name)).exit_code == 0
        # ...and when one is deleted before it finished.
        victim = next(j for j in cluster.jobs(api_client, namespace) if cluster.unfinished(j))
        kubernetes.client.BatchV1Api(api_client).delete_namespaced_job(
            victim.metadata.name, namespace, propagation_policy="Background")
        cluster.wait(lambda: len([j for j in cluster.jobs(api_client, namespace)
                                  if j.metadata.name != victim.metadata.name]) == 4, what="a 5th Job after a delete")
        assert sum(cluster.unfinished(j) for j in cluster.jobs(api_client, namespace)) <= 3
        victim_id = victim.metadata.labels["test-cabinet/job-id"]
        cluster.wait(lambda: backend.get(victim_id)["state"] == "failed", what="the deleted run reported")
        assert backend.get(victim_id)["reports"][0]["body"]["error"]["reason"] == "DriverJobDeleted"

        assert d.terminate() == 0
        text = d.text()
        assert backend.token not in text and not any(r["token"] in text for r in runs)
        assert all(not line.get("unparsed") and line["component"] == "dispatcher" for line in d.lines())
        assert d.lines()[-1]["message"] == "stopped"
    finally:
        d.close()


def test_an_oom_killed_driver_is_reported_once_with_reason_exit_code_and_log_tail_and_its_sandbox_reaped(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, backend: proc.Backend) -> None:
    cluster.limit_memory(api_client, namespace)
    run = backend.enqueue(launch_request=cluster.launch("oom"))
    core = kubernetes.client.CoreV1Api(api_client)
    sandbox_labels = {"test-cabinet/job-id": run["id"], "app.kubernetes.io/managed-by": "test-cabinet-driver"}
    core.create_namespaced_pod(namespace, cluster.sandbox_pod("sandbox-1", sandbox_labels))
    core.create_namespaced_pod(namespace, cluster.sandbox_pod("other-run", {
        **sandbox_labels, "test-cabinet/job-id": "someone-else"}))
    for sandbox in ("sandbox-1", "other-run"):
        cluster.wait(lambda: core.read_namespaced_pod(sandbox, namespace).status.phase == "Running", timeout=60,
                     what=f"{sandbox} Running")
    # The first two reports meet a failing backend: retried, then delivered once.
    backend.fault(status=503, count=2, on="status")
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                           TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST=cluster.DRIVER_MEMORY_REQUEST)
    try:
        d.start()
        name = f"tcab-run-{run['id']}"
        cluster.wait(lambda: backend.get(run["id"])["state"] == "failed", timeout=60, what="the death report")
        pod = cluster.driver_pod(api_client, namespace, name)
        cluster.wait(lambda: "sandbox-1" not in [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
                     or None, timeout=30, what="the sandbox pod deleted")
        remaining = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
        assert pod.metadata.name in remaining and "other-run" in remaining
        time.sleep(1)
        reports = backend.get(run["id"])["reports"]
        assert len(reports) == 1
        error = reports[0]["body"]["error"]
        # The kernel killed it under the LimitRange's limit; the tail is its real log, read through the kubelet.
        assert (error["reason"], error["exit_code"], error["pod"]) == ("OOMKilled", 137, pod.metadata.name)
        assert error["log_tail"] == "step 40: loss 1.95\nstep 41: loss 1.92\nallocating 80 GiB for the KV cache\n"
        assert error.get("log_error") is None
        assert pod.spec.containers[0].resources.limits == {"memory": cluster.OOM_LIMIT}
        assert error["job_condition"]["reason"]
        # The Job's Events were listed (the Role's events list verb) and quoted.
        assert any(e["object"] == f"Job/{name}" and e["reason"] == "SuccessfulCreate" for e in error["events"]), \
            error["events"]
        assert any(line["message"] == "death report not delivered; retrying" for line in d.lines())
        assert d.terminate() == 0
        # A restart reports the still-present failed Job again; the backend's 409 makes that a no-op.
        d.start()
        cluster.wait(lambda: any(line["message"] == "death report not needed" for line in d.lines()), what="409")
        assert len(backend.get(run["id"])["reports"]) == 1
        assert d.terminate() == 0
        # The token Secret is owned by the Job: when the Job goes (TTL, or a person), the Secret goes with it.
        assert core.read_namespaced_secret(name, namespace).metadata.name == name
        kubernetes.client.BatchV1Api(api_client).delete_namespaced_job(name, namespace,
                                                                       propagation_policy="Background")
        cluster.wait(lambda: harness.gone(lambda: core.read_namespaced_secret(name, namespace)),
                     what="the Secret garbage-collected with its Job")
    finally:
        d.close()


def report_lines(d: cluster.Dispatcher, name: str) -> list[dict[str, Any]]:
    return [line for line in d.lines() if line.get("job") == name and line["message"].startswith("death report")]


def delete_unfinished_job(api_client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """A driver Job deleted before it finished: the dispatcher owes the backend a death report."""
    cluster.wait(lambda: [j for j in cluster.jobs(api_client, namespace) if j.metadata.name == name], what=name)
    kubernetes.client.BatchV1Api(api_client).delete_namespaced_job(name, namespace, propagation_policy="Background")


def test_a_status_report_slower_than_the_backend_timeout_is_retried_and_recorded_once(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, backend: proc.Backend) -> None:
    run = backend.enqueue()
    name = f"tcab-run-{run['id']}"
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                           TCAB_DISPATCHER_BACKEND_TIMEOUT="0.5")
    try:
        d.start()
        backend.fault(delay=1.5, on="status")  # served after 1.5 s: the dispatcher has given up waiting by then
        delete_unfinished_job(api_client, namespace, name)
        cluster.wait(lambda: [line for line in report_lines(d, name) if line["outcome"] != "retry"],
                     what="the report delivered")
        time.sleep(2)  # the slow first attempt has been served too by now
        lines = report_lines(d, name)
        assert (lines[0]["message"], lines[0]["http_status"]) == ("death report not delivered; retrying", 0)
        assert lines[-1]["outcome"] in ("accepted", "terminal") and len(lines) >= 2
        reports = backend.get(run["id"])["reports"]
        assert [r["body"]["error"]["reason"] for r in reports] == ["DriverJobDeleted"]
        assert backend.faults()["hits"]["status"] == len(lines)
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_404_on_a_status_report_is_tried_exactly_once_and_given_up(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, backend: proc.Backend) -> None:
    run = backend.enqueue()
    name = f"tcab-run-{run['id']}"
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend)
    try:
        d.start()
        backend.fault(status=404, count=3, on="status")
        delete_unfinished_job(api_client, namespace, name)
        cluster.wait(lambda: report_lines(d, name), what="the report's outcome")
        time.sleep(2)  # a retry would come within 0.5 s
        lines = report_lines(d, name)
        assert [(line["message"], line["level"], line["http_status"]) for line in lines] == [
            ("death report given up: the backend does not know the run", "warning", 404)]
        faults = backend.faults()
        assert (faults["faults"], faults["hits"]["status"]) == ([{"status": 404, "count": 2, "on": "status"}], 1)
        assert backend.get(run["id"])["reports"] == []
        assert d.terminate() == 0
    finally:
        d.close()


def test_claims_that_fail_or_time_out_back_off_and_every_run_is_still_dispatched_once(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str) -> None:
    # A claim that times out at the dispatcher may still be taken at the backend: the lease brings it back.
    with proc.Backend(lease=2, host=cluster.BACKEND_HOST) as backend:
        runs = [backend.enqueue()["id"] for _ in range(3)]
        backend.fault(status=503, count=3, on="next")
        backend.fault(delay=1.5, on="next")
        d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                               TCAB_DISPATCHER_BACKEND_TIMEOUT="0.5")
        try:
            d.start()
            cluster.wait(lambda: {j.metadata.name for j in cluster.jobs(api_client, namespace)} ==
                         {f"tcab-run-{i}" for i in runs}, timeout=60, what="a Job for every run")
            failures = [line for line in d.lines() if line["message"] == "claim failed; retrying"]
            assert [f["error"] for f in failures[:3]] == ["claim: HTTP 503"] * 3
            assert "Timeout" in failures[3]["error"]
            delays = [f["retry_in"] for f in failures[:4]]
            assert delays == sorted(delays) and delays[0] < delays[3], "no backoff"
            # Runs offered again after their lease (nothing says "running" here) are "already dispatched".
            cluster.wait(lambda: sum(line["message"] == "dispatched" for line in d.lines()) >= 3, what="3 dispatched")
            cluster.wait(lambda: any(line["message"] == "already dispatched" for line in d.lines()), what="a re-offer")
            assert sum(line["message"] == "dispatched" for line in d.lines()) == 3
            assert len(cluster.jobs(api_client, namespace)) == 3
            assert d.terminate() == 0
        finally:
            d.close()


def test_a_dead_driver_is_reported_with_the_last_lines_of_its_log(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, backend: proc.Backend) -> None:
    """`pods/log` goes where it goes on any cluster: the apiserver asks the node's kubelet, which reads
    the container's log file back."""
    run = backend.enqueue(launch_request=cluster.launch("fail"))
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                           TCAB_DISPATCHER_LOG_TAIL_LINES="2")
    try:
        d.start()
        cluster.wait(lambda: backend.get(run["id"])["state"] == "failed", timeout=60, what="the death report")
        pod = cluster.driver_pod(api_client, namespace, jobspec.job_name(run["id"]))
        assert pod.spec.node_name == node.NODE_NAME
        reports = backend.get(run["id"])["reports"]
        assert len(reports) == 1
        error = reports[0]["body"]["error"]
        assert (error["reason"], error["exit_code"], error["pod"]) == ("Error", 3, pod.metadata.name)
        assert error["log_tail"] == "step 2: starting the sandbox\ndriver: the sandbox did not answer; giving up\n"
        assert error.get("log_error") is None
        assert d.terminate() == 0
    finally:
        d.close()


def cordon(api: kubernetes.client.ApiClient, *, unschedulable: bool) -> None:
    kubernetes.client.CoreV1Api(api).patch_node(node.NODE_NAME, {"spec": {"unschedulable": unschedulable}})


def test_a_driver_that_never_starts_is_reported_once_past_the_start_deadline_and_its_slot_comes_back(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, backend: proc.Backend) -> None:
    """The kubelet cannot start a driver whose image the node does not have and no registry serves:
    it holds the container waiting (ErrImagePull, then ImagePullBackOff) for ever."""
    first, second = backend.enqueue(), backend.enqueue()
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    absent = "localhost/dispatch/test-driver:absent"
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                           TCAB_DISPATCHER_MAX_INFLIGHT="1", TCAB_DISPATCHER_DRIVER_START_DEADLINE="2",
                           TCAB_DISPATCHER_DRIVER_IMAGE=absent)
    try:
        d.start()
        name = f"tcab-run-{first['id']}"
        pod = cluster.wait(lambda: (p := cluster.driver_pod(api_client, namespace, name)) and p.spec.node_name and p,
                           timeout=30, what="the driver pod on the node")
        # The node takes no new pod from here on: the next run's pod waits for capacity.
        cordon(api_client, unschedulable=True)
        try:
            cluster.wait(lambda: backend.get(first["id"])["state"] == "failed", timeout=60,
                         what="the report of the stuck driver")
            # The Job is deleted, its Secret goes with it, and the slot (MAX_INFLIGHT 1) takes the next run.
            cluster.wait(lambda: harness.gone(lambda: batch.read_namespaced_job(name, namespace)), what="Job deleted")
            cluster.wait(lambda: harness.gone(lambda: core.read_namespaced_secret(name, namespace)), what="Secret GC")
            second_name = f"tcab-run-{second['id']}"
            cluster.wait(lambda: [j for j in cluster.jobs(api_client, namespace) if j.metadata.name == second_name],
                         what="the next run in the freed slot")
            # The next pod is on no node (no container status): waiting for capacity, not stuck.
            time.sleep(3.5)
            assert backend.get(second["id"])["state"] == "claimed"
            assert not cluster.driver_pod(api_client, namespace, second_name).spec.node_name
        finally:
            cordon(api_client, unschedulable=False)
        reports = backend.get(first["id"])["reports"]
        assert len(reports) == 1
        error = reports[0]["body"]["error"]
        assert error["reason"] in ("ErrImagePull", "ImagePullBackOff"), error
        assert absent in error["message"] and error["exit_code"] is None
        assert (error["pod"], error["start_deadline_seconds"]) == (pod.metadata.name, 2)
        assert [line["reason"] for line in d.lines()
                if line["message"].startswith("driver did not start")] == [error["reason"]]
        assert not any(line["message"].startswith("death report") and line.get("job") == name
                       and line.get("reason") == "DriverJobDeleted" for line in d.lines())
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_delete_by_uid_spares_a_newer_job_of_the_same_name(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str, driver_image: str) -> None:
    """A tombstoned Job is deleted by uid: if its run already has a new Job of that name, it stays."""
    batch = kubernetes.client.BatchV1Api(api_client)
    config = settings.from_env({"TCAB_BACKEND_URL": "http://127.0.0.1:1", "TCAB_BACKEND_SERVICE_TOKEN": "t",
                                "TCAB_DISPATCHER_DRIVER_IMAGE": driver_image, "TCAB_DISPATCHER_NAMESPACE": namespace})
    claim = backend_client.Claim(job_id="same-name", token="t", launch_request={})
    name = jobspec.job_name(claim.job_id)
    newer = batch.create_namespaced_job(namespace, jobspec.job(claim, config)).metadata.uid
    client = clusterconfig.load(kubeconfig=rbac_kubeconfig, retries=0)
    try:
        with pytest.raises(kube.ApiError) as e:
            client.delete(paths.JOB, name=name, namespace=namespace, missing_ok=True,
                          body=jobspec.deletion(uid="0f1e2d3c-0000-4000-8000-000000000000"))
        assert e.value.status == 409
        assert batch.read_namespaced_job(name, namespace).metadata.uid == newer
        client.delete(paths.JOB, name=name, namespace=namespace, body=jobspec.deletion(uid=newer), missing_ok=True)
        cluster.wait(lambda: name not in {j.metadata.name for j in cluster.jobs(api_client, namespace)},
                     what="the Job deleted by its own uid")
    finally:
        client.close()


def test_a_verb_outside_the_role_is_forbidden(control_plane: Any, rbac_kubeconfig: str, namespace: str) -> None:
    with kubernetes.config.new_client_from_config(config_file=rbac_kubeconfig) as api:
        batch = kubernetes.client.BatchV1Api(api)
        batch.list_namespaced_job(namespace)  # inside the Role
        core = kubernetes.client.CoreV1Api(api)
        for call in (lambda: core.list_namespaced_secret(namespace),
                     lambda: core.create_namespaced_pod(namespace, {"metadata": {"name": "x"}, "spec": {
                         "containers": [{"name": "c", "image": "x"}]}}),
                     lambda: core.delete_namespaced_secret("x", namespace),
                     lambda: batch.patch_namespaced_job("x", namespace, {"metadata": {"labels": {"a": "b"}}}),
                     lambda: batch.list_namespaced_job("default")):
            with pytest.raises(kubernetes.client.ApiException) as e:
                call()
            assert e.value.status == 403


def test_recovers_after_the_apiserver_stops_and_starts(
        control_plane: Any, api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str,
        backend: proc.Backend) -> None:
    backend.enqueue()
    d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend)
    try:
        d.start()
        cluster.wait(lambda: len(cluster.jobs(api_client, namespace)) == 1, what="first Job")
        control_plane.stop_apiserver()
        try:
            second = backend.enqueue()
            time.sleep(2)
        finally:
            control_plane.start_apiserver()
        with control_plane.api_client() as api:
            cluster.wait(lambda: len(cluster.jobs(api, namespace)) == 2, timeout=60, what="Job after restart")
            assert {j.metadata.name for j in cluster.jobs(api, namespace)} >= {f"tcab-run-{second['id']}"}
        found = d.running()  # the same container all along: the kubelet restarted nothing
        assert found is not None and d.seen == {found[1]}
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_job_left_without_its_secret_is_tombstoned_and_deleted_unreported_and_its_run_dispatched_again(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str) -> None:
    """What a dispatcher killed between its two creates leaves: a Job with no Secret, whose pod the
    kubelet cannot start (CreateContainerConfigError) and whose token only the claim had. It must
    not hold its slot for ever (the deadlock CI hit: MAX_INFLIGHT such Jobs and no claim, so the
    backend never offered the runs again); a Job whose Secret is there is left alone."""
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    with proc.Backend(lease=8, host=cluster.BACKEND_HOST) as backend:
        kept, orphan, third = (backend.enqueue() for _ in range(3))
        d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                               TCAB_DISPATCHER_MAX_INFLIGHT="2")
        config = settings.from_env(d.env)
        client = backend_client.Backend(url=backend.url, service_token=backend.token, timeout=10)
        try:
            claims = [client.claim(), client.claim()]  # what the dead dispatcher did: two claims...
        finally:
            client.close()
        assert [c.job_id for c in claims if c] == [kept["id"], orphan["id"]]
        uid = {}
        for claim in claims:  # ...two Jobs...
            assert claim is not None
            uid[claim.job_id] = batch.create_namespaced_job(namespace, jobspec.job(claim, config)).metadata.uid
        assert claims[0] is not None  # ...and one Secret
        core.create_namespaced_secret(namespace, jobspec.secret(claims[0], config, job_uid=uid[kept["id"]]))
        kept_name, orphan_name = (jobspec.job_name(r["id"]) for r in (kept, orphan))
        pods = cluster.PodWatch(api_client, namespace)
        pods.start()
        try:
            # The kubelet holds the orphan's driver: the Secret its token comes from is not there.
            orphan_pod = cluster.wait(lambda: cluster.driver_pod(api_client, namespace, orphan_name), what="orphan pod")
            cluster.wait(lambda: "CreateContainerConfigError" in pods.waiting[orphan_pod.metadata.name], timeout=60,
                         what="the kubelet refusing the orphan's container")
            d.start()
            # The orphan gets a tombstone (no token key), then goes; its slot goes to the next run.
            third_name = jobspec.job_name(third["id"])
            cluster.wait(lambda: third_name in {j.metadata.name for j in cluster.jobs(api_client, namespace)},
                         what="the third run's Job in the freed slot")
            assert orphan_name not in {j.metadata.name for j in cluster.jobs(api_client, namespace)}
            assert batch.read_namespaced_job(kept_name, namespace).metadata.uid == uid[kept["id"]]
            assert cluster.job_token(api_client, namespace, kept_name) == kept["token"]
            # Nothing was reported for it: the run is still claimed, and is offered again after its lease.
            assert backend.get(orphan["id"])["state"] == "claimed" and backend.get(orphan["id"])["reports"] == []
            assert any(line["message"].startswith("driver job found without its token Secret")
                       and line.get("job") == orphan_name for line in d.lines())
            # A finish frees a slot for it: a new Job, with a Secret of its own holding the run's token
            # (written once the tombstone, owned by the old Job, was collected).
            pod = cluster.wait(lambda: running_pod(api_client, namespace, kept_name), timeout=60, what="kept Running")
            cluster.release(api_client, namespace, pod.metadata.name)

            def redispatched() -> Any:
                job = next((j for j in cluster.jobs(api_client, namespace) if j.metadata.name == orphan_name), None)
                return job if job is not None and job.metadata.uid != uid[orphan["id"]] else None

            again = cluster.wait(redispatched, what="the run offered again to get a new Job")

            def own_secret() -> Any:
                try:
                    secret = core.read_namespaced_secret(orphan_name, namespace)
                except kubernetes.client.ApiException:
                    return None
                owners = [o.uid for o in secret.metadata.owner_references or []]
                return secret if owners == [again.metadata.uid] else None

            cluster.wait(own_secret, what="the new Job's own Secret")
            assert cluster.job_token(api_client, namespace, orphan_name) == orphan["token"]
            # The new Job's driver runs; the tombstoned one's never did.
            cluster.wait(lambda: again.metadata.uid in pods.started[orphan_name], timeout=60, what="the new driver")
            pods.check()
            assert pods.started[orphan_name] == {again.metadata.uid}
            assert d.terminate() == 0
        finally:
            pods.stop()
            d.close()


def test_a_driver_pod_whose_secret_is_the_tombstone_never_starts_on_the_kubelet(
        api_client: kubernetes.client.ApiClient, namespace: str, driver_image: str) -> None:
    """The tombstone (jobspec.tombstone) has no token key: the kubelet refuses to make the container
    (CreateContainerConfigError) on every try, so a tombstoned Job's driver never runs."""
    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    config = settings.from_env({"TCAB_BACKEND_URL": f"http://{cluster.BACKEND_HOST}:1",
                                "TCAB_BACKEND_SERVICE_TOKEN": "t",
                                "TCAB_DISPATCHER_DRIVER_IMAGE": driver_image, "TCAB_DISPATCHER_NAMESPACE": namespace})
    claim = backend_client.Claim(job_id="tombstoned", token="t", launch_request={})
    pods = cluster.PodWatch(api_client, namespace)
    pods.start()
    try:
        job = batch.create_namespaced_job(namespace, jobspec.job(claim, config))
        core.create_namespaced_secret(namespace, jobspec.tombstone(claim.job_id, config, job_uid=job.metadata.uid))
        pod = cluster.wait(lambda: cluster.driver_pod(api_client, namespace, job.metadata.name), what="the pod")

        def refused() -> str:
            status = core.read_namespaced_pod(pod.metadata.name, namespace).status
            waiting = [c.state.waiting for c in status.container_statuses or [] if c.state and c.state.waiting]
            return next((w.message for w in waiting if "couldn't find key token" in (w.message or "")), "")

        message = cluster.wait(refused, timeout=60, what="the kubelet refusing the tombstone")
        assert f"{namespace}/{job.metadata.name}" in message, message
        time.sleep(5)  # the kubelet tries again meanwhile, with the same answer
        pods.check()
        assert core.read_namespaced_pod(pod.metadata.name, namespace).status.phase == "Pending"
        assert dict(pods.started) == {} and pods.exits == {}
        assert "CreateContainerConfigError" in pods.waiting[pod.metadata.name]
        assert pods.waiting[pod.metadata.name] <= {"ContainerCreating", "CreateContainerConfigError"}
    finally:
        pods.stop()


def test_sigkill_at_random_points_50_times_loses_nothing_dispatches_nothing_twice_leaks_no_slot(
        api_client: kubernetes.client.ApiClient, namespace: str, rbac_kubeconfig: str) -> None:
    """The dispatcher's container SIGKILLed 50 times, each a new pod killed at a random point after
    its loop started, then once more restarted by the kubelet in its pod. Each driver, run by the
    kubelet, reports running and succeeded with its run's token and exits 0; a second driver of one
    run would have a report refused and exit 1. A tombstoned Job's driver never starts (the kubelet
    cannot make its container), so it is not a dispatch and not in flight."""
    max_inflight = 4
    rng = random.Random(7)
    with proc.Backend(lease=1.5, host=cluster.BACKEND_HOST) as backend:
        runs = {r["id"]: r for r in (backend.enqueue(launch_request=cluster.launch("succeed", running=True))
                                     for _ in range(40))}
        # Every Job and token Secret, for the in-flight count as the cap means it, replayed in the
        # apiserver's order (cluster.Dispatches).
        dispatches = cluster.Dispatches(api_client, namespace)
        uids, state = dispatches.uids, dispatches.unfinished
        pods = cluster.PodWatch(api_client, namespace)

        def all_ended() -> bool:
            dispatches.check()
            pods.check()
            return all(r["state"] == "succeeded" for r in backend.runs())

        dispatches.start()
        pods.start()
        d = cluster.Dispatcher(api_client, namespace=namespace, backend=backend,
                               TCAB_DISPATCHER_MAX_INFLIGHT=str(max_inflight), TCAB_DISPATCHER_LOG_LEVEL="info")

        def started() -> int:
            return sum(line["message"] == "started" for line in d.lines())

        def about(names: Iterable[str]) -> dict[str, Any]:
            """Per Job name: its run's state and reports, its Jobs' uids, whether its Job is unfinished."""
            runs_now = {name: backend.get(name.removeprefix("tcab-run-")) for name in names}
            return {name: (run["state"], run.get("reports"), sorted(uids.get(name, ())), state.get(name))
                    for name, run in runs_now.items()}

        try:
            for i in range(50):
                # A new pod each time; killed at a random point of its work, frozen first so that it
                # does nothing more and the kubelet restarts nothing (cluster.Dispatcher.kill).
                d.start()
                cluster.wait(lambda: started() > i, what="the dispatcher's loop started")
                time.sleep(rng.uniform(0.0, 0.9))
                d.kill()
            d.start()
            # And once as the kubelet does it: the container SIGKILLed, restarted in its pod.
            cluster.wait(lambda: started() > 50, what="the dispatcher's loop started")
            time.sleep(rng.uniform(0.0, 0.9))
            d.crash()
            try:
                cluster.wait(all_ended, timeout=180, what="every run to end")
            except AssertionError as e:
                left = about(f"tcab-run-{r['id']}" for r in backend.runs() if r["state"] != "succeeded")
                raise AssertionError(f"{e}; the runs not succeeded (state, reports, their Jobs' uids, the Job "
                                     f"unfinished): {left}; pods started: {dict(pods.started)}; "
                                     f"exits: {dict(pods.exits)}; failed pods: {pods.failed}") from e
            # No slot leaked: runs whose drivers never finish (they wait to be released) get MAX_INFLIGHT
            # Jobs in flight at once from the last dispatcher, so all its slots were free.
            extra = {f"tcab-run-{backend.enqueue()['id']}" for _ in range(max_inflight)}

            def extra_dispatched() -> bool:
                dispatches.check()
                pods.check()
                return all(name in pods.started for name in extra)

            def extra_story() -> str:
                named = [line for line in d.lines() if line.get("job") in extra
                         and line["message"] != "already dispatched"]
                return (f"the extra runs (state, reports, their Jobs' uids, the Job unfinished): {about(extra)}; "
                        f"failed pods: {pods.failed}; waiting: {dict(pods.waiting)}; "
                        f"the dispatcher's lines naming them: {named}; "
                        f"their Jobs' and Secrets' changes: {dispatches.of(extra)}")

            try:
                cluster.wait(extra_dispatched, timeout=60, what="the extra runs' drivers running")
            except AssertionError as e:
                raise AssertionError(f"{e}; {extra_story()}") from e
            assert dispatches.peak(extra)[0] == max_inflight, f"{dispatches.peak(extra)}; {extra_story()}"
            assert d.terminate() == 0
            # Every container's log was read, the one the kubelet restarted included, and each said
            # "started" once.
            said = {source: sum(line["message"] == "started" for line in lines)
                    for source, lines in d.lines_by_container().items()}
            odd = {source: n for source, n in said.items() if n != 1 or source.split("/", 1)[1] not in d.seen}
            assert len(d.seen) == 52 and started() == 52, f"containers that did not say 'started' once or were not started here: {odd}"
        finally:
            dispatches.stop()
            pods.stop()
            d.close()
        ran = {name: ids for name, ids in pods.started.items() if name.removeprefix("tcab-run-") in runs}
        assert {name: ids for name, ids in ran.items() if len(ids) > 1} == {}, "a run's driver ran twice"
        assert {pod: code for pod, code in pods.exits.items() if code != 0} == {}, \
            "a driver failed (a report refused: its run had already ended)"
        assert set(runs) == {n.removeprefix("tcab-run-") for n in ran}
        assert all(len(backend.get(i)["reports"]) == 2 for i in runs), "a run reported other than running, succeeded"
        assert dispatches.peak()[0] <= max_inflight, dispatches.peak()


def test_the_apiserver_takes_the_job_and_secret_built_for_any_run_id_and_any_quantity_the_settings_take(
        api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The apiserver is the oracle of names and quantities (a dry run: admission and validation, nothing
    stored): every id of the unit tests, a trailing newline included, and every quantity they accept."""
    from tests.dispatcher import test_units

    batch, core = kubernetes.client.BatchV1Api(api_client), kubernetes.client.CoreV1Api(api_client)
    quantities = ["1", "0.5", ".5", "5.", "+1", "1e3", "1E-3", "2u", "300n", "1Ki", "4Gi", "1E"]
    refused = []
    for i, job_id in enumerate(test_units.JOB_IDS):
        amount = quantities[i % len(quantities)]
        config = settings.from_env({**test_units.REQUIRED, "TCAB_DISPATCHER_NAMESPACE": namespace,
                                    "TCAB_DISPATCHER_DRIVER_CPU_REQUEST": amount,
                                    "TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST": amount})
        claim = backend_client.Claim(job_id=job_id, token="tok-123", launch_request={})
        try:
            batch.create_namespaced_job(namespace, jobspec.job(claim, config), dry_run="All")
            core.create_namespaced_secret(namespace, jobspec.secret(claim, config, job_uid="u-1"), dry_run="All")
        except kubernetes.client.ApiException as e:
            refused.append((job_id, amount, e.status, json.loads(e.body).get("message")))
    assert refused == []
