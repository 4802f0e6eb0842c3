"""The execution history the controller keeps on the TrainJob, `toolkit
executions` and `toolkit adopt`, on the real apiserver with the controller as
a real process under its shipped RBAC (the test plays Trainer, JobSet and the
kubelet: it writes the JobSet, the pods and their phases).

The story: an execution, a rank failure (JobSet restart), the controller
killed and restarted, a hold and a release, a JobSet deleted by hand; then a
person adopts, and the next execution's epoch is above every earlier one."""

from __future__ import annotations

import datetime
import json
import signal
import time
import types

import pytest
from click.testing import CliRunner

from tests.adapter import kit
from tests.controller.conftest import wait_until
from toolkit import adapter, cli, detect, history, names, paths, raising

pytestmark = pytest.mark.cluster


def _rows(admin, namespace, name):
    h = history.of(admin.get(paths.TRAINJOB, name=name, namespace=namespace))
    return [(e.a, e.j, e.r, e.ended, e.verdict) for e in h.executions]


def _foreign(admin, namespace, name):
    return kit.annotations(admin, namespace, name).get(names.FOREIGN_ANNOTATION)


def _toolkit(control_plane, *args):
    env = {"KUBECONFIG": control_plane.kubeconfig}
    return CliRunner().invoke(cli.root, list(args), env=env, prog_name="toolkit")


def _reviewed(control_plane, namespace, name):
    """The causes' fingerprint as a person reads it: `toolkit status`."""
    shown = _toolkit(control_plane, "status", name, "-n", namespace, "-o", "json")
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.stdout)["foreign_fingerprint"]


def _seen(admin, namespace, name):
    """The causes' fingerprint as `adapter.status` gives it to a script."""
    return adapter.status(admin, namespace=namespace, name=name).foreign_fingerprint


def test_the_history_follows_the_story_survives_a_controller_restart_and_adopt_restores_increasing_epochs(
        control_plane, admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    js = kit.create_jobset(admin, tj)
    uid = js["metadata"]["uid"]
    adapter.open_(admin, namespace=namespace, name=name)  # A 1
    ctl = start_controller()
    p1 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", jobset_uid=uid)["metadata"]["name"]
    wait_until(lambda: _rows(admin, namespace, name) == [(1, 0, 1, None, "ok")], what="first execution")
    # a rank fails: JobSet restarts (J 1)
    kit.set_phase(admin, namespace=namespace, pod=p1, phase="Failed")
    wait_until(lambda: _rows(admin, namespace, name) == [(1, 0, 1, "failed", "ok")], what="how it ended")
    kit.set_restarts(admin, admin.get(paths.JOBSET, name=name, namespace=namespace), 1)
    p2 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", restart="1",
                        jobset_uid=uid)["metadata"]["name"]
    wait_until(lambda: len(_rows(admin, namespace, name)) == 2, what="second execution")
    # the controller dies mid-story; a new one carries on from what is on the TrainJob
    assert ctl.stop(signal.SIGKILL) != 0
    start_controller()
    adapter.hold(admin, namespace=namespace, name=name)
    kit.delete_pod(admin, namespace=namespace, pod=p2)
    adapter.release(admin, namespace=namespace, name=name)  # A 2
    p3 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="2", restart="1",
                        jobset_uid=uid)["metadata"]["name"]
    wait_until(lambda: [r[:3] for r in _rows(admin, namespace, name)] == [(1, 0, 1), (1, 1, 2), (2, 1, 3)],
               what="three executions")
    assert history.of(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).high_water == 3
    assert _foreign(admin, namespace, name) is None
    # the JobSet is deleted by hand; Trainer builds a new one with J 0: R 2 repeats
    admin.delete(paths.JOBSET, name=name, namespace=namespace)
    js2 = kit.create_jobset(admin, tj)
    p4 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="2",
                        jobset_uid=js2["metadata"]["uid"])["metadata"]["name"]
    wait_until(lambda: _foreign(admin, namespace, name), what="the flag")
    flagged = wait_until(lambda: (rows := _rows(admin, namespace, name)) and len(rows) == 4 and rows, what="4 rows")
    # ordered by R: the repeat sits beside the R it repeats
    assert [row[:3] for row in flagged] == [(1, 0, 1), (1, 1, 2), (2, 0, 2), (2, 1, 3)]
    assert flagged[2][4].startswith("foreign: ")

    shown = _toolkit(control_plane, "executions", name, "-n", namespace, "-o", "json")
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert [(e["a"], e["j"], e["r"]) for e in doc["history"]["executions"]] == [(1, 0, 1), (1, 1, 2), (2, 0, 2), (2, 1, 3)]
    assert doc["history"]["high_water"] == 3 and doc["foreign_causes"]
    text = _toolkit(control_plane, "executions", name, "-n", namespace)
    assert text.exit_code == 0 and "high-water R: 3" in text.stdout and "foreign:" in text.stdout
    assert "1000002000003" in text.stdout  # the epoch of R 3 (kit's prefix)

    causes = _foreign(admin, namespace, name).split("\n")
    adopted = _toolkit(control_plane, "adopt", name, "-n", namespace, "--reason", "JobSet deleted by hand; checked",
                       "--reviewed", _reviewed(control_plane, namespace, name))
    assert adopted.exit_code == 0, adopted.output
    assert "next execution: A 4, R 4, epoch 1000002000004 (above the high-water R 3)" in adopted.stdout
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert names.FOREIGN_ANNOTATION not in after["metadata"]["annotations"]
    assert after["metadata"]["annotations"][names.JOBSET_UID_ANNOTATION] == js2["metadata"]["uid"]
    assert after["spec"]["suspend"] is True  # plain mode: held, so that the next execution is raised
    (record,) = history.of(after).adoptions
    assert (record.reason, record.causes, record.high_water) == ("JobSet deleted by hand; checked", causes, 3)
    events, _ = admin.list(paths.EVENT, namespace=namespace, field_selector=f"reason={adapter.ADOPTED_REASON}")
    assert [e["type"] for e in events if e["involvedObject"]["name"] == name] == ["Normal"]

    # the held execution's pods go; the release is raised above the mark
    for pod in (p3, p4):
        kit.delete_pod(admin, namespace=namespace, pod=pod)
    assert adapter.release(admin, namespace=namespace, name=name).admission == 4
    kit.create_pod(admin, namespace=namespace, trainjob=name, admission="4", jobset_uid=js2["metadata"]["uid"])
    wait_until(lambda: (4, 0, 4, None, "ok") in _rows(admin, namespace, name), what="the adopted execution")
    assert _foreign(admin, namespace, name) is None
    h = history.of(admin.get(paths.TRAINJOB, name=name, namespace=namespace))
    assert h.high_water == 4 and max(e.r for e in h.executions if (e.a, e.j) != (4, 0)) < 4

    refused = _toolkit(control_plane, "adopt", name, "-n", namespace, "--reason", "again", "--reviewed", "0" * 12)
    assert (refused.exit_code, refused.stdout) == (1, "")
    assert refused.stderr == (f"toolkit adopt: TrainJob {namespace}/{name} is not flagged foreign "
                              f"({names.FOREIGN_ANNOTATION} absent): nothing to adopt\n")


def test_adopt_after_a_rewritten_patch_raises_the_next_execution_above_the_mark(admin, namespace, start_controller):
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    uid = kit.create_jobset(admin, tj)["metadata"]["uid"]
    adapter.open_(admin, namespace=namespace, name=name)  # A 1
    start_controller()
    p1 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", jobset_uid=uid)["metadata"]["name"]
    adapter.hold(admin, namespace=namespace, name=name)
    kit.delete_pod(admin, namespace=namespace, pod=p1)
    adapter.release(admin, namespace=namespace, name=name)  # A 2
    p2 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="2", jobset_uid=uid)["metadata"]["name"]
    wait_until(lambda: history.of(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).high_water == 2,
               what="mark 2")
    adapter.hold(admin, namespace=namespace, name=name)
    kit.delete_pod(admin, namespace=namespace, pod=p2)

    # someone rewrites our patch to A 1 and unsuspends by hand: R 1 repeats
    def rewrite(obj):
        obj["spec"]["runtimePatches"] = [raising.patch_entry(1)]
        obj["spec"]["suspend"] = False
        return obj, None

    admin.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=rewrite)
    p3 = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", jobset_uid=uid)["metadata"]["name"]
    assert "below the floor 2" in wait_until(lambda: _foreign(admin, namespace, name), what="flag")
    done = adapter.adopt(admin, namespace=namespace, name=name, reason="patch rewritten by a script; fixed",
                         reviewed=_seen(admin, namespace, name))
    assert (done.held, done.high_water, done.minimum, done.next_r) == (True, 2, 3, 3)
    kit.delete_pod(admin, namespace=namespace, pod=p3)
    assert adapter.release(admin, namespace=namespace, name=name).admission == 3


def test_adopt_is_refused_for_a_trainjob_that_is_not_ours(control_plane, admin, namespace):
    body = kit.trainjob_body("theirs")
    body["spec"].pop("runtimePatches")
    admin.create(paths.TRAINJOB, body, namespace=namespace)
    refused = _toolkit(control_plane, "adopt", "theirs", "-n", namespace, "--reason", "x", "--reviewed", "0" * 12)
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1
    assert "is not a dispatch TrainJob" in refused.stderr
    empty = _toolkit(control_plane, "adopt", "theirs", "-n", namespace, "--reason", "  ", "--reviewed", "0" * 12)
    assert empty.exit_code == 2 and "--reason" in empty.stderr and empty.stderr.count("\n") == 1


def test_adopt_in_kueue_mode_requeues_the_running_trainjob_through_the_check(admin, namespace):
    from controller import admission

    check = f"dispatch-{namespace}"
    kit.create_admission_check(admin, check)
    body = kit.trainjob_body("queued")
    body["metadata"]["labels"] = {names.KUEUE_QUEUE_LABEL: "lq"}
    kit.ensure_runtime(admin, namespace)
    tj = admin.create(paths.TRAINJOB, body, namespace=namespace)
    wl = kit.create_workload(admin, tj)
    reserved = kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    adapter.raise_admission(admin, namespace=namespace, name="queued")
    admin.replace(paths.WORKLOAD, admission.with_check_ready(reserved, checks=[check], admission=1), subresource="status")
    kit.set_suspend(admin, namespace, "queued", False)  # Kueue admits
    adapter.flag_foreign(admin, namespace=namespace, name="queued",
                         violation=detect.Violation("x", "a reset"))
    done = adapter.adopt(admin, namespace=namespace, name="queued", reason="checked",
                         reviewed=_seen(admin, namespace, "queued"))
    assert (done.held, done.requeued) == (False, [wl["metadata"]["name"]])
    entry = kit.check_entry(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    assert entry["state"] == "Retry"  # Kueue evicts; the next admission goes through our check
    assert admin.get(paths.TRAINJOB, name="queued", namespace=namespace)["spec"]["suspend"] is False


def test_a_preemption_and_readmission_is_a_new_execution_in_the_history(admin, namespace, start_controller):
    """Kueue mode: the check raises A at each admission; the pods of each
    admission are one execution each, the preempted one ended as stopped."""
    check = f"dispatch-{namespace}"
    kit.create_admission_check(admin, check)
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    admin.merge_patch(paths.TRAINJOB, {"metadata": {"labels": {names.KUEUE_QUEUE_LABEL: "lq"}}}, name=name,
                      namespace=namespace)  # Kueue mode: Kueue, not a raise, unsuspends it
    uid = kit.create_jobset(admin, tj)["metadata"]["uid"]
    wl = kit.create_workload(admin, tj)["metadata"]["name"]
    start_controller()
    for a in (1, 2):
        kit.kueue_reserve(admin, namespace=namespace, name=wl, check=check)
        wait_until(lambda: kit.check_entry(admin, namespace=namespace, name=wl, check=check).get("state") == "Ready",
                   what="Ready")
        kit.set_suspend(admin, namespace, name, False)  # Kueue admits
        pod = kit.create_pod(admin, namespace=namespace, trainjob=name, admission=str(a),
                             jobset_uid=uid)["metadata"]["name"]
        wait_until(lambda: (a, 0, a, None, "ok") in _rows(admin, namespace, name), what=f"execution A {a}")
        kit.kueue_evict(admin, namespace=namespace, name=wl, check=check)  # preempted
        kit.set_suspend(admin, namespace, name, True)
        admin.merge_patch(paths.POD, {"metadata": {"finalizers": ["dispatch.phpboyscout.uk/test"]}}, name=pod,
                          namespace=namespace)
        kit.delete_pod(admin, namespace=namespace, pod=pod)  # terminating: held by the finalizer
        wait_until(lambda: (a, 0, a, "stopped", "ok") in _rows(admin, namespace, name), what="stopped")
        admin.merge_patch(paths.POD, {"metadata": {"finalizers": None}}, name=pod, namespace=namespace)
    assert history.of(admin.get(paths.TRAINJOB, name=name, namespace=namespace)).high_water == 2
    assert _foreign(admin, namespace, name) is None


def test_an_unreadable_history_is_flagged_kept_as_found_and_never_overwritten(admin, namespace, start_controller):
    """Someone writes the history annotation over with text that is not a history: the mark it
    held is unknown. The controller flags the TrainJob, records nothing over it (a new history
    would start the mark from the next execution, lower), and adopt refuses until a person has
    repaired it."""
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    uid = kit.create_jobset(admin, tj)["metadata"]["uid"]
    adapter.open_(admin, namespace=namespace, name=name)
    start_controller()
    kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", jobset_uid=uid)
    wait_until(lambda: _rows(admin, namespace, name) == [(1, 0, 1, None, "ok")], what="the first execution")
    admin.merge_patch(paths.TRAINJOB, {"metadata": {"annotations": {history.HISTORY_ANNOTATION: "{not json"}}},
                      name=name, namespace=namespace)
    kit.set_restarts(admin, admin.get(paths.JOBSET, name=name, namespace=namespace), 1)
    kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", restart="1", jobset_uid=uid)
    flagged = wait_until(lambda: _foreign(admin, namespace, name), what="the flag")
    assert flagged.startswith(f"TrainJob annotation {history.HISTORY_ANNOTATION} is not a history dispatch wrote")
    assert kit.annotations(admin, namespace, name)[history.HISTORY_ANNOTATION] == "{not json"
    with pytest.raises(adapter.AdapterError, match="is unreadable, so the high-water mark of R is unknown"):
        adapter.adopt(admin, namespace=namespace, name=name, reason="checked", reviewed=_seen(admin, namespace, name))
    assert kit.annotations(admin, namespace, name)[history.HISTORY_ANNOTATION] == "{not json"


def test_an_adoption_is_timed_by_the_apiserver_not_by_the_operators_clock(admin, namespace, start_controller,
                                                                           monkeypatch):
    """`toolkit adopt` run on a laptop whose clock is ten minutes fast: a pod created after the
    adoption, below the floor, is still judged (the exemption of the adopted execution's pods
    ends at the apiserver's time of the adoption, not the laptop's)."""
    tj = kit.create_trainjob(admin, namespace)
    name = tj["metadata"]["name"]
    uid = kit.create_jobset(admin, tj)["metadata"]["uid"]
    adapter.open_(admin, namespace=namespace, name=name)
    start_controller()
    first = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", jobset_uid=uid)
    wait_until(lambda: _rows(admin, namespace, name) == [(1, 0, 1, None, "ok")], what="the first execution")
    adapter.flag_foreign(admin, namespace=namespace, name=name, violation=detect.Violation("x", "a reset"))

    class Fast(datetime.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return datetime.datetime.now(tz) + datetime.timedelta(minutes=10)

    reviewed = _seen(admin, namespace, name)
    monkeypatch.setattr(detect, "datetime", types.SimpleNamespace(datetime=Fast, timezone=datetime.timezone))
    adapter.adopt(admin, namespace=namespace, name=name, reason="checked", reviewed=reviewed)  # held: plain mode
    monkeypatch.undo()
    time.sleep(1.1)  # the apiserver's times are to the second: a pod of the same second is not judged
    kit.delete_pod(admin, namespace=namespace, pod=first["metadata"]["name"])
    assert adapter.release(admin, namespace=namespace, name=name).admission == 2
    below = kit.create_pod(admin, namespace=namespace, trainjob=name, admission="1", jobset_uid=uid)
    cause = f"pod {below['metadata']['name']} has admission 1, below the floor 2: A may have been lowered"
    wait_until(lambda: cause in (_foreign(admin, namespace, name) or "").split("\n"), what="the below-floor flag")
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert history.of(after).adoptions[-1].time == history.adopted_at(after)


def test_adopt_re_queues_through_the_checks_of_the_controller_name_it_is_given(control_plane, admin, namespace):
    """The controller serves a controllerName of its own choosing (its --controller-name); a CLI
    cannot read its settings, so adopt takes that name (or the checks by name) and re-queues
    through the AdmissionChecks that carry it."""
    from controller import admission

    served = "example.com/our-admission-check"
    check = f"ours-{namespace}"
    admin.create(paths.ADMISSION_CHECK, {"metadata": {"name": check}, "spec": {"controllerName": served}})
    body = kit.trainjob_body("queued")
    body["metadata"]["labels"] = {names.KUEUE_QUEUE_LABEL: "lq"}
    kit.ensure_runtime(admin, namespace)
    tj = admin.create(paths.TRAINJOB, body, namespace=namespace)
    wl = kit.create_workload(admin, tj)
    reserved = kit.kueue_reserve(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)
    adapter.raise_admission(admin, namespace=namespace, name="queued")
    admin.replace(paths.WORKLOAD, admission.with_check_ready(reserved, checks=[check], admission=1), subresource="status")
    kit.set_suspend(admin, namespace, "queued", False)  # Kueue admits
    adapter.flag_foreign(admin, namespace=namespace, name="queued", violation=detect.Violation("x", "a reset"))
    done = _toolkit(control_plane, "adopt", "queued", "-n", namespace, "--reason", "checked",
                    "--reviewed", _reviewed(control_plane, namespace, "queued"), "--controller-name", served)
    assert done.exit_code == 0, done.output
    assert f"re-queued through the admission check: {wl['metadata']['name']}" in done.output
    assert kit.check_entry(admin, namespace=namespace, name=wl["metadata"]["name"], check=check)["state"] == "Retry"
