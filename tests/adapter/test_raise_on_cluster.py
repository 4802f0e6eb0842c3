"""The raise, open, release and hold against the real apiserver and the
real TrainJob CRD: racing writers, rewritten or deleted patches, refusals."""

from __future__ import annotations

import threading

import pytest

from tests.adapter import kit
from toolkit import adapter, detect, history, kube, names, paths, raising

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(api_client):
    return kube.from_api_client(api_client)


def test_sixteen_racing_raisers_land_every_raise_exactly_once(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    total = 100
    budget = iter(range(total))
    budget_lock = threading.Lock()
    results: list[adapter.Raised] = []
    errors: list[BaseException] = []
    seen: list[int] = []
    stop = threading.Event()

    def take() -> bool:
        with budget_lock:
            return next(budget, None) is not None

    def raiser() -> None:
        try:
            while take():
                results.append(adapter.raise_admission(client, namespace=namespace, name=name))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def watcher() -> None:
        # Every version the server holds, in order: A must never go down.
        while not stop.is_set():
            seen.append(raising.counts(client.get(paths.TRAINJOB, name=name, namespace=namespace)).current)

    threads = [threading.Thread(target=raiser) for _ in range(16)]
    watch_thread = threading.Thread(target=watcher)
    watch_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch_thread.join()

    assert not errors
    final = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert raising.counts(final) == raising.Counts(patch=total, floor=total)
    # No lost update: each raise returned a distinct A, and together 1..100.
    assert sorted(r.admission for r in results) == list(range(1, total + 1))
    conflicts = sum(r.conflicts for r in results)
    assert conflicts > 0, "16 writers on one object must have conflicted"
    assert seen == sorted(seen)
    print(f"raises={total} conflicts_retried={conflicts}")


def test_a_rewritten_lower_or_deleted_patch_does_not_lower_the_next_raise(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    for _ in range(3):
        adapter.raise_admission(client, namespace=namespace, name=name)

    def rewrite(obj):
        obj["spec"]["runtimePatches"] = [raising.patch_entry(1)]
        return obj, None

    client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=rewrite)
    assert adapter.raise_admission(client, namespace=namespace, name=name).admission == 4

    def delete(obj):
        obj["spec"]["runtimePatches"] = []
        return obj, None

    client.read_modify_write(paths.TRAINJOB, name=name, namespace=namespace, compute=delete)
    assert adapter.raise_admission(client, namespace=namespace, name=name).admission == 5
    final = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert raising.patch_admission(final) == 5


def test_a_deleted_floor_with_a_lowered_patch_does_not_bring_back_an_a_a_raise_handed_out(client, namespace):
    """One raise (A = 1), then, as `kubectl patch --type merge` would, the floor annotation deleted
    and our patch set to 0 in one update: the raise's own record in the history keeps the next
    raise above it."""
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    assert adapter.raise_admission(client, namespace=namespace, name=name).admission == 1
    client.merge_patch(paths.TRAINJOB, {"metadata": {"annotations": {names.FLOOR_ANNOTATION: None}},
                                        "spec": {"runtimePatches": [raising.patch_entry(0)]}},
                       name=name, namespace=namespace)
    lowered = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert raising.counts(lowered) == raising.Counts(patch=0, floor=None)
    assert adapter.raise_admission(client, namespace=namespace, name=name).admission == 2
    assert history.of(client.get(paths.TRAINJOB, name=name, namespace=namespace)).raised == 2


def test_open_raises_and_unsuspends_in_one_update_and_a_running_trainjob_is_not_raised(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    rv = tj["metadata"]["resourceVersion"]
    opened = adapter.open_(client, namespace=namespace, name=name)
    after = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert opened.admission == 1 and after["spec"]["suspend"] is False
    # one write: the resourceVersion moved exactly once past the create
    assert int(after["metadata"]["resourceVersion"]) > int(rv)
    assert after["metadata"]["generation"] == tj["metadata"]["generation"] + 1
    with pytest.raises(adapter.AdapterError, match="spec.suspend is false"):
        adapter.raise_admission(client, namespace=namespace, name=name)
    with pytest.raises(adapter.AdapterError, match="spec.suspend is false"):
        adapter.release(client, namespace=namespace, name=name)
    assert raising.counts(client.get(paths.TRAINJOB, name=name, namespace=namespace)).current == 1

    assert adapter.hold(client, namespace=namespace, name=name) is True
    assert adapter.hold(client, namespace=namespace, name=name) is False
    held = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert held["spec"]["suspend"] is True and raising.counts(held).current == 1
    assert adapter.release(client, namespace=namespace, name=name).admission == 2


def test_status_reports_a_floor_j_r_epoch_and_the_foreign_cause(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    js = kit.create_jobset(client, tj)
    kit.set_restarts(client, js, 2)
    st = adapter.status(client, namespace=namespace, name=name)
    # suspended: A, J, R and epoch are the next execution's (A 1 after the raise)
    assert (st.state, st.execution, st.admission, st.last_admission, st.floor, st.restarts, st.r) == (
        "suspended", "next", 1, 0, None, 2, 3)
    assert st.epoch == "1000002000003"
    # status recorded the JobSet's UID, as open and release do
    assert kit.annotations(client, namespace, name)[names.JOBSET_UID_ANNOTATION] == js["metadata"]["uid"]
    adapter.open_(client, namespace=namespace, name=name)
    st = adapter.status(client, namespace=namespace, name=name)
    assert (st.state, st.admission, st.floor, st.r, st.attempt) == ("running", 1, 1, 3, "job-1.2.0.1.2")
    assert st.foreign is False
    assert adapter.flag_foreign(
        client, namespace=namespace, name=name, violation=kit_violation("something reset")
    )
    st = adapter.status(client, namespace=namespace, name=name)
    assert (st.foreign, st.foreign_cause) == (True, "something reset")
    # the flag never stops anything
    assert client.get(paths.TRAINJOB, name=name, namespace=namespace)["spec"]["suspend"] is False
    assert client.get(paths.JOBSET, name=name, namespace=namespace)["metadata"]["uid"] == js["metadata"]["uid"]


def test_not_found_is_one_line(client, namespace):
    with pytest.raises(adapter.AdapterError, match=f"TrainJob {namespace}/nope not found"):
        adapter.open_(client, namespace=namespace, name="nope")


def kit_violation(detail: str):
    from toolkit import detect

    return detect.Violation("test", detail)


def test_the_foreign_annotation_keeps_each_cause_once(client, namespace):
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    assert adapter.flag_foreign(client, namespace=namespace, name=name, violation=kit_violation("a"))
    assert not adapter.flag_foreign(client, namespace=namespace, name=name, violation=kit_violation("a"))
    assert adapter.flag_foreign(client, namespace=namespace, name=name, violation=kit_violation("b"))
    assert kit.annotations(client, namespace, name)[names.FOREIGN_ANNOTATION] == "a\nb"
    events, _ = client.list(paths.EVENT, namespace=namespace, field_selector=f"reason={names.FOREIGN_REASON}")
    assert sorted(e["message"] for e in events) == ["a", "b"]
    assert all(e["type"] == "Warning" and e["involvedObject"]["kind"] == "TrainJob" for e in events)


def test_the_apiserver_stamps_each_raise_and_the_next_raise_keeps_the_stamp(client, namespace):
    """When each floor was set comes from the apiserver's clock: the raise's own field manager's
    managedFields time (no other write uses that manager), moved into the history at the next raise."""
    tj = kit.create_trainjob(client, namespace)
    name = tj["metadata"]["name"]
    created = tj["metadata"]["creationTimestamp"]
    adapter.raise_admission(client, namespace=namespace, name=name)
    first = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    stamp = raising.last_raise(first)
    assert stamp is not None and stamp[0] == 1 and stamp[1] >= created
    adapter.flag_foreign(client, namespace=namespace, name=name, component="test",
                         violation=detect.Violation("below-floor", "a write by another manager"))
    assert raising.last_raise(client.get(paths.TRAINJOB, name=name, namespace=namespace)) == stamp
    adapter.raise_admission(client, namespace=namespace, name=name)
    second = client.get(paths.TRAINJOB, name=name, namespace=namespace)
    assert history.of(second).floors == (stamp,)
    latest = raising.last_raise(second)
    assert latest is not None and latest[0] == 2 and latest[1] >= stamp[1]
    # A pod created more than the clock margin after the second raise is judged by floor 2; one
    # created within the margin of it, by the first raise's floor when that was more than the margin
    # before it.
    margin = detect.SKEW_SECONDS
    past_the_margin = detect.shifted(latest[1], margin + 1)
    assert raising.floor_when_created(second, past_the_margin) == latest
    within = detect.shifted(latest[1], margin)
    assert raising.floor_when_created(second, within) == (stamp if detect.after(within, stamp[1]) else None)
