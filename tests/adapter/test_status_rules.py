"""Status computation (adapter.compute_status) as a pure function."""

from toolkit import adapter, names, raising


def trainjob(*, a: int, suspend: bool, prefix: str = "7000003", token: str = "job.3.0") -> dict:
    tj, _ = raising.raised({"metadata": {"name": "tj", "namespace": "ns"}, "spec": {"suspend": True}})
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
    assert (s.state, s.admission, s.restarts, s.r, s.next_or_current) == ("running", 2, 3, 5, "current")
    assert s.epoch == "7000003000005"
    assert s.attempt == "job.3.0.2.3"


def test_suspended_reports_the_next_execution():
    s = adapter.compute_status(trainjob(a=2, suspend=True), jobset(3))
    assert (s.state, s.admission, s.r, s.next_or_current) == ("suspended", 2, 6, "next")
    assert s.attempt == "job.3.0.3.3"


def test_no_jobset_means_j_zero_and_empty_prefix_means_r_alone():
    s = adapter.compute_status(trainjob(a=0, suspend=True, prefix=""), None)
    assert (s.restarts, s.r, s.epoch, s.jobset_uid_seen) == (0, 1, "1", None)


def test_foreign_flag_and_recorded_uid_are_reported():
    tj = trainjob(a=1, suspend=False)
    tj["metadata"]["annotations"][names.FOREIGN_ANNOTATION] = "cause"
    tj["metadata"]["annotations"][names.JOBSET_UID_ANNOTATION] = "u0"
    s = adapter.compute_status(tj, jobset(0, uid="u1"))
    assert (s.foreign, s.foreign_cause, s.jobset_uid, s.jobset_uid_seen) == (True, "cause", "u0", "u1")


def test_past_the_bound_has_no_epoch():
    s = adapter.compute_status(trainjob(a=999_999, suspend=False), jobset(1))
    assert s.epoch is None
