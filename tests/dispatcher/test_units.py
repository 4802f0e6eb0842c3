"""Pure logic of the dispatcher: settings, the Job it builds, the ledger, reports, the reap guard."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from dispatcher import app, backend, jobspec, ledger, names, reaper, reporter, settings, starts
from tests import k8sformats

REQUIRED = {"TCAB_BACKEND_URL": "http://backend:8080", "TCAB_BACKEND_SERVICE_TOKEN": "s3cret",
            "TCAB_DISPATCHER_DRIVER_IMAGE": "driver:1"}
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_defaults_when_only_the_required_values_are_set() -> None:
    s = settings.from_env({**REQUIRED, "TCAB_DISPATCHER_NAMESPACE": "runs"})
    assert (s.max_inflight, s.cpu_request, s.memory_request, s.job_ttl_seconds) == (16, "100m", "256Mi", 3600)
    assert (s.namespace, s.sandbox_namespace, s.poll_interval) == ("runs", "runs", 2.0)
    assert "s3cret" not in repr(s)
    assert s.heartbeat_file == ""  # no heartbeat unless asked for


def test_the_heartbeat_file_is_an_absolute_path_in_an_existing_directory(tmp_path: pathlib.Path) -> None:
    given = str(tmp_path / "alive")
    assert settings.from_env({**REQUIRED, "TCAB_DISPATCHER_HEARTBEAT_FILE": given}).heartbeat_file == given


@pytest.mark.parametrize(("value", "says"), [
    ("alive", "expected an absolute path of a file, in an existing directory"),
    ("/tmp/", "expected an absolute path of a file, in an existing directory"),
    ("/tmp/..", "expected an absolute path of a file, in an existing directory"),
    ("/no/such/dir/alive", "'/no/such/dir' is not an existing directory"),
    ("/tmp", "expected a file, not a directory"), ("/tmp/.", "expected a file, not a directory"),
])
def test_a_bad_heartbeat_file_is_one_line_naming_the_variable(value: str, says: str) -> None:
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env({**REQUIRED, "TCAB_DISPATCHER_HEARTBEAT_FILE": value})
    assert str(e.value) == f"TCAB_DISPATCHER_HEARTBEAT_FILE={value!r}: {says}"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_a_missing_required_value_names_the_variable(name: str) -> None:
    env = {k: v for k, v in REQUIRED.items() if k != name}
    with pytest.raises(settings.SettingsError, match=f"^{name} is required and not set$"):
        settings.from_env(env)
    with pytest.raises(settings.SettingsError, match=f"^{name} "):
        settings.from_env({**env, name: ""})  # empty counts as unset


@pytest.mark.parametrize(("name", "value"), [
    ("TCAB_DISPATCHER_MAX_INFLIGHT", "0"), ("TCAB_DISPATCHER_MAX_INFLIGHT", "ten"),
    ("TCAB_DISPATCHER_MAX_INFLIGHT", "-1"), ("TCAB_DISPATCHER_DRIVER_CPU_REQUEST", "lots"),
    ("TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST", "1GB"), ("TCAB_DISPATCHER_POLL_INTERVAL", "nan"),
    ("TCAB_DISPATCHER_JOB_TTL_SECONDS", "1.5"), ("TCAB_BACKEND_URL", "ftp://x"), ("TCAB_BACKEND_URL", "backend"),
    ("TCAB_DISPATCHER_NAMESPACE", "Not_A_Label"), ("TCAB_K8S_NAMESPACE", "-x"),
    ("TCAB_DISPATCHER_LOG_LEVEL", "loud"), ("TCAB_DISPATCHER_WORKERS", "1000"),
])
def test_a_malformed_value_is_one_line_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env({**REQUIRED, name: value})
    assert str(e.value).startswith(name) and "\n" not in str(e.value)


def test_the_process_refuses_to_start_with_one_line_and_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "dispatcher"], cwd=REPO, env={"PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "dispatcher: TCAB_BACKEND_URL is required and not set\n"


CLAIM = backend.Claim(job_id="7f3a", token="tok-123", launch_request={"b": 1, "a": [2]})


def config(**extra: str) -> settings.Settings:
    return settings.from_env({**REQUIRED, "TCAB_DISPATCHER_NAMESPACE": "runs", "TCAB_K8S_NAMESPACE": "sandboxes",
                              "TCAB_CONTAINER_TAG": "abc", "TCAB_OTHER": "not passed", **extra})


def test_the_driver_job_has_exactly_the_seed_environment_and_no_token_literal() -> None:
    job = jobspec.job(CLAIM, config())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in container["env"]] == [
        "TCAB_BACKEND_URL", "TCAB_JOB_ID", "TCAB_JOB_TOKEN", "TCAB_LAUNCH_REQUEST", "TCAB_DRIVER_RUNTIME",
        "TCAB_DRIVER_POD_IP", "TCAB_CONTAINER_TAG", "TCAB_K8S_NAMESPACE"]
    assert "tok-123" not in repr(job)
    assert container["env"][3]["value"] == '{"a":[2],"b":1}'
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    assert (job["spec"]["backoffLimit"], job["spec"]["template"]["spec"]["restartPolicy"]) == (0, "Never")
    secret = jobspec.secret(CLAIM, config(), job_uid="u-1")
    assert secret["stringData"] == {"token": "tok-123"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"


JOB_IDS = ["7f3a", "Run_42", "a" * 80, "a" * 54, "a" * 55, "x/y z", "---", "ÄÖ", "x\n", "x\n\n", "\nx", "٣",
           "a" * 63, "a" * 64, "a_b.c", "a.", "-a"]


@pytest.mark.parametrize("job_id", JOB_IDS)
def test_job_names_are_deterministic_valid_and_distinct(job_id: str) -> None:
    """Valid by the documented rules (tests/k8sformats.py), not by the implementation's own pattern;
    tests/dispatcher/test_cluster.py has the apiserver take them."""
    name = jobspec.job_name(job_id)
    assert name == jobspec.job_name(job_id)
    assert k8sformats.is_dns_label(name), name
    assert k8sformats.is_label_value(jobspec.job_id_label(job_id))
    assert jobspec.job_name(job_id + "1") != name


@pytest.mark.parametrize(("job_id", "plain"), [("7f3a", True), ("a" * 54, True), ("a" * 55, False), ("x\n", False),
                                                ("x\n\n", False), ("Run", False), ("a-", False), ("-a", False)])
def test_only_an_id_that_is_a_clean_label_is_used_as_it_stands(job_id: str, plain: bool) -> None:
    """`x\n` is not the id `x`: it takes the slug-plus-digest name, like any other id that is not a label."""
    assert (jobspec.job_name(job_id) == "tcab-run-" + job_id) is plain
    assert (jobspec.job_id_label(job_id) == job_id) is k8sformats.is_label_value(job_id)


@pytest.mark.parametrize(("name", "value"), [
    ("TCAB_DISPATCHER_NAMESPACE", "runs\n"), ("TCAB_K8S_NAMESPACE", "sandboxes\n"),
    ("TCAB_DISPATCHER_DRIVER_SERVICE_ACCOUNT", "driver\n"), ("TCAB_DISPATCHER_DRIVER_CPU_REQUEST", "100m\n"),
    ("TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST", "256Mi\n"), ("TCAB_DISPATCHER_DRIVER_CPU_REQUEST", "-1"),
    ("TCAB_DISPATCHER_NAMESPACE", "a" * 64),
])
def test_a_value_with_a_trailing_newline_or_past_its_bound_is_refused(name: str, value: str) -> None:
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env({**REQUIRED, name: value})
    assert str(e.value).startswith(f"{name}={value!r}: expected ") and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["1", "0.5", ".5", "5.", "+1", "1e3", "1E-3", "2u", "300n", "1Ki", "4Gi", "1E"])
def test_every_quantity_the_apiserver_reads_is_taken(value: str) -> None:
    assert k8sformats.is_resource_quantity(value)
    s = settings.from_env({**REQUIRED, "TCAB_DISPATCHER_DRIVER_CPU_REQUEST": value,
                           "TCAB_DISPATCHER_DRIVER_MEMORY_REQUEST": value})
    assert (s.cpu_request, s.memory_request) == (value, value)


def job(name: str, *, state: str | None = None) -> dict[str, object]:
    conditions = [{"type": state, "status": "True"}] if state else []
    return {"metadata": {"name": name, "uid": "u-" + name, "annotations": {names.JOB_ID_ANNOTATION: name}},
            "status": {"conditions": conditions}}


def test_a_tombstone_has_no_token_key_and_serves_no_job_and_a_secret_serves_only_its_own_job() -> None:
    def read_back(obj: dict[str, object]) -> dict[str, object]:  # as the apiserver answers: data, not stringData
        string_data = obj.pop("stringData", None) or {}
        return {**obj, "data": {**(obj.get("data") or {}), **{k: "eA==" for k in string_data}}}

    stone = jobspec.tombstone(CLAIM.job_id, config(), job_uid="u-1")
    assert stone["metadata"]["name"] == jobspec.job_name(CLAIM.job_id) and stone["data"] == {}
    assert stone["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert not jobspec.serves(read_back(stone), "u-1")
    own = read_back(jobspec.secret(CLAIM, config(), job_uid="u-1"))
    assert jobspec.serves(own, "u-1")
    assert not jobspec.serves(own, "u-2")  # an earlier Job's Secret: collected with that Job
    unowned = {**own, "metadata": {**own["metadata"], "ownerReferences": []}}
    assert jobspec.serves(unowned, "u-2")


def test_a_job_is_unchecked_until_its_secret_is_seen_to_here() -> None:
    book = ledger.Ledger(max_inflight=4)
    book.observe("ADDED", job("a"), now=1)  # found by the watcher: created by a process now gone
    assert book.unchecked("a") and book.unfinished() == 1  # it holds its slot until checked
    book.secret_confirmed("a")
    assert not book.unchecked("a")
    book.observe("ADDED", job("b"), now=1)
    assert book.expire("b") and not book.unchecked("b")  # tombstoned: being deleted, not a death
    assert book.observe("DELETED", job("b"), now=2) == [] and book.unfinished() == 1
    book.reserve(name="c", job_id="c", now=3)
    assert not book.unchecked("c")  # a create in hand here
    book.observe("ADDED", job("d", state="Complete"), now=4)
    assert not book.unchecked("d")  # finished: nothing can start any more


def test_the_ledger_caps_and_releases_on_finish_and_on_delete() -> None:
    book = ledger.Ledger(max_inflight=2)
    assert book.reserve(name="a", job_id="a", now=1) and book.reserve(name="b", job_id="b", now=1)
    assert book.free() == 0 and not book.reserve(name="a", job_id="a", now=2)
    book.created("a", uid="u-a", now=2)
    assert book.observe("MODIFIED", job("a", state="Complete"), now=3) == [] and book.free() == 1
    book.observe("ADDED", job("b"), now=3)
    changes = book.observe("DELETED", job("b"), now=4)
    assert [c.kind for c in changes] == ["vanished"] and book.free() == 2
    book.reserve(name="c", job_id="c", now=5)
    assert [c.kind for c in book.observe("MODIFIED", job("c", state="Failed"), now=6)] == ["failed"]
    assert book.observe("MODIFIED", job("c", state="Failed"), now=7) == []  # reported once
    assert book.unfinished() == 0


def test_a_relist_releases_what_was_deleted_unseen_and_keeps_what_is_newer() -> None:
    book = ledger.Ledger(max_inflight=10)
    book.observe("ADDED", job("old"), now=1)
    book.reserve(name="new", job_id="new", now=5)
    book.created("new", uid="u", now=6)
    book.reserve(name="creating", job_id="creating", now=2)
    changes = book.sync([], list_started=4, now=7)
    assert [(c.kind, c.name) for c in changes] == [("vanished", "old")]
    assert book.get("new") is not None and book.get("creating") is not None and book.unfinished() == 2


def test_a_death_report_keeps_the_real_exit_code_and_says_when_no_log_was_read() -> None:
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    body = reporter.describe(kind="failed", job_name="j", job=failed, pod=pod, events=[
        {"involvedObject": {"kind": "Job", "name": "j"}, "reason": "BackoffLimitExceeded", "type": "Warning"}],
        log_tail=None, log_error="HTTP 400: no node")
    error = body["error"]
    assert (body["status"], error["reason"], error["exit_code"]) == ("failed", "OOMKilled", 137)
    assert error["log_error"] == "no log could be read: HTTP 400: no node" and error["log_tail"] is None
    assert error["events"][0]["object"] == "Job/j"
    evicted = {"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "Evicted", "message": "low memory"}}
    assert reporter.container_state(evicted) == {"reason": "Evicted", "message": "low memory"}


def test_the_reap_guard_never_selects_the_driver_pod() -> None:
    sandbox = {"metadata": {"labels": {names.JOB_ID_LABEL: "7f3a", names.MANAGED_BY_LABEL: names.DRIVER_MANAGED_BY}}}
    assert reaper.is_sandbox(sandbox, job_id="7f3a", driver_job="tcab-run-7f3a")
    driver = {"metadata": {"labels": {**jobspec.labels("7f3a"), names.JOB_NAME_LABEL: "tcab-run-7f3a"}}}
    assert not reaper.is_sandbox(driver, job_id="7f3a", driver_job="tcab-run-7f3a")
    mislabelled = {"metadata": {"labels": {**sandbox["metadata"]["labels"], names.JOB_NAME_LABEL: "tcab-run-7f3a"}}}
    assert not reaper.is_sandbox(mislabelled, job_id="7f3a", driver_job="tcab-run-7f3a")
    assert not reaper.is_sandbox(sandbox, job_id="other", driver_job="tcab-run-other")
    assert reaper.batch_selector(["7f3a", "01b2", "7f3a"]) == (
        "test-cabinet/job-id in (01b2,7f3a),app.kubernetes.io/managed-by=test-cabinet-driver")


def waiting_pod(reason: str | None, *, created: str = "2030-01-01T00:00:00Z", phase: str = "Pending",
                scheduled: str | None = None, state: dict[str, object] | None = None) -> dict[str, object]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}] if scheduled else []
    statuses = [] if reason is None else [{"name": "driver", "state": state or {"waiting": {
        "reason": reason, "message": f"{reason}: test-cabinet/driver:none"}}}]
    return {"metadata": {"name": "p", "creationTimestamp": created},
            "status": {"phase": phase, "conditions": conditions, "containerStatuses": statuses}}


T0 = starts.timestamp("2030-01-01T00:00:00Z") or 0.0


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                    "CreateContainerConfigError"])
def test_a_driver_waiting_to_start_past_the_deadline_is_stuck_with_the_kubelets_reason(reason: str) -> None:
    assert starts.stuck(waiting_pod(reason), now=T0 + 599, deadline=600) is None
    late = starts.stuck(waiting_pod(reason), now=T0 + 601, deadline=600)
    assert late is not None and (late.pod, late.reason, late.waited) == ("p", reason, 601)
    assert late.message == f"{reason}: test-cabinet/driver:none"


def test_the_start_deadline_counts_from_scheduling_and_spares_unscheduled_started_and_malformed_pods() -> None:
    # Scheduled 500 s after creation: the wait counts from then.
    assert starts.stuck(waiting_pod("ErrImagePull", scheduled="2030-01-01T00:08:20Z"), now=T0 + 700,
                        deadline=600) is None
    assert starts.stuck(waiting_pod(None), now=T0 + 10_000, deadline=600) is None  # waiting for a node
    running = waiting_pod("x", state={"running": {"startedAt": "2030-01-01T00:00:05Z"}})
    assert starts.stuck(running, now=T0 + 10_000, deadline=600) is None
    assert starts.stuck(waiting_pod("ErrImagePull", phase="Failed"), now=T0 + 10_000, deadline=600) is None
    for bad in ({}, {"status": None}, {"status": {"containerStatuses": [{"name": "driver", "state": "x"}]}},
                waiting_pod("ErrImagePull", created="yesterday"), waiting_pod("ErrImagePull", created=None)):  # type: ignore[arg-type]
        assert starts.stuck(bad, now=T0 + 10_000, deadline=600) is None


def test_an_expired_job_keeps_its_slot_until_deleted_and_is_not_reported_again() -> None:
    book = ledger.Ledger(max_inflight=1)
    book.reserve(name="a", job_id="a", now=1)
    assert not book.expire("a")  # not created yet: nothing to expire
    book.created("a", uid="u-a", now=2)
    assert book.expire("a") and not book.expire("a")
    book.unexpire("a")  # its delete never went through: judged again on the next check
    assert book.expire("a")
    assert book.free() == 0
    assert book.observe("MODIFIED", job("a", state="Failed"), now=3) == []
    assert book.observe("DELETED", job("a"), now=4) == [] and book.free() == 1
    book.reserve(name="b", job_id="b", now=5)
    book.created("b", uid="u-b", now=5)
    book.expire("b")
    assert book.sync([], list_started=6, now=7) == [] and book.free() == 1


def test_the_oldest_age_counts_every_unfinished_job_from_its_creation_and_only_those() -> None:
    # No driver pod can wait longer than its Job has existed: the start check skips its pod list
    # while this age is under the deadline, so it must never under-count a Job that could be late.
    book = ledger.Ledger(max_inflight=10)
    assert book.oldest_age(now=100, wall=T0) == 0.0
    book.reserve(name="unseen", job_id="unseen", now=100)  # created, not seen yet: age from the reservation
    assert book.oldest_age(now=130, wall=T0) == 30.0
    restarted = job("listed")  # found by the list after a restart: age from its creationTimestamp
    restarted["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"  # type: ignore[index]
    book.sync([restarted], list_started=130, now=131)
    assert book.oldest_age(now=131, wall=T0 + 900) == 900.0
    book.observe("MODIFIED", job("listed", state="Complete"), now=132)  # finished: no longer counted
    assert book.oldest_age(now=132, wall=T0 + 900) == 32.0
    book.created("unseen", uid="u", now=101)
    assert book.expire("unseen")  # expired: reported already, not counted
    assert book.oldest_age(now=140, wall=T0 + 900) == 0.0


def test_a_stuck_driver_is_reported_with_the_waiting_reason_and_no_exit_code() -> None:
    pod = waiting_pod("ImagePullBackOff")
    body = reporter.describe(kind="stuck", job_name="j", job=None, pod=pod, events=[],
                             log_tail=None, log_error="the driver container never started", start_deadline=600)
    error = body["error"]
    assert (error["reason"], error["exit_code"], error["start_deadline_seconds"]) == ("ImagePullBackOff", None, 600)
    assert error["message"] == "ImagePullBackOff: test-cabinet/driver:none"
    assert error["log_error"] == "no log could be read: the driver container never started"


def test_the_loop_sleeps_while_every_worker_is_busy_instead_of_spinning() -> None:
    # Regression: with a free slot and a claim due but no free worker, _claim does nothing, so the
    # wait must not count that claim as due; it did, the wait was 0 and the loop spun (half the
    # dispatcher's CPU per run in bench/dispatcher). The wait is computed from state alone.
    config = settings.from_env({**REQUIRED, "TCAB_DISPATCHER_NAMESPACE": "runs", "TCAB_DISPATCHER_WORKERS": "2"})
    d = app.Dispatcher(config, client=None, api=None)  # type: ignore[arg-type]  # never called here
    try:
        d.synced, d.claims.next = True, 0.0  # a claim is overdue
        assert d._wait() == 0.0  # a worker is free: claim now
        d.in_hand = config.workers
        assert d._wait() == 1.0  # none is free: sleep until a worker's "done" (or the 1 s tick) wakes the loop
        d.in_hand = 0
        d.stopping.set()
        assert d._wait() == 1.0  # stopping: no more claims
    finally:
        d.pool.shutdown()
