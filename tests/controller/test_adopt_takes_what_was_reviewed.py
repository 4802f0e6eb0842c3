"""`toolkit adopt --reviewed`: an adoption clears only the causes the person read, and a flag that
the apiserver cannot take in full still goes out; on the real apiserver.

A person reads the causes (`toolkit status`, with their fingerprint), decides, and adopts with
that fingerprint. A cause flagged meanwhile (a repeat while they were deciding) changes it: the
update that would clear the flag is refused, in one line that says how many causes there are now
and their fingerprint, so the person reads them again."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.adapter import kit
from toolkit import adapter, causes, cli, detect, flagmark, history, kube, listing, names, paths

pytestmark = pytest.mark.cluster

FIRST = detect.Violation("jobset-uid", "JobSet UID b is not the recorded a: J may have been reset")
LATER = detect.Violation("r-repeat", "pod p-1 runs A=1 J=0, R 1, not above the highest R 2 of an earlier execution: "
                                     "its epoch repeats or goes back \U0001F600")


def _toolkit(control_plane, *args):
    return CliRunner().invoke(cli.root, list(args), env={"KUBECONFIG": control_plane.kubeconfig}, prog_name="toolkit")


def _flagged(admin, namespace, *violations):
    name = kit.create_trainjob(admin, namespace)["metadata"]["name"]
    for violation in violations:
        adapter.flag_foreign(admin, namespace=namespace, name=name, violation=violation)
    return name


def _refusal(namespace, name, *, reviewed, count, now):
    return (f"TrainJob {namespace}/{name}: the causes changed since they were reviewed ({reviewed}): {count} cause(s) "
            f"now, fingerprint {now}; read `toolkit status {name} -n {namespace}` again, then adopt with it")


def test_a_cause_flagged_after_the_fingerprint_was_read_refuses_the_adoption(admin, namespace):
    name = _flagged(admin, namespace, FIRST)
    reviewed = adapter.status(admin, namespace=namespace, name=name).foreign_fingerprint
    adapter.flag_foreign(admin, namespace=namespace, name=name, violation=LATER)  # while the person decides
    now = adapter.status(admin, namespace=namespace, name=name).foreign_fingerprint
    assert now != reviewed
    with pytest.raises(adapter.AdapterError) as refused:
        adapter.adopt(admin, namespace=namespace, name=name, reason="checked", reviewed=reviewed)
    assert str(refused.value) == _refusal(namespace, name, reviewed=reviewed, count=2, now=now)
    kept = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert kept["metadata"]["annotations"][names.FOREIGN_ANNOTATION].split("\n") == [FIRST.detail, LATER.detail]
    assert flagmark.is_labelled(kept) and history.of(kept).adoptions == ()
    done = adapter.adopt(admin, namespace=namespace, name=name, reason="both read", reviewed=now)
    assert done.causes == [FIRST.detail, LATER.detail]
    assert not flagmark.is_flagged(admin.get(paths.TRAINJOB, name=name, namespace=namespace))


def test_a_cause_that_lands_between_adopts_read_and_its_write_refuses_it(admin, namespace, monkeypatch):
    """The fingerprint is compared in the update that clears the flag: the cause's write makes
    adopt's write conflict (409), and the TrainJob read again no longer holds what was reviewed."""
    name = _flagged(admin, namespace, FIRST)
    reviewed = adapter.status(admin, namespace=namespace, name=name).foreign_fingerprint
    replace = admin.replace
    raced: list[str] = []

    def racing(res, obj, **kw):
        if res == paths.TRAINJOB and not raced:
            raced.append("flagged")
            monkeypatch.setattr(admin, "replace", replace)  # the controller's write goes straight through
            adapter.flag_foreign(admin, namespace=namespace, name=name, violation=LATER)
            monkeypatch.setattr(admin, "replace", racing)
        return replace(res, obj, **kw)

    monkeypatch.setattr(admin, "replace", racing)
    with pytest.raises(adapter.AdapterError, match=r"the causes changed since they were reviewed .*: 2 cause\(s\) now"):
        adapter.adopt(admin, namespace=namespace, name=name, reason="checked", reviewed=reviewed)
    assert raced == ["flagged"]
    assert flagmark.is_flagged(admin.get(paths.TRAINJOB, name=name, namespace=namespace))


def test_a_wrong_fingerprint_is_one_line_and_exit_1_and_a_malformed_one_exit_2(control_plane, admin, namespace):
    name = _flagged(admin, namespace, FIRST)
    shown = _toolkit(control_plane, "status", name, "-n", namespace)
    now = causes.fingerprint(causes.Causes(kept=[FIRST.detail]))
    assert shown.exit_code == 0 and f"{now} (toolkit adopt --reviewed {now})" in shown.stdout
    listed = _toolkit(control_plane, "executions", name, "-n", namespace, "-o", "json")
    assert json.loads(listed.stdout)["foreign_fingerprint"] == now
    wrong = _toolkit(control_plane, "adopt", name, "-n", namespace, "--reason", "checked", "--reviewed", "0" * 12)
    assert (wrong.exit_code, wrong.stdout) == (1, "")
    assert wrong.stderr == "toolkit adopt: " + _refusal(namespace, name, reviewed="0" * 12, count=1, now=now) + "\n"
    malformed = _toolkit(control_plane, "adopt", name, "-n", namespace, "--reason", "checked", "--reviewed", "abc")
    assert malformed.exit_code == 2 and malformed.stderr.count("\n") == 1 and "--reviewed" in malformed.stderr
    assert flagmark.is_flagged(admin.get(paths.TRAINJOB, name=name, namespace=namespace))
    done = _toolkit(control_plane, "adopt", name, "-n", namespace, "--reason", "checked", "--reviewed", now)
    assert done.exit_code == 0, done.output


def _crowded(admin, namespace, notes: int) -> str:
    """A TrainJob whose others' annotations leave ours little of the apiserver's 256 KiB."""
    body = kit.trainjob_body(f"crowded-{notes}")
    body["metadata"]["annotations"] = {"example.com/notes": "t" * notes}
    kit.ensure_runtime(admin, namespace)
    return admin.create(paths.TRAINJOB, body, namespace=namespace)["metadata"]["name"]


def test_a_flag_the_apiserver_refuses_goes_out_as_the_label_and_a_warning(admin, namespace):
    name = _crowded(admin, namespace, 256 * 1024 - 2000)
    big = detect.Violation("r-repeat", "a cause the object has no room for " + "\U0001F600" * 1500)
    assert adapter.flag_foreign(admin, namespace=namespace, name=name, violation=big)
    after = admin.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert flagmark.is_labelled(after) and flagmark.is_flagged(after)
    assert names.FOREIGN_ANNOTATION not in after["metadata"]["annotations"]
    events, _ = admin.list(paths.EVENT, namespace=namespace, field_selector=f"reason={names.FOREIGN_REASON}")
    (event,) = [e for e in events if e["involvedObject"]["name"] == name]
    assert event["type"] == "Warning" and event["message"].startswith("a cause the object has no room for")
    assert name in [r.name for r in listing.rows(admin, namespace=namespace, foreign=True, label_selector=None)]


def test_a_record_the_apiserver_refuses_is_one_line_naming_the_budget(admin, namespace):
    name = _crowded(admin, namespace, 256 * 1024 - 200)
    obs = history.Observation(a=1, j=0, jobset_uid="u", epoch=None, attempt=None, pod="p-1", time=kit.now(),
                              ended=None, verdict="ok")
    with pytest.raises(adapter.AnnotationsRefused) as refused:
        adapter.record_execution(admin, namespace=namespace, name=name, observation=obs)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"TrainJob {namespace}/{name}: annotations not written (")
    assert f"budget {history.BUDGET}" in message and "the apiserver refused" in message
    assert isinstance(refused.value, adapter.AdapterError) and not isinstance(refused.value, kube.ApiError)
