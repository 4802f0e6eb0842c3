"""The foreign flag's label (toolkit.flagmark) and a list row
(toolkit.listing.row) as pure rules: the label is there exactly when the
flag is, whichever annotation holds the flag, and it goes with it."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from devcluster import objects
from toolkit import causes, flagmark, history, listing, names


def _trainjob(**meta: object) -> dict:
    tj = objects.trainjob_body("llama-ft-7")
    tj["metadata"].update({"namespace": "training", **meta})
    return tj


@hypothesis.given(st.lists(st.text(min_size=1, max_size=40), max_size=6), st.integers(min_value=4, max_value=200))
def test_the_label_is_present_exactly_when_the_flag_is(lines: list[str], limit: int) -> None:
    tj = _trainjob()
    current = causes.parse(None, None)
    for line in lines:
        added = causes.add(current, line, limit=limit)
        if added is not None:
            current = added
            flagmark.write(tj, added)
        assert flagmark.is_labelled(tj) == flagmark.is_flagged(tj)
    flagmark.clear(tj)
    assert not flagmark.is_flagged(tj) and not flagmark.is_labelled(tj)
    assert names.FOREIGN_LABEL not in (tj["metadata"].get("labels") or {})
    assert not {names.FOREIGN_ANNOTATION, causes.DROPPED_ANNOTATION} & set(tj["metadata"].get("annotations") or {})


def test_a_flag_only_counted_as_dropped_is_labelled_too() -> None:
    tj = _trainjob()
    added = causes.add(causes.parse(None, None), "x" * 50, limit=10)  # too long to keep: counted, digest kept
    assert added is not None and added.kept == [] and added.dropped == 1
    flagmark.write(tj, added)
    assert flagmark.is_flagged(tj) and tj["metadata"]["labels"] == {flagmark.LABEL: "true"}
    assert names.FOREIGN_ANNOTATION not in tj["metadata"]["annotations"]


def test_clearing_keeps_every_other_label_and_annotation() -> None:
    tj = _trainjob(labels={names.KUEUE_QUEUE_LABEL: "lq"}, annotations={names.FLOOR_ANNOTATION: "3"})
    flagmark.write(tj, causes.Causes(kept=["JobSet UID b is not the recorded a: J may have been reset"]))
    assert tj["metadata"]["labels"] == {names.KUEUE_QUEUE_LABEL: "lq", flagmark.LABEL: "true"}
    flagmark.clear(tj)
    assert tj["metadata"]["labels"] == {names.KUEUE_QUEUE_LABEL: "lq"}
    assert tj["metadata"]["annotations"] == {names.FLOOR_ANNOTATION: "3"}


def test_a_flag_written_without_the_label_needs_it() -> None:
    tj = _trainjob(annotations={names.FOREIGN_ANNOTATION: "a cause"})
    assert flagmark.needs_label(tj)
    flagmark.label(tj)
    assert not flagmark.needs_label(tj) and flagmark.is_labelled(tj)
    assert not flagmark.needs_label(_trainjob())  # not flagged: no label needed


def test_the_selector_is_the_label_and_its_value() -> None:
    assert flagmark.SELECTOR == "dispatch.phpboyscout.uk/foreign=true"
    assert listing.selector(foreign=True, extra=None) == flagmark.SELECTOR
    assert listing.selector(foreign=True, extra=" team=a ") == f"{flagmark.SELECTOR},team=a"
    assert listing.selector(foreign=False, extra="") is None


def test_a_row_reads_state_mode_a_history_and_flag() -> None:
    tj = _trainjob(labels={names.KUEUE_QUEUE_LABEL: "lq"}, creationTimestamp="2026-12-05T20:00:00Z",
                   annotations={names.FLOOR_ANNOTATION: "3"})
    tj["spec"]["suspend"] = False
    recorded = history.History(high_water=4, dropped=2, executions=(history.Execution(
        a=3, j=1, jobset_uid="u", r=4, epoch="1000002000004", attempt="job-1.2.0.3.1", first_pod="p",
        first_seen="2026-12-05T20:00:01Z", last_seen="2026-12-05T20:00:02Z", ended=None, verdict="ok"),))
    tj["metadata"]["annotations"][history.HISTORY_ANNOTATION] = history.render(recorded)
    flagmark.write(tj, causes.Causes(kept=["one", "two"], dropped=1))
    assert listing.row(tj) == listing.Row(
        namespace="training", name="llama-ft-7", state="running", mode="kueue", admission=3, executions=3,
        high_water=4, foreign=True, causes=3, created="2026-12-05T20:00:00Z")
    plain = listing.row(_trainjob())
    assert (plain.state, plain.mode, plain.admission, plain.executions, plain.foreign, plain.causes) == (
        "suspended", "plain", 0, 0, False, 0)
