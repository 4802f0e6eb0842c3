"""The controller's settings: CLI option > environment > default, read in
one place (`Settings.from_env`), and a value it cannot run with is one line
naming the variable (exit 2), never a traceback, also for the settings that
have no CLI option (renew deadline, retry period)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from toolkit.controller import app

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("field", "default", "env_value", "from_env", "override"),
    [
        ("namespace", "", "team-a", "team-a", "team-b"),
        ("controller_name", "dispatch.phpboyscout.uk/admission-check", "x.example/check", "x.example/check", "y.example/check"),
        ("leader_elect", True, "false", False, True),
        ("lease_name", "dispatch-controller", "lease-env", "lease-env", "lease-cli"),
        ("lease_namespace", "dispatch-system", "ns-env", "ns-env", "ns-cli"),
        ("lease_duration", 15, "30", 30, 60),
        ("renew_deadline", 10, "12", 12, 11),
        ("retry_period", 2, "3", 3, 4),
        ("health_port", 8080, "9090", 9090, 0),
        ("health_host", "0.0.0.0", "127.0.0.1", "127.0.0.1", "::1"),
        ("workers", 4, "8", 8, 1),
    ],
)
def test_an_option_beats_the_environment_which_beats_the_default(field, default, env_value, from_env, override):
    var = f"DISPATCH_CONTROLLER_{field.upper()}"
    assert getattr(app.Settings.from_env({}), field) == default
    assert getattr(app.Settings.from_env({var: ""}), field) == default  # empty is unset
    assert getattr(app.Settings.from_env({var: env_value}), field) == from_env
    assert getattr(app.Settings.from_env({var: env_value}, **{field: override}), field) == override
    assert getattr(app.Settings.from_env({var: env_value}, **{field: None}), field) == from_env  # an option not given


def test_renew_and_retry_follow_the_lease_duration_unless_set():
    assert (lambda s: (s.renew_deadline, s.retry_period))(app.Settings.from_env({})) == (10, 2)
    short = app.Settings.from_env({}, lease_duration=3)
    assert (short.renew_deadline, short.retry_period) == (2, 1)
    env = {"DISPATCH_CONTROLLER_LEASE_DURATION": "60", "DISPATCH_CONTROLLER_RENEW_DEADLINE": "50"}
    assert app.Settings.from_env(env).renew_deadline == 50  # the environment beats the derived default
    assert app.Settings.from_env(env, lease_duration=90).renew_deadline == 50


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DISPATCH_CONTROLLER_RENEW_DEADLINE": "ten"},
         "DISPATCH_CONTROLLER_RENEW_DEADLINE='ten': expected a whole number from 1 to 3600"),
        ({"DISPATCH_CONTROLLER_RETRY_PERIOD": "-1"},
         "DISPATCH_CONTROLLER_RETRY_PERIOD='-1': expected a whole number from 1 to 3600"),
        ({"DISPATCH_CONTROLLER_RETRY_PERIOD": "0"},
         "DISPATCH_CONTROLLER_RETRY_PERIOD=0: expected a whole number from 1 to 3600"),
        ({"DISPATCH_CONTROLLER_WORKERS": "1e3"},
         "DISPATCH_CONTROLLER_WORKERS='1e3': expected a whole number from 1 to 64"),
        ({"DISPATCH_CONTROLLER_LEADER_ELECT": "maybe"},
         "DISPATCH_CONTROLLER_LEADER_ELECT='maybe': expected one of 0, 1, false, no, off, on, true, yes"),
        ({"DISPATCH_CONTROLLER_RENEW_DEADLINE": "15"},
         "DISPATCH_CONTROLLER_RENEW_DEADLINE=15: must be less than the lease duration "
         "(15 s, DISPATCH_CONTROLLER_LEASE_DURATION or --lease-duration)"),
        ({"DISPATCH_CONTROLLER_RETRY_PERIOD": "9"},
         "DISPATCH_CONTROLLER_RETRY_PERIOD=9: 1.2 times it must be less than the renew deadline "
         "(10 s, DISPATCH_CONTROLLER_RENEW_DEADLINE)"),
    ],
)
def test_a_value_the_controller_cannot_run_with_names_its_variable(env, message):
    with pytest.raises(app.SettingsError) as caught:
        app.Settings.from_env(env)
    assert str(caught.value) == message


def _controller(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_") and k != "KUBECONFIG"}
    return subprocess.run([sys.executable, "-m", "toolkit.controller", "--kubeconfig", "/nonexistent", *args],
                          cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_the_controller_process_refuses_a_bad_renew_deadline_in_one_line_with_exit_2():
    proc = _controller(env={"DISPATCH_CONTROLLER_RENEW_DEADLINE": "soon"})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [
        "Error: DISPATCH_CONTROLLER_RENEW_DEADLINE='soon': expected a whole number from 1 to 3600"
    ]


def test_the_controller_process_takes_the_option_over_the_environment_over_the_default():
    """Seen through the one check that needs the lease duration: renew 25 is
    valid under the environment's lease (30), not under the option's (20),
    and not under the default (15)."""
    renew = {"DISPATCH_CONTROLLER_RENEW_DEADLINE": "25"}
    env_lease = _controller(env={**renew, "DISPATCH_CONTROLLER_LEASE_DURATION": "30"})
    assert env_lease.returncode == 1 and "--kubeconfig: cannot load a cluster config" in env_lease.stderr
    option_lease = _controller("--lease-duration", "20", env={**renew, "DISPATCH_CONTROLLER_LEASE_DURATION": "30"})
    default_lease = _controller(env=renew)
    for proc, lease in ((option_lease, 20), (default_lease, 15)):
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [
            f"Error: DISPATCH_CONTROLLER_RENEW_DEADLINE=25: must be less than the lease duration "
            f"({lease} s, DISPATCH_CONTROLLER_LEASE_DURATION or --lease-duration)"
        ])
