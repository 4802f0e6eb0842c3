"""The raise as pure logic (toolkit.raising): max(patch, floor) + 1 into
both places, never lower, never on a running TrainJob, never mutating the
object read."""

import copy

import hypothesis
import hypothesis.strategies as st
import pytest

from tests import mergepatch
from toolkit import history, names, raising


def trainjob(*, patch: str | None = "0", floor: str | None = None, suspend: bool = True, other: bool = False) -> dict:
    tj: dict = {"metadata": {"name": "tj", "namespace": "ns", "annotations": {}}, "spec": {"suspend": suspend}}
    patches = []
    if other:
        patches.append({"manager": "someone-else", "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"x": "y"}}}}})
    if patch is not None:
        entry = raising.patch_entry(0)
        ann = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"]
        ann[names.ADMISSION_ANNOTATION] = patch
        patches.append(entry)
    tj["spec"]["runtimePatches"] = patches
    if floor is not None:
        tj["metadata"]["annotations"][names.FLOOR_ANNOTATION] = floor
    return tj


def test_first_raise_from_zero_gives_one_in_patch_and_floor():
    new, a = raising.raised(trainjob())
    assert a == 1
    assert raising.patch_admission(new) == 1
    assert new["metadata"]["annotations"][names.FLOOR_ANNOTATION] == "1"


@pytest.mark.parametrize(
    ("patch", "floor", "expected"),
    [
        ("3", "3", 4),
        ("1", "7", 8),  # patch rewritten lower: the floor wins
        (None, "5", 6),  # patch deleted: the floor wins, the entry is rebuilt
        ("9", "2", 10),  # floor rewritten lower: the patch wins
        ("007", "4", 5),  # unreadable patch reads as absent
        ("2", "x", 3),  # malformed floor reads as absent
        (None, None, 1),
    ],
)
def test_raise_is_max_of_patch_and_floor_plus_one(patch, floor, expected):
    new, a = raising.raised(trainjob(patch=patch, floor=floor))
    assert a == expected
    assert raising.counts(new) == raising.Counts(patch=expected, floor=expected)


def test_running_trainjob_is_refused():
    with pytest.raises(raising.RaiseRefused, match="spec.suspend is false"):
        raising.raised(trainjob(suspend=False))


def test_unsuspend_is_in_the_same_object():
    new, a = raising.raised(trainjob(patch="2", floor="2"), unsuspend=True)
    assert new["spec"]["suspend"] is False and a == 3


def test_the_bound_of_a_is_refused():
    with pytest.raises(raising.RaiseRefused, match="above the bound 999999"):
        raising.raised(trainjob(patch="999999", floor="999999"))


def test_other_managers_entries_and_the_input_are_untouched():
    tj = trainjob(other=True, floor="1", patch="1")
    before = copy.deepcopy(tj)
    new, _ = raising.raised(tj, record=("k", "v"))
    assert tj == before
    assert new["spec"]["runtimePatches"][0] == before["spec"]["runtimePatches"][0]
    assert new["metadata"]["annotations"]["k"] == "v"


@hypothesis.given(
    st.lists(
        st.one_of(
            st.just(("raise",)),
            st.tuples(st.just("rewrite"), st.integers(0, 50)),
            st.just(("delete",)),
            st.tuples(st.just("floor"), st.integers(0, 50)),
            st.just(("floor-deleted",)),
        ),
        max_size=40,
    )
)
def test_a_written_by_raises_strictly_increases_whatever_is_rewritten_between(ops):
    """Our patch rewritten or deleted, the floor rewritten or deleted, in any order and together:
    the history the raise itself keeps (`raised`) holds every A a raise wrote."""
    tj = trainjob()
    written = []
    for op in ops:
        annotations = tj["metadata"]["annotations"]
        if op[0] == "raise":
            tj, a = raising.raised(tj)
            written.append(a)
        elif op[0] == "rewrite":
            tj["spec"]["runtimePatches"] = [raising.patch_entry(op[1])]
        elif op[0] == "delete":
            tj["spec"]["runtimePatches"] = []
        elif op[0] == "floor":
            annotations[names.FLOOR_ANNOTATION] = str(op[1])
        else:
            annotations.pop(names.FLOOR_ANNOTATION, None)
    assert written == sorted(set(written))


def test_an_adoption_minimum_lifts_the_next_raise_and_is_spent_by_it():
    tj = trainjob(patch="3", floor="3")
    tj["metadata"]["annotations"]["dispatch.phpboyscout.uk/admission-minimum"] = "9"
    assert raising.counts(tj).next == 9
    out, new = raising.raised(tj)
    assert new == 9
    assert raising.counts(out) == raising.Counts(patch=9, floor=9)
    assert "dispatch.phpboyscout.uk/admission-minimum" not in out["metadata"]["annotations"]
    # a minimum at or below the floor changes nothing
    tj["metadata"]["annotations"]["dispatch.phpboyscout.uk/admission-minimum"] = "2"
    assert raising.raised(tj)[1] == 4


def test_a_deleted_floor_and_a_lowered_patch_cannot_lower_a_below_what_the_history_holds():
    """The floor annotation deleted and our patch set back to 0: the history still holds the
    raises' floors and the executions' A, and the raise goes above the highest of them."""
    from toolkit import history

    tj = trainjob(patch="0", floor=None)
    kept = history.History(
        executions=(history.Execution(a=2, j=1, jobset_uid="js", r=3, epoch=None, attempt=None, first_pod="p",
                                      first_seen="2026-01-01T00:00:00Z", last_seen="2026-01-01T00:00:00Z",
                                      ended="stopped", verdict="ok"),),
        high_water=3, floors=((3, "2026-01-01T00:00:01Z"),))
    tj["metadata"]["annotations"][history.HISTORY_ANNOTATION] = history.render(kept)
    _, a = raising.raised(tj)
    assert a == 4


def test_a_raise_keeps_an_unreadable_history_as_found():
    from toolkit import history

    tj = trainjob(patch="1", floor="1")
    tj["metadata"]["annotations"][history.HISTORY_ANNOTATION] = "{not json"
    tj["metadata"]["managedFields"] = [{"manager": names.RAISE_FIELD_MANAGER, "operation": "Update",
                                        "time": "2026-01-01T00:00:00Z"}]
    new, a = raising.raised(tj)
    assert a == 2 and new["metadata"]["annotations"][history.HISTORY_ANNOTATION] == "{not json"


def test_the_raise_as_a_merge_patch_sends_every_runtime_patch_and_the_version_read():
    """A merge patch replaces a list whole: the raise's sends spec.runtimePatches with the other
    manager's entry as read, and the resourceVersion read as its precondition."""
    tj = trainjob(patch="2", other=True)
    tj["metadata"]["resourceVersion"] = "41"
    tj["metadata"]["annotations"][history.MINIMUM_ANNOTATION] = "1"
    after, admission = raising.raised(tj, record=(names.RAISED_FOR_ANNOTATION, "w/1/2"))
    patch = raising.merge_patch_of(tj, after)
    assert admission == 3
    assert patch["metadata"]["resourceVersion"] == "41"
    assert [p["manager"] for p in patch["spec"]["runtimePatches"]] == ["someone-else", names.PATCH_MANAGER]
    assert "suspend" not in patch["spec"]
    assert mergepatch.applied(tj, patch) == {**after, "metadata": {**after["metadata"], "resourceVersion": "41"}}


def test_a_copy_without_a_resource_version_is_refused_as_a_merge_patch():
    tj = trainjob()
    after, _ = raising.raised(tj)
    with pytest.raises(ValueError, match="preconditioned on the resourceVersion read"):
        raising.merge_patch_of(tj, after)


_VALUES = st.recursive(st.one_of(st.integers(0, 3), st.text(max_size=2), st.lists(st.integers(0, 2), max_size=2)),
                       lambda inner: st.dictionaries(st.sampled_from("abc"), inner, max_size=3), max_leaves=8)
_OBJECTS = st.dictionaries(st.sampled_from("abc"), _VALUES, max_size=3)


@hypothesis.given(old=_OBJECTS, new=_OBJECTS)
def test_the_merge_diff_applied_gives_the_new_object(old, new):
    assert mergepatch.applied(old, raising.merge_diff(old, new)) == new
