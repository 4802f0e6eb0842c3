"""The controller's settings: CLI option > environment > default, one table
and one parser for both (`controller.settings`), and a value it
cannot run with is one line naming the variable or the option and the bound
(exit 2), never a traceback. Every variable is tested through the option and
through the environment, and the two must agree on every value."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from controller import admission, app, settings
from controller import cli as controller_cli
from toolkit import envtable

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
        ("metrics_port", 8443, "9443", 9443, 0),
        ("metrics_host", "0.0.0.0", "127.0.0.1", "127.0.0.1", "::1"),
        ("metrics_cert_dir", None, "/etc/certs", "/etc/certs", "/run/certs"),
        ("max_connections", 64, "128", 128, 16),
        ("connection_seconds", 10, "30", 30, 5),
        ("token_reviews_per_minute", 60, "120", 120, 6),
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
         "DISPATCH_CONTROLLER_LEADER_ELECT='maybe': expected true or false"),
        ({"DISPATCH_CONTROLLER_RENEW_DEADLINE": "15"},
         "DISPATCH_CONTROLLER_RENEW_DEADLINE=15: must be less than the lease duration "
         "(15 s, DISPATCH_CONTROLLER_LEASE_DURATION or --lease-duration)"),
        ({"DISPATCH_CONTROLLER_RETRY_PERIOD": "9"},
         "DISPATCH_CONTROLLER_RETRY_PERIOD=9: 1.2 times it must be less than the renew deadline "
         "(10 s, DISPATCH_CONTROLLER_RENEW_DEADLINE or --renew-deadline)"),
    ],
)
def test_a_value_the_controller_cannot_run_with_names_its_variable(env, message):
    with pytest.raises(app.SettingsError) as caught:
        app.Settings.from_env(env)
    assert str(caught.value) == message


def _controller(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_") and k != "KUBECONFIG"}
    return subprocess.run([sys.executable, "-m", "controller", "--kubeconfig", "/nonexistent", *args],
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


# Every setting, as the tests pin it (not read from the implementation's
# table, so a changed name, bound or default fails here):
# field, variable, option, a good value, what it parses to, a bad value, the bound.
ROWS = [
    ("kubeconfig", "DISPATCH_CONTROLLER_KUBECONFIG", "--kubeconfig", "/tmp/kc", "/tmp/kc", None, None),
    ("context", "DISPATCH_CONTROLLER_CONTEXT", "--context", "dev@east", "dev@east", "two words",
     "expected text without whitespace, at most 253 characters"),
    ("namespace", "DISPATCH_CONTROLLER_NAMESPACE", "--namespace", "team-a", "team-a", "Team_A",
     "expected a DNS-1123 label (lowercase letters, digits and '-', at most 63)"),
    ("controller_name", "DISPATCH_CONTROLLER_CONTROLLER_NAME", "--controller-name", "x.example/check",
     "x.example/check", "x y", "expected text without whitespace, at most 253 characters"),
    ("leader_elect", "DISPATCH_CONTROLLER_LEADER_ELECT", "--no-leader-elect", "FALSE", False, "off",
     "expected true or false"),
    ("lease_name", "DISPATCH_CONTROLLER_LEASE_NAME", "--lease-name", "a.lease", "a.lease", "Lease!",
     "expected a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)"),
    ("lease_namespace", "DISPATCH_CONTROLLER_LEASE_NAMESPACE", "--lease-namespace", "ns-1", "ns-1", "ns.1",
     "expected a DNS-1123 label (lowercase letters, digits and '-', at most 63)"),
    ("lease_duration", "DISPATCH_CONTROLLER_LEASE_DURATION", "--lease-duration", "30", 30, "2",
     "expected a whole number from 3 to 3600"),
    ("renew_deadline", "DISPATCH_CONTROLLER_RENEW_DEADLINE", "--renew-deadline", "9", 9, "0",
     "expected a whole number from 1 to 3600"),
    ("retry_period", "DISPATCH_CONTROLLER_RETRY_PERIOD", "--retry-period", "3", 3, "3601",
     "expected a whole number from 1 to 3600"),
    ("health_port", "DISPATCH_CONTROLLER_HEALTH_PORT", "--health-port", "9090", 9090, "65536",
     "expected a whole number from 0 to 65535"),
    ("health_host", "DISPATCH_CONTROLLER_HEALTH_HOST", "--health-host", "::1", "::1", "local host",
     "expected an IP address or a host name"),
    ("metrics_port", "DISPATCH_CONTROLLER_METRICS_PORT", "--metrics-port", "9443", 9443, "-1",
     "expected a whole number from 0 to 65535"),
    ("metrics_host", "DISPATCH_CONTROLLER_METRICS_HOST", "--metrics-host", "::1", "::1", "a b",
     "expected an IP address or a host name"),
    ("metrics_cert_dir", "DISPATCH_CONTROLLER_METRICS_CERT_DIR", "--metrics-cert-dir", "/etc/certs", "/etc/certs",
     None, None),
    ("max_connections", "DISPATCH_CONTROLLER_MAX_CONNECTIONS", "--max-connections", "128", 128, "3",
     "expected a whole number from 4 to 4096"),
    ("connection_seconds", "DISPATCH_CONTROLLER_CONNECTION_SECONDS", "--connection-seconds", "30", 30, "301",
     "expected a whole number from 1 to 300"),
    ("token_reviews_per_minute", "DISPATCH_CONTROLLER_TOKEN_REVIEWS_PER_MINUTE", "--token-reviews-per-minute", "120",
     120, "0", "expected a whole number from 1 to 60000"),
    ("workers", "DISPATCH_CONTROLLER_WORKERS", "--workers", "8", 8, "+8", "expected a whole number from 1 to 64"),
]


# A second good value for each, to show the option beating the variable.
OTHER = {"kubeconfig": "/tmp/other", "context": "other", "namespace": "team-b", "controller_name": "y.example/c",
         "leader_elect": "true", "lease_name": "b.lease", "lease_namespace": "ns-2", "lease_duration": "40",
         "renew_deadline": "8", "retry_period": "4", "health_port": "9091", "health_host": "127.0.0.1", "metrics_port": "9444",
         "metrics_host": "127.0.0.1", "metrics_cert_dir": "/run/other", "workers": "9",
         "max_connections": "32", "connection_seconds": "20", "token_reviews_per_minute": "30"}


def test_the_rows_cover_every_setting_of_the_table_and_the_dataclass():
    fields = [row[0] for row in ROWS]
    assert sorted(OTHER) == sorted(fields)
    assert fields == [spec.field for spec in settings.TABLE]
    assert sorted(fields) == sorted(f.name for f in __import__("dataclasses").fields(app.Settings))
    assert settings.CONTROLLER_NAME == admission.CONTROLLER_NAME


def _invoke(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str]):
    """`toolkit controller` up to the point it would start: the settings it
    would run with, or its refusal."""
    seen: list[app.Settings] = []
    monkeypatch.setattr(app, "run", lambda s: seen.append(s) or 0)
    clean = {k: None for k in os.environ if k.startswith("DISPATCH_")}
    result = CliRunner().invoke(controller_cli.controller_cmd, argv, env={**clean, **env})
    return result, (seen[0] if seen else None)


@pytest.mark.parametrize(("field", "var", "option", "good", "value", "bad", "bound"), ROWS, ids=[r[0] for r in ROWS])
def test_every_setting_reaches_the_controller_through_its_variable_and_its_option(
        monkeypatch, field, var, option, good, value, bad, bound):
    argv = [option] if field == "leader_elect" else [option, good]
    for how, args, env in (("variable", [], {var: good}), ("option", argv, {})):
        result, seen = _invoke(monkeypatch, args, env)
        assert (result.exit_code, result.stderr) == (0, ""), (how, result.output)
        assert getattr(seen, field) == value, how
    # the option beats the variable
    result, seen = _invoke(monkeypatch, argv, {var: OTHER[field]})
    assert result.exit_code == 0, result.output
    assert getattr(seen, field) == value


@pytest.mark.parametrize(("field", "var", "option", "good", "value", "bad", "bound"),
                         [r for r in ROWS if r[5] is not None], ids=[r[0] for r in ROWS if r[5] is not None])
def test_a_bad_value_through_either_is_one_line_naming_it_and_its_bound(
        monkeypatch, field, var, option, good, value, bad, bound):
    shown = repr(bad) if not bad.isdigit() else bad
    result, seen = _invoke(monkeypatch, [], {var: bad})
    assert (result.exit_code, seen, result.stdout) == (2, None, "")
    assert result.stderr.splitlines() == [f"Error: {var}={shown}: {bound}"]
    if field == "leader_elect":
        return  # a flag pair: there is no text to get wrong
    result, seen = _invoke(monkeypatch, [option, bad], {})
    assert (result.exit_code, seen, result.stdout) == (2, None, "")
    assert result.stderr.splitlines() == [f"Error: {option}={shown}: {bound}"]


TRICKY = ["t", "T", "y", "TRUE", " on ", "Off", "1", "+8", " 8", "08", "0x10", "1e3", "８", "-1", "0", "64", "65",
          "3600", "team-a", "Team-A", "a..b", "-a", "a" * 64, "::1", "0.0.0.0", "host name", "127.0.0.1:80"]


def _verdict(result, seen, field: str, source: str) -> tuple[str, object]:
    """("ok", the value) or ("refused", the message without the name of
    where the value came from, which is all the two sides may differ in)."""
    if seen is not None:
        return "ok", getattr(seen, field)
    message = result.stderr.strip().removeprefix("Error: ")
    return "refused", message.removeprefix(f"{source}=")


@pytest.mark.parametrize("field", [row[0] for row in ROWS if row[0] != "kubeconfig"])
def test_the_variable_and_the_option_agree_on_every_value(monkeypatch, field):
    """The bug this replaced: click's own rules for the options (and their
    `envvar=`) and `from_env`'s for the variables, e.g. LEADER_ELECT=t."""
    spec = settings.BY_FIELD[field]
    for raw in TRICKY:
        try:
            direct = ("ok", getattr(app.Settings.from_env({spec.name: raw}), field))
        except app.SettingsError as exc:
            direct = ("refused", str(exc).removeprefix(f"{spec.name}="))
        result, seen = _invoke(monkeypatch, [], {spec.name: raw})
        assert _verdict(result, seen, field, spec.name) == direct, raw
        if spec.kind is not envtable.BOOLEAN:
            result, seen = _invoke(monkeypatch, [spec.option, raw], {})
            assert _verdict(result, seen, field, spec.option) == direct, raw
