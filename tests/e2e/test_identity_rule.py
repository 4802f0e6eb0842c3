"""The identity rule every e2e scenario ends with (`flow.identity_rule`),
on executions made up here: it must fail where a scenario's would."""

from __future__ import annotations

import pytest

from devcluster import scenario as flow


def _ran(epoch: int, token: str) -> flow.Execution:
    return flow.Execution(pod=f"pod-{token}", restarts=0, exit_code=0, log="", epoch=str(epoch), attempt=token)


def test_strictly_increasing_epochs_and_new_tokens_pass() -> None:
    flow.identity_rule([_ran(1, "j.1.1.1.0"), _ran(2, "j.1.1.1.1"), _ran(4, "j.1.1.3.0")], [None] * 3, resets=[])


@pytest.mark.parametrize("second", [_ran(1, "j.1.1.1.1"), _ran(0, "j.1.1.0.0"), _ran(2, "j.1.1.1.0")],
                         ids=["same epoch", "lower epoch", "same token"])
def test_a_repeat_with_no_flag_raised_first_fails(second: flow.Execution) -> None:
    with pytest.raises(AssertionError, match="no foreign flag was raised before it ran"):
        flow.identity_rule([_ran(1, "j.1.1.1.0"), second], [None, None], resets=[])


def test_a_repeat_after_the_flag_passes() -> None:
    flow.identity_rule([_ran(1, "j.1.1.1.0"), _ran(1, "j.1.1.1.0")], [None, "JobSet UID b is not the recorded a"],
                       resets=[])


def test_only_the_named_reset_may_repeat_before_the_flag() -> None:
    first, rebuilt, later = _ran(1, "j.1.1.1.0"), _ran(1, "j.1.1.1.0"), _ran(1, "j.1.1.1.0")
    flow.identity_rule([first, rebuilt], [None, None], resets=[rebuilt])
    with pytest.raises(AssertionError, match="execution 2"):
        flow.identity_rule([first, rebuilt, later], [None, None, None], resets=[rebuilt])
