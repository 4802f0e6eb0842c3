"""Status computation (adapter.compute_status) as a pure function."""

from toolkit import adapter, history, names, raising


def trainjob(*, a: int, suspend: bool, prefix: str = "7000003", token: str = "job.3.0") -> dict:
    tj, _ = raising.raised({"metadata": {"name": "tj", "namespace": "ns"}, "spec": {"suspend": True}})
    tj["metadata"]["annotations"].pop(history.HISTORY_ANNOTATION)  # A as given below, not the raise's 1
    entry = raising.patch_entry(a)
    tj["spec"]["runtimePatches"] = [entry]
    tj["metadata"]["annotations"][names.FLOOR_ANNOTATION] = str(a)
    tj["spec"]["suspend"] = suspend
    tj["spec"]["trainer"] = {
        "env": [
            {"name": names.ENV_EPOCH_PREFIX, "value": prefix},
            {"name": names.ENV_TOKEN_PREFIX, "value": token},
        ]
    }
    return tj


def jobset(restarts: int, uid: str = "u1") -> dict:
    return {"metadata": {"uid": uid}, "status": {"restarts": restarts}}


def test_running_reports_the_current_execution():
    s = adapter.compute_status(trainjob(a=2, suspend=False), jobset(3))
    assert (s.state, s.admission, s.restarts, s.r, s.execution) == ("running", 2, 3, 5, "current")
    assert s.epoch == "7000003000005"
    assert s.attempt == "job.3.0.2.3"


def test_suspended_reports_the_next_execution_in_every_field():
    s = adapter.compute_status(trainjob(a=2, suspend=True), jobset(3))
    # A, J, R, epoch and attempt all describe the next execution; the last
    # admitted A is its own field.
    assert (s.state, s.execution, s.admission, s.restarts, s.r) == ("suspended", "next", 3, 3, 6)
    assert (s.epoch, s.attempt, s.last_admission) == ("7000003000006", "job.3.0.3.3", 2)


def test_no_jobset_means_j_zero_and_empty_prefix_means_r_alone():
    s = adapter.compute_status(trainjob(a=0, suspend=True, prefix=""), None)
    assert (s.restarts, s.r, s.epoch, s.jobset_uid_seen) == (0, 1, "1", None)


def test_foreign_flag_and_recorded_uid_are_reported():
    tj = trainjob(a=1, suspend=False)
    tj["metadata"]["annotations"][names.FOREIGN_ANNOTATION] = "cause"
    tj["metadata"]["annotations"][names.JOBSET_UID_ANNOTATION] = "u0"
    s = adapter.compute_status(tj, jobset(0, uid="u1"))
    assert (s.foreign, s.foreign_cause, s.jobset_uid, s.jobset_uid_seen) == (True, "cause", "u0", "u1")


def test_past_the_bound_has_no_epoch_and_no_token_and_says_why():
    s = adapter.compute_status(trainjob(a=999_999, suspend=False), jobset(1))
    assert (s.epoch, s.attempt) == (None, None)
    assert s.bound == "R 1000000 is not below the bound 10^6: the prologue refuses to run this execution"
    s = adapter.compute_status(trainjob(a=999_998, suspend=True), jobset(1))
    assert (s.r, s.epoch, s.attempt) == (1000000, None, None)


def test_a_jobset_uid_other_than_the_recorded_one_is_reported_as_a_mismatch():
    tj = trainjob(a=1, suspend=False)
    tj["metadata"]["annotations"][names.JOBSET_UID_ANNOTATION] = "u0"
    assert adapter.compute_status(tj, jobset(0, uid="u1")).jobset_uid_mismatch
    assert not adapter.compute_status(tj, jobset(0, uid="u0")).jobset_uid_mismatch
    assert not adapter.compute_status(tj, None).jobset_uid_mismatch
