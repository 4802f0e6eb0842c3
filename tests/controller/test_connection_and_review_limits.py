"""The limits' pure logic, on a clock of the test's own: the gate of held connections
(controller.connlimit.Gate), the decision cache and the review budget
(controller.review_budget)."""

from __future__ import annotations

import pytest

from controller import connlimit, review_budget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_full_gate_makes_room_by_closing_the_oldest_idle_connection() -> None:
    gate = connlimit.Gate(limit=3, seconds=10, clock=Clock())
    assert [gate.admit(c) for c in ("a", "b", "c")] == [(True, [])] * 3
    gate.answering("a")
    assert gate.admit("d") == (True, ["b"])  # a answers, so b is the oldest idle
    assert gate.admit("e") == (True, ["c"])
    assert len(gate) == 3


def test_a_gate_whose_connections_all_answer_refuses_the_next() -> None:
    gate = connlimit.Gate(limit=2, seconds=10, clock=Clock())
    for conn in ("a", "b"):
        gate.admit(conn)
        gate.answering(conn)
    assert gate.admit("c") == (False, [])
    gate.release("a")
    assert gate.admit("c") == (True, [])


def test_a_released_or_closed_connection_is_forgotten_once() -> None:
    gate = connlimit.Gate(limit=2, seconds=10, clock=Clock())
    gate.admit("a")
    gate.admit("b")
    assert gate.admit("c") == (True, ["a"])
    gate.release("a")  # its handler ends after it was closed to make room: nothing changes
    gate.answering("a")
    assert len(gate) == 2


def test_connections_past_their_deadline_are_handed_out_to_close_once() -> None:
    clock = Clock()
    gate = connlimit.Gate(limit=4, seconds=10, clock=clock)
    gate.admit("old")
    clock.now += 6
    gate.admit("new")
    gate.answering("old")  # answering or not, the deadline holds
    clock.now += 4
    assert gate.overdue() == ["old"]
    assert gate.overdue() == []
    clock.now += 6
    assert gate.overdue() == ["new"]
    assert len(gate) == 0


@pytest.mark.parametrize(("limit", "seconds"), [(0, 10), (4, 0)])
def test_a_gate_refuses_bounds_that_hold_nothing(limit: int, seconds: float) -> None:
    with pytest.raises(ValueError, match="expected limit >= 1 and seconds > 0"):
        connlimit.Gate(limit=limit, seconds=seconds)


def test_made_up_tokens_cannot_push_an_authenticated_decision_out() -> None:
    decisions = review_budget.Decisions(size=4, seconds=30, clock=Clock())
    decisions.put("scraper", 200)
    decisions.put("other", 403)
    for n in range(1000):
        decisions.put(f"random-{n}", 401)
    assert decisions.get("scraper") == (200, True)
    assert decisions.get("other") == (403, True)
    assert decisions.get("random-999") == (401, False)
    assert decisions.get("random-0") == (None, False)  # the oldest made-up ones went
    assert len(decisions) == 6


def test_an_expired_decision_leaves_its_token_known() -> None:
    clock = Clock()
    decisions = review_budget.Decisions(size=4, seconds=30, clock=clock)
    decisions.put("scraper", 200)
    decisions.put("random", 401)
    clock.now += 30
    assert decisions.get("scraper") == (None, True)
    assert decisions.get("random") == (None, False)
    decisions.put("scraper", 401)  # a token revoked since: unauthenticated now, and no longer known
    assert decisions.get("scraper") == (401, False)


def test_the_authenticated_segment_drops_its_least_recently_used() -> None:
    decisions = review_budget.Decisions(size=2, seconds=30, clock=Clock())
    decisions.put("a", 200)
    decisions.put("b", 200)
    assert decisions.get("a") == (200, True)
    decisions.put("c", 403)
    assert decisions.get("b") == (None, False)
    assert decisions.get("a") == (200, True)


def test_the_bucket_gives_a_sixth_of_its_rate_at_once_then_its_rate() -> None:
    clock = Clock()
    bucket = review_budget.Bucket(per_minute=60, clock=clock)
    assert sum(bucket.take() for _ in range(100)) == 10
    clock.now += 5
    assert sum(bucket.take() for _ in range(100)) == 5
    clock.now += 3600
    assert sum(bucket.take() for _ in range(100)) == 10  # it never holds more than ten seconds' worth


def test_a_slow_bucket_still_gives_one() -> None:
    clock = Clock()
    bucket = review_budget.Bucket(per_minute=1, clock=clock)
    assert (bucket.take(), bucket.take()) == (True, False)
    clock.now += 59
    assert not bucket.take()
    clock.now += 1
    assert bucket.take()


@pytest.mark.parametrize(("make", "words"), [
    (lambda: review_budget.Bucket(per_minute=0), "per_minute=0: expected at least 1"),
    (lambda: review_budget.Decisions(size=0, seconds=30), "expected size >= 1 and seconds > 0"),
])
def test_budgets_refuse_bounds_that_hold_nothing(make, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()
