"""The identity a TrainJob made by the SDK or kubectl is given (toolkit/derive.py): a TrainJob made
again under the same name gets epochs above every epoch of the earlier one and other attempt
tokens; the counter refuses what it did not write and stops at the epoch's bound."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit import derive, history, identity, names, raising, wrap

NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-"


def derived(name: str = "mnist", namespace: str = "team-a") -> dict:
    """A TrainJob as the admission policy leaves it: marked derived, our entry with A = 0."""
    return {"metadata": {"name": name, "namespace": namespace,
                         "annotations": {names.DERIVED_ANNOTATION: "admission-policy"}},
            "spec": {"suspend": True, "runtimePatches": [raising.patch_entry(0)]}}


def epochs_and_tokens(trainjob: dict, rs: list[int]) -> tuple[list[int], set[str]]:
    """What its executions see, computed from what was written, as the prologue does."""
    prefix = derive.pod_annotation(trainjob, names.EPOCH_PREFIX_ANNOTATION)
    token = derive.pod_annotation(trainjob, names.TOKEN_PREFIX_ANNOTATION)
    assert prefix is not None and token
    return ([identity.epoch_from_prefix(prefix=prefix, r=r) for r in rs],
            {f"{token}.{r}.0" for r in rs})


@given(first=st.integers(1, identity.MAX_GENERATION - 1), later=st.integers(1, 1000),
       rs=st.lists(st.integers(1, 10**6 - 1), min_size=1, max_size=5),
       name=st.text(NAME_CHARS, min_size=1, max_size=20))
def test_made_again_under_its_name_it_runs_above_the_earlier_one(first: int, later: int, rs: list[int],
                                                                  name: str) -> None:
    second = min(first + later, identity.MAX_GENERATION)
    earlier = derive.with_identity(derived(name), generation=first)
    again = derive.with_identity(derived(name), generation=second)
    old_epochs, old_tokens = epochs_and_tokens(earlier, rs)
    new_epochs, new_tokens = epochs_and_tokens(again, [1])
    assert max(old_epochs) < min(new_epochs)
    assert old_tokens.isdisjoint(new_tokens)


def test_the_counter_rises_per_namespace_and_keeps_the_others() -> None:
    g, data = derive.next_generation(None, "team-a")
    assert (g, data) == (1, {"team-a": "1"})
    g, data = derive.next_generation(data, "team-a")
    assert (g, data) == (2, {"team-a": "2"})
    g, data = derive.next_generation(data, "team-b")
    assert (g, data) == (1, {"team-a": "2", "team-b": "1"})


@pytest.mark.parametrize("value", ["", "-1", "01", "1e3", " 1", "x", "99999999"])
def test_the_counter_refuses_a_value_it_did_not_write(value: str) -> None:
    with pytest.raises(derive.DeriveError, match="key team-a: .* is not a generation"):
        derive.next_generation({"team-a": value}, "team-a")


def test_the_counter_stops_at_the_epochs_bound() -> None:
    g, _ = derive.next_generation({"ns": str(identity.MAX_GENERATION - 1)}, "ns")
    assert g == identity.MAX_GENERATION
    with pytest.raises(derive.DeriveError, match=f"reached its bound {identity.MAX_GENERATION}"):
        derive.next_generation({"ns": str(identity.MAX_GENERATION)}, "ns")


def test_the_identity_is_what_toolkit_start_writes_and_keeps_a() -> None:
    trainjob = derived()
    trainjob["spec"]["runtimePatches"] = [raising.patch_entry(3)]
    before = copy.deepcopy(trainjob)
    out = derive.with_identity(trainjob, generation=7)
    assert trainjob == before, "the input is not modified"
    annotations = out["metadata"]["annotations"]
    assert {k: annotations[k] for k in (names.JOB_ID_ANNOTATION, names.GENERATION_ANNOTATION,
                                        names.SUBMISSION_ANNOTATION, names.ATTEMPT_ANNOTATION)} == {
        names.JOB_ID_ANNOTATION: "team-a.mnist.7", names.GENERATION_ANNOTATION: "7",
        names.SUBMISSION_ANNOTATION: "0", names.ATTEMPT_ANNOTATION: "0"}
    assert derive.pod_annotation(out, names.ADMISSION_ANNOTATION) == "3"
    assert derive.pod_annotation(out, names.EPOCH_PREFIX_ANNOTATION) == "7000000"
    assert derive.pod_annotation(out, names.TOKEN_PREFIX_ANNOTATION) == "team-a.mnist.7.0.0"
    assert derive.needs_identity(trainjob) and not derive.needs_identity(out)


def test_without_our_entry_there_is_nothing_to_give_it() -> None:
    trainjob = derived()
    trainjob["spec"]["runtimePatches"] = []
    with pytest.raises(derive.DeriveError, match="spec.runtimePatches has no entry"):
        derive.with_identity(trainjob, generation=1)


def test_only_a_derived_trainjob_needs_one() -> None:
    assert not derive.needs_identity({"metadata": {"annotations": {names.JOB_ID_ANNOTATION: "j"}}})
    assert not derive.needs_identity({"metadata": {}})


@pytest.mark.parametrize(("value", "message"), [
    ("spec.trainer.command: not set", "not wrapped at creation: spec.trainer.command: not set"),
    ("two\nlines\tand  spaces", "not wrapped at creation: two lines and spaces"),
    ("", "not wrapped at creation: refused by the admission policy dispatch-identity"),
    ("x" * 2000, "not wrapped at creation: " + "x" * (derive.REFUSAL_MAX - 3) + "..."),
])
def test_a_refusal_reads_as_one_bounded_line(value: str, message: str) -> None:
    assert derive.refusal({"metadata": {"annotations": {names.REFUSED_ANNOTATION: value}}}) == message
    assert derive.refusal(derived()) is None


def test_the_history_reads_a_derived_trainjobs_epoch_through_its_pod_annotations() -> None:
    # The policy's env names the prefixes by fieldRef; the history computes what the pods saw.
    trainjob = derived()
    trainjob["spec"]["trainer"] = {"env": wrap.dispatch_env(epoch_prefix="", token_prefix="")[:2] + [
        {"name": names.ENV_EPOCH_PREFIX, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{names.EPOCH_PREFIX_ANNOTATION}']"}}},
        {"name": names.ENV_TOKEN_PREFIX, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{names.TOKEN_PREFIX_ANNOTATION}']"}}}]}
    assert history.identity_of(trainjob, admission=1, restart=0) == (None, None)  # the prologue refuses then
    given = derive.with_identity(trainjob, generation=4)
    assert history.identity_of(given, admission=2, restart=1) == ("4000000000003", "team-a.mnist.4.0.0.2.1")
