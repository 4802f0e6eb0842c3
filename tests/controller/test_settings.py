"""The controller's settings: defaults, the environment, the CLI's options
over both (`Settings.from_env` is the one place they are read), that the
health server binds the address it was given, and that the kubeconfig
context given is the one used."""

from __future__ import annotations

import pathlib
import socket
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from controller import app
from controller import cli as controller_cli
from tests.controller.conftest import ControllerProcess, run_controller_once, wait_until



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
    result = CliRunner().invoke(controller_cli.controller_cmd, argv, env=env)
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
    starting = next(line for line in ctl.lines if line.get("message") == "starting")
    assert starting["health_host"] == expected
    assert _listening(ctl.port) == [expected]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _two_contexts(live_kubeconfig: str, path: pathlib.Path, *, current: str) -> str:
    """One kubeconfig, two contexts: `live` (the real apiserver) and `dead`
    (the same credentials, a port nothing listens on)."""
    config = yaml.safe_load(pathlib.Path(live_kubeconfig).read_text())
    cluster, user = config["clusters"][0], config["users"][0]
    dead = {"name": "dead", "cluster": {**cluster["cluster"], "server": f"https://127.0.0.1:{_free_port()}"}}
    config["clusters"] = [{**cluster, "name": "live"}, dead]
    config["contexts"] = [{"name": name, "context": {"cluster": name, "user": user["name"]}} for name in ("live", "dead")]
    config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return dead["cluster"]["server"]


@pytest.mark.cluster
@pytest.mark.parametrize(("chosen", "current"), [("live", "dead"), ("dead", "live")])
def test_the_controller_talks_to_the_context_it_is_given_not_the_current_one(
        controller_kubeconfig: str, namespace: str, tmp_path: pathlib.Path, chosen: str, current: str) -> None:
    kubeconfig = tmp_path / "two-contexts.yaml"
    dead_server = _two_contexts(controller_kubeconfig, kubeconfig, current=current)
    ctl = ControllerProcess(kubeconfig=str(kubeconfig), namespace=namespace, leader_elect=False,
                            extra=["--context", chosen])
    try:
        if chosen == "live":
            ctl.wait_ready()
            assert not [line for line in ctl.lines if "list/watch failed" in str(line.get("message"))]
        else:
            port = dead_server.rsplit(":", 1)[1]
            wait_until(lambda: [line for line in list(ctl.lines) if "list/watch failed" in str(line.get("message"))
                                and f"port={port}" in str(line.get("message"))], what="the dead server refused")
            assert not ctl.ready.is_set()
            assert ctl.get("/readyz")[0] == 503
    finally:
        assert ctl.stop() == 0


def test_a_context_the_kubeconfig_lacks_is_one_line_naming_it(tmp_path: pathlib.Path) -> None:
    proc = run_controller_once(tmp_path, "--context", "nope", "--health-port", "0")
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --kubeconfig, --context nope: cannot load a cluster config")
    assert "nope" in lines[0].split(": cannot load")[1], lines
