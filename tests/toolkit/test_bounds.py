"""Every bound of the identity (toolkit/identity.py): refused exactly at the limit, accepted one below, and
the error names the value and the bound."""

from __future__ import annotations

import pytest

from toolkit import identity

MAX = 2**63 - 1


def test_formula() -> None:
    assert identity.execution_epoch(generation=1, submission=2, admission=3, restart=4) == 1_000_002_000_007
    assert identity.epoch_prefix(generation=0, submission=0) == ""
    assert identity.epoch_prefix(generation=0, submission=5) == "5"
    assert identity.epoch_prefix(generation=1, submission=5) == "1000005"
    assert identity.token_prefix(job_id="a.b", submission=2, attempt=0) == "a.b.2.0"
    assert identity.attempt_token(job_id="a.b", submission=2, attempt=0, admission=3, restart=4) == "a.b.2.0.3.4"
    assert identity.parse(1_000_002_000_007) == identity.Epoch(1, 2, 7)
    assert identity.parse("7") == identity.Epoch(0, 0, 7)
    assert identity.epoch_from_prefix(prefix="1000005", r=7) == 1_000_005_000_007
    assert identity.epoch_from_prefix(prefix="", r=7) == 7
    assert identity.parse_attempt("a.b.2.0.3.4") == identity.Attempt("a.b", 2, 0, 3, 4)


@pytest.mark.parametrize(
    ("call", "ok", "bad", "words"),
    [
        # R < 10^6
        (lambda v: identity.check_r(admission=v, restart=0), 999_999, 1_000_000, ["1000000", "bound"]),
        (lambda v: identity.check_r(admission=1, restart=v), 999_998, 999_999, ["R = A + J = 1000000", "bound"]),
        # A >= 1
        (lambda v: identity.check_r(admission=v, restart=5), 1, 0, ["A (admission) = 0", "below 1"]),
        # J >= 0, at most 6 digits
        (lambda v: identity.check_r(admission=1, restart=v), 0, -1, ["J (restart) = -1", "below 0"]),
        # N < 10^6, N >= 0
        (lambda v: identity.check_submission(v), 999_999, 1_000_000, ["N (submission) = 1000000", "10^6"]),
        (lambda v: identity.check_submission(v), 0, -1, ["N (submission) = -1", "below 0"]),
        # G >= 0, G <= 9223372
        (lambda v: identity.check_generation(v), 0, -1, ["G (generation) = -1", "below 0"]),
        (lambda v: identity.check_generation(v), 9_223_372, 9_223_373, ["9223373", "64-bit"]),
        # G = 9223372 only while the rest fits: N and R at the top
        (lambda v: identity.epoch_prefix(generation=9_223_372, submission=v), 36_854, 36_855, ["64-bit"]),
        (lambda v: identity.epoch(generation=9_223_372, submission=36_854, r=v), 775_807, 775_808, [str(MAX + 1), "64-bit"]),
        (lambda v: identity.epoch(generation=0, submission=0, r=v), 1, 0, ["R = 0", "below 1"]),
        (lambda v: identity.epoch(generation=0, submission=0, r=v), 999_999, 1_000_000, ["R = 1000000"]),
        # attempt >= 0 and int64
        (lambda v: identity.check_attempt(v), 0, -1, ["attempt = -1"]),
        (lambda v: identity.check_attempt(v), MAX, MAX + 1, ["64-bit"]),
        # the epoch parsed
        (lambda v: identity.parse(v), MAX, MAX + 1, ["64-bit"]),
        (lambda v: identity.parse(v), 1, 1_000_000, ["R = 0"]),
        # the job id: at most 253 visible ASCII characters
        (lambda v: identity.check_job_id("x" * v), 253, 254, ["254", "253"]),
        (lambda v: identity.check_job_id("x" * v), 1, 0, ["empty"]),
    ],
)
def test_bound(call, ok: int, bad: int, words: list[str]) -> None:  # type: ignore[no-untyped-def]
    call(ok)
    with pytest.raises(identity.BoundError) as info:
        call(bad)
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("job_id", ["a b", "a\nb", "caf\u00e9", "tab\t", "\x7f"])
def test_job_id_refuses_what_breaks_a_token(job_id: str) -> None:
    with pytest.raises(identity.BoundError, match="job id"):
        identity.check_job_id(job_id)


@pytest.mark.parametrize("text", ["010", "+1", " 1", "1_0", "", "0x1", "\u0661", "-0"])
def test_decimals_are_read_like_the_prologue(text: str) -> None:
    with pytest.raises(identity.BoundError, match="decimal"):
        identity.parse_decimal("x", text)


def test_booleans_are_not_counts() -> None:
    with pytest.raises(identity.BoundError, match="not an integer"):
        identity.check_r(admission=True, restart=0)


def test_attempt_token_parses_from_the_right() -> None:
    token = identity.attempt_token(job_id="x.1.2.3", submission=4, attempt=5, admission=6, restart=7)
    assert identity.parse_attempt(token) == identity.Attempt("x.1.2.3", 4, 5, 6, 7)
    with pytest.raises(identity.BoundError):
        identity.parse_attempt("a.1.2.3")
