"""The foreign cause list (toolkit.causes) as pure rules: whole lines only,
a count of the causes that did not fit, and each cause announced once, so a
job with many ranks cannot fill the list and then spam Events."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from toolkit import causes


def _add_all(lines: list[str], *, limit: int = causes.LIMIT) -> tuple[causes.Causes, list[str]]:
    """Add each cause in turn; the causes announced (an Event each)."""
    current = causes.parse(None, None)
    announced = []
    for line in lines:
        added = causes.add(current, line, limit=limit)
        if added is not None:
            current = added
            announced.append(line)
    return current, announced


def test_a_cause_is_kept_once_and_announced_once():
    current, announced = _add_all(["pod a below the floor", "pod a below the floor", "pod b"])
    assert current.kept == ["pod a below the floor", "pod b"]
    assert announced == ["pod a below the floor", "pod b"]


def test_a_full_list_keeps_whole_lines_and_counts_each_dropped_cause_once():
    lines = [f"cause {i:03d} " + "x" * 40 for i in range(50)]
    current, announced = _add_all(lines + lines, limit=500)
    foreign, dropped = causes.render(current)
    assert len(foreign) <= 500
    assert set(foreign.split("\n")) <= set(lines)  # no line was cut
    kept = foreign.split("\n")
    assert kept == lines[: len(kept)]  # the first causes are the ones kept
    assert current.dropped == 50 - len(kept)
    assert announced == lines  # the second round announced nothing
    again = causes.parse(foreign, dropped)
    assert again == current  # what is written reads back the same


def test_a_newline_in_a_cause_cannot_split_it_into_two():
    current, _ = _add_all(["first\nsecond"])
    assert current.kept == ["first second"]


def test_past_the_remembered_dropped_causes_nothing_more_is_written_or_announced():
    current = causes.parse("kept", None)
    for i in range(causes.DIGESTS):
        nxt = causes.add(current, f"dropped {i}", limit=4)
        assert nxt is not None
        current = nxt
    assert current.dropped == causes.DIGESTS
    assert causes.add(current, "one more", limit=4) is None


def test_an_unreadable_dropped_annotation_reads_as_none_dropped():
    assert causes.parse("a", "not a count").dropped == 0


@hypothesis.given(st.lists(st.text(st.characters(codec="ascii"), min_size=1, max_size=60), max_size=40),
                  st.integers(10, 400))
def test_the_kept_value_never_passes_the_limit_and_never_holds_a_partial_line(lines, limit):
    current, _ = _add_all(lines, limit=limit)
    foreign, _ = causes.render(current)
    assert len(foreign) <= limit
    folded = {causes.fold(line) for line in lines}
    assert all(line in folded for line in current.kept)
