"""The controller's settings: defaults, the environment, the CLI's options
over both (`Settings.from_env` is the one place they are read), and that the
health server binds the address it was given."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from click.testing import CliRunner

from toolkit import cli_cluster
from toolkit.controller import app


def test_the_health_host_defaults_to_every_interface_for_in_cluster_probes() -> None:
    assert app.Settings.from_env({}).health_host == "0.0.0.0"
    assert app.Settings.from_env({"DISPATCH_CONTROLLER_HEALTH_HOST": ""}).health_host == "0.0.0.0"  # empty is unset


def test_the_health_host_comes_from_the_environment_and_an_option_overrides_it() -> None:
    env = {"DISPATCH_CONTROLLER_HEALTH_HOST": "127.0.0.1"}
    assert app.Settings.from_env(env).health_host == "127.0.0.1"
    assert app.Settings.from_env(env, health_host="::1").health_host == "::1"
    assert app.Settings.from_env(env, health_host=None).health_host == "127.0.0.1"  # an unset option


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, "0.0.0.0"),
    ([], {"DISPATCH_CONTROLLER_HEALTH_HOST": "127.0.0.1"}, "127.0.0.1"),
    (["--health-host", "127.0.0.2"], {"DISPATCH_CONTROLLER_HEALTH_HOST": "127.0.0.1"}, "127.0.0.2"),
])
def test_toolkit_controller_passes_the_health_host_to_the_controller(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], expected: str) -> None:
    seen: list[app.Settings] = []

    def run(settings: app.Settings) -> int:
        seen.append(settings)
        return 0
    monkeypatch.setattr(app, "run", run)
    result = CliRunner().invoke(cli_cluster.controller_cmd, argv, env=env)
    assert result.exit_code == 0, result.output
    assert [s.health_host for s in seen] == [expected]


def _listening(port: int) -> list[str]:
    """The IPv4 addresses a socket listens on at `port`, from /proc/net/tcp."""
    out = []
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            out.append(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return out


@pytest.mark.cluster
@pytest.mark.parametrize(("extra", "expected"), [([], "0.0.0.0"), (["--health-host", "127.0.0.1"], "127.0.0.1")])
def test_the_health_server_binds_the_health_host(start_controller: Any, extra: list[str], expected: str) -> None:
    ctl = start_controller(extra=extra)
    assert ctl.get("/healthz")[0] == 200
    starting = next(line for line in ctl.lines if line.get("msg") == "starting")
    assert starting["health_host"] == expected
    assert _listening(ctl.port) == [expected]
