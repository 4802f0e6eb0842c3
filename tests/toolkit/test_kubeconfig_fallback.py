"""Where the shared client layer (`toolkit.clusterconfig.load`) finds a cluster when no path is given, and that
every help text and table that names the fallback says the same: $KUBECONFIG; without it, inside a
pod (KUBERNETES_SERVICE_HOST set) the pod's ServiceAccount, elsewhere ~/.kube/config."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from controller import settings as controller_settings
from dispatcher import settings as dispatcher_settings
from toolkit import cli, cli_cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
PROBE = ("from toolkit import clusterconfig\n"
         "try:\n    print(clusterconfig.load(retries=0).configuration.host)\n"
         "except clusterconfig.ConfigError as e:\n    print('refused:', e)\n")


def kubeconfig(path: pathlib.Path, server: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")


def found(home: pathlib.Path, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "HOME": str(home), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_a_path_kubeconfig_then_the_home_file_outside_a_pod_and_the_service_account_inside_one(
        tmp_path: pathlib.Path) -> None:
    kubeconfig(tmp_path / ".kube" / "config", "https://home.example:6443")
    kubeconfig(tmp_path / "named", "https://named.example:6443")
    assert found(tmp_path, KUBECONFIG=str(tmp_path / "named")) == "https://named.example:6443"
    assert found(tmp_path) == "https://home.example:6443"
    # Inside a pod the home file is not read: the ServiceAccount's files are (absent here).
    inside = found(tmp_path, KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    assert inside.startswith("refused: cannot load a cluster config from in-cluster"), inside


@pytest.mark.parametrize("text", [
    next(o.help for o in cli_cluster.status_cmd.params if o.name == "kubeconfig") or "",
    str(controller_settings.BY_FIELD["kubeconfig"].shown),
    next(s.help for s in dispatcher_settings.TABLE if s.name == "KUBECONFIG"),
], ids=["toolkit-cli", "controller", "dispatcher"])
def test_each_help_text_names_the_fallback_the_code_takes(text: str) -> None:
    assert "~/.kube/config" in text and "KUBERNETES_SERVICE_HOST" in text, text


def test_the_cli_help_shows_it() -> None:
    result = CliRunner().invoke(cli.root, ["status", "--help"], terminal_width=200)
    assert result.exit_code == 0 and "~/.kube/config" in result.output
