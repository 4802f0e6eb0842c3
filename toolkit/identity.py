"""Execution identity (docs/prologue.md): the epoch and the attempt token.

    DISPATCH_EPOCH   = G x 10^12 + N x 10^6 + R,  R = A + J
    DISPATCH_ATTEMPT = <JobID>.<N>.<attempt>.<A>.<J>

This module and `prologue/prologue.sh` are two implementations of one
formula: the packager (render) computes the two prefixes here, the prologue
appends R in the container, and `toolkit identity` recomputes both for an
operator reading logs. tests/toolkit/test_identity_prologue.py runs the real
prologue in every shell against this module on random inputs, including
inputs past the bounds, and requires the same answer or the same refusal.

Bounds, each checked here and refused with a BoundError that names the
value and the bound:
- A and J: 0 ..= 999999 each (the prologue's "at most 6 digits");
- A >= 1: an execution with A = 0 was not admitted through dispatch;
- R = A + J < 10^6;
- N: 0 ..= 999999; G >= 0; attempt >= 0 and fits a signed 64-bit integer;
- the epoch fits a signed 64-bit integer (G <= 9223372, and G = 9223372
  only while the rest fits). A prefix is refused when even R = 1 would not
  fit, so a prefix this module hands out always has a valid epoch;
- JobID: 1 to 253 visible ASCII characters (no space, no control
  character, nothing outside ASCII). It may hold dots: the token is parsed
  from the right, where the four numbers are. It is refused when empty
  because the prologue refuses an empty token prefix, and whitespace or
  control characters are refused so that a token is always one word on
  one log line.

Decimal strings are read as the prologue reads them (`0`, or digits with no
leading zero, no sign, no space, no `_`): Python's int() is far more lenient
than any shell test, and a looser reader here would disagree with it.

Pure standard library, no I/O: the sidecar and `toolkit wrap` import it.
"""

from __future__ import annotations

import dataclasses
import re

from toolkit import names

MAX_INT64 = 2**63 - 1
R_LIMIT = 10**6  # R < R_LIMIT
N_LIMIT = 10**6  # N < N_LIMIT
COUNT_LIMIT = 10**6  # A, J < COUNT_LIMIT (at most 6 digits)
JOB_ID_MAX_LENGTH = 253
# The largest G: G x 10^12 + 0 x 10^6 + 1 must still fit.
MAX_GENERATION = (MAX_INT64 - 1) // 10**12

_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_JOB_ID = re.compile(r"[!-~]+")  # visible ASCII, 0x21..0x7e


class BoundError(ValueError):
    """A value outside a bound of the identity; the message names both."""


@dataclasses.dataclass(frozen=True)
class Epoch:
    """An epoch taken apart: (G, N, R)."""

    generation: int
    submission: int
    r: int


@dataclasses.dataclass(frozen=True)
class Attempt:
    """An attempt token taken apart."""

    job_id: str
    submission: int
    attempt: int
    admission: int
    restart: int


def _int(name: str, value: object) -> int:
    # bool is an int subclass; True as a count is a caller's bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BoundError(f"{name} = {value!r} is not an integer")
    return value


def parse_decimal(name: str, text: str) -> int:
    """A canonical decimal (`0`, or digits without a leading zero)."""
    if not _DECIMAL.fullmatch(text):
        raise BoundError(f"{name} = {text!r} is not 0 or a decimal without sign or leading zero")
    return int(text)


def check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str):
        raise BoundError(f"job id = {job_id!r} is not a string")
    if not job_id:
        raise BoundError("job id is empty; it must be 1 to 253 visible ASCII characters")
    if len(job_id) > JOB_ID_MAX_LENGTH:
        raise BoundError(f"job id has {len(job_id)} characters, above the bound {JOB_ID_MAX_LENGTH}")
    if not _JOB_ID.fullmatch(job_id):
        raise BoundError(
            f"job id = {job_id!r} holds a space, a control character or a non-ASCII character; "
            "it must be visible ASCII"
        )
    return job_id


def check_generation(generation: object) -> int:
    g = _int("G (generation)", generation)
    if g < 0:
        raise BoundError(f"G (generation) = {g} is below 0")
    if g > MAX_GENERATION:
        raise BoundError(
            f"G (generation) = {g} is above {MAX_GENERATION}: the epoch would not fit a signed 64-bit integer"
        )
    return g


def check_submission(submission: object) -> int:
    n = _int("N (submission)", submission)
    if n < 0:
        raise BoundError(f"N (submission) = {n} is below 0")
    if n >= N_LIMIT:
        raise BoundError(f"N (submission) = {n} reached the bound {N_LIMIT} (N < 10^6)")
    return n


def check_attempt(attempt: object) -> int:
    k = _int("attempt", attempt)
    if k < 0:
        raise BoundError(f"attempt = {k} is below 0")
    if k > MAX_INT64:
        raise BoundError(f"attempt = {k} does not fit a signed 64-bit integer (max {MAX_INT64})")
    return k


def _check_count(name: str, value: object) -> int:
    c = _int(name, value)
    if c < 0:
        raise BoundError(f"{name} = {c} is below 0")
    if c >= COUNT_LIMIT:
        raise BoundError(f"{name} = {c} reached the bound {COUNT_LIMIT} (at most 6 digits)")
    return c


def check_r(*, admission: object, restart: object) -> int:
    """R = A + J, with A >= 1, both at most 6 digits, and R < 10^6."""
    a = _check_count("A (admission)", admission)
    j = _check_count("J (restart)", restart)
    if a == 0:
        raise BoundError("A (admission) = 0 is below 1: the execution was not admitted through dispatch")
    r = a + j
    if r >= R_LIMIT:
        raise BoundError(f"R = A + J = {r} reached the bound {R_LIMIT} (R < 10^6)")
    return r


def _check_fits(*, generation: int, submission: int, r: int) -> int:
    value = generation * 10**12 + submission * 10**6 + r
    if value > MAX_INT64:
        raise BoundError(
            f"epoch {value} (G={generation}, N={submission}, R={r}) does not fit a signed 64-bit "
            f"integer (max {MAX_INT64})"
        )
    return value


def epoch(*, generation: int, submission: int, r: int) -> int:
    """G x 10^12 + N x 10^6 + R, every bound checked (R >= 1)."""
    g = check_generation(generation)
    n = check_submission(submission)
    r = _int("R", r)
    if r < 1:
        raise BoundError(f"R = {r} is below 1: every admitted execution has A >= 1")
    if r >= R_LIMIT:
        raise BoundError(f"R = {r} reached the bound {R_LIMIT} (R < 10^6)")
    return _check_fits(generation=g, submission=n, r=r)


def epoch_prefix(*, generation: int, submission: int) -> str:
    """DISPATCH_K8S_EPOCH_PREFIX: the decimal of G x 10^6 + N, or "" when 0.

    Refused when even R = 1 would not give an epoch that fits."""
    g = check_generation(generation)
    n = check_submission(submission)
    _check_fits(generation=g, submission=n, r=1)
    value = g * 10**6 + n
    return str(value) if value else ""


def token_prefix(*, job_id: str, submission: int, attempt: int) -> str:
    """DISPATCH_K8S_TOKEN_PREFIX: <JobID>.<N>.<attempt>."""
    return f"{check_job_id(job_id)}.{check_submission(submission)}.{check_attempt(attempt)}"


def attempt_token(*, job_id: str, submission: int, attempt: int, admission: int, restart: int) -> str:
    """DISPATCH_ATTEMPT: <JobID>.<N>.<attempt>.<A>.<J>."""
    check_r(admission=admission, restart=restart)
    prefix = token_prefix(job_id=job_id, submission=submission, attempt=attempt)
    return f"{prefix}.{admission}.{restart}"


def execution_epoch(*, generation: int, submission: int, admission: int, restart: int) -> int:
    """The epoch an execution with this A and J sees."""
    return epoch(generation=generation, submission=submission, r=check_r(admission=admission, restart=restart))


def epoch_from_prefix(*, prefix: str, r: int) -> int:
    """The epoch the prologue builds from DISPATCH_K8S_EPOCH_PREFIX and R:
    R alone for an empty prefix, else the prefix then R in six digits."""
    if prefix == "":
        return epoch(generation=0, submission=0, r=r)
    value = parse_decimal(names.ENV_EPOCH_PREFIX, prefix)
    if value == 0:
        raise BoundError(f"{names.ENV_EPOCH_PREFIX} = '0': a zero prefix is written as the empty string")
    generation, submission = divmod(value, 10**6)
    return epoch(generation=generation, submission=submission, r=r)


def parse(value: int | str) -> Epoch:
    """Take an epoch apart into (G, N, R); a string must be canonical decimal."""
    if isinstance(value, str):
        value = parse_decimal("epoch", value)
    e = _int("epoch", value)
    if e > MAX_INT64:
        raise BoundError(f"epoch {e} does not fit a signed 64-bit integer (max {MAX_INT64})")
    generation, rest = divmod(e, 10**12)
    submission, r = divmod(rest, 10**6)
    if r < 1:
        raise BoundError(f"epoch {e} has R = 0: every admitted execution has R >= 1")
    return Epoch(generation=generation, submission=submission, r=r)


def parse_attempt(token: str) -> Attempt:
    """Take an attempt token apart, from the right (the JobID may hold dots)."""
    parts = token.rsplit(".", 4)
    if len(parts) != 5:
        raise BoundError(f"attempt token {token!r} is not <JobID>.<N>.<attempt>.<A>.<J>")
    job_id, n, k, a, j = parts
    result = Attempt(
        job_id=check_job_id(job_id),
        submission=check_submission(parse_decimal("N (submission)", n)),
        attempt=check_attempt(parse_decimal("attempt", k)),
        admission=parse_decimal("A (admission)", a),
        restart=parse_decimal("J (restart)", j),
    )
    check_r(admission=result.admission, restart=result.restart)
    return result
