"""The prologue and toolkit.identity are two implementations of one formula:
for random inputs, valid or past a bound, the real prologue in every shell
prints what identity computes, or both refuse."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest

from tests.toolkit import shells
from toolkit import identity, names


def near(limit: int, top: int) -> st.SearchStrategy[int]:
    """Mostly the edges (0, the bound), sometimes anywhere up to top."""
    return st.one_of(
        st.integers(0, 3),
        st.integers(max(0, limit - 3), min(top, limit + 3)),
        st.integers(0, top),
    )


job_ids = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)


def python_answer(*, g: int, n: int, a: int, j: int, job_id: str, attempt: int) -> tuple[str, str] | None:
    try:
        epoch = identity.execution_epoch(generation=g, submission=n, admission=a, restart=j)
        token = identity.attempt_token(job_id=job_id, submission=n, attempt=attempt, admission=a, restart=j)
    except identity.BoundError:
        return None
    return str(epoch), token


@pytest.mark.parametrize("shell", shells.NAMES)
@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(
    g=st.one_of(near(identity.MAX_GENERATION, identity.MAX_GENERATION + 2), st.integers(0, 5)),
    n=st.one_of(near(36854, 999_999), near(999_999, 999_999)),
    a=near(1, 999_999) | near(999_999, 999_999),
    j=near(0, 999_999) | near(999_999, 999_999),
    job_id=job_ids,
    attempt=st.integers(0, 2**63 - 1),
)
def test_prologue_equals_identity(shell: str, g: int, n: int, a: int, j: int, job_id: str, attempt: int) -> None:
    raw_prefix = g * 10**6 + n
    env = {
        names.ENV_ADMISSION: str(a),
        names.ENV_RESTART: str(j),
        names.ENV_EPOCH_PREFIX: str(raw_prefix) if raw_prefix else "",
        names.ENV_TOKEN_PREFIX: f"{job_id}.{n}.{attempt}",
    }
    want = python_answer(g=g, n=n, a=a, j=j, job_id=job_id, attempt=attempt)
    proc = shells.run_prologue(shell, env)
    if want is None:
        assert proc.returncode == 125, (env, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("dispatch: ") and proc.stderr.count("\n") == 1
        assert proc.stdout == ""
    else:
        assert proc.returncode == 0, (env, proc.stderr)
        assert proc.stdout.splitlines() == list(want)
        # The prefixes identity hands out are the ones the prologue was fed.
        assert identity.epoch_prefix(generation=g, submission=n) == env[names.ENV_EPOCH_PREFIX]
        assert identity.token_prefix(job_id=job_id, submission=n, attempt=attempt) == env[names.ENV_TOKEN_PREFIX]


@pytest.mark.parametrize("shell", shells.NAMES)
def test_extremes_agree(shell: str) -> None:
    """The largest epoch there is, and one past it."""
    top = {
        names.ENV_ADMISSION: "775807",
        names.ENV_RESTART: "0",
        names.ENV_EPOCH_PREFIX: "9223372036854",
        names.ENV_TOKEN_PREFIX: "j.36854.0",
    }
    proc = shells.run_prologue(shell, top)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == str(2**63 - 1) == str(
        identity.execution_epoch(generation=9223372, submission=36854, admission=775807, restart=0)
    )
    proc = shells.run_prologue(shell, {**top, names.ENV_RESTART: "1"})
    assert proc.returncode == 125
    with pytest.raises(identity.BoundError):
        identity.execution_epoch(generation=9223372, submission=36854, admission=775807, restart=1)
