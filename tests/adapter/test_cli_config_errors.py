"""A missing or broken cluster config is a user mistake: one line naming
--kubeconfig and where it looked, never a traceback, for the adapter
commands and for the controller's own entry point."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLKIT = str(pathlib.Path(sys.executable).parent / "toolkit")


@pytest.mark.parametrize(
    "argv",
    [
        [TOOLKIT, "status", "some-job", "--kubeconfig", "/nonexistent/kubeconfig"],
        [TOOLKIT, "open", "some-job", "--kubeconfig", "/nonexistent/kubeconfig"],
        [sys.executable, "-m", "controller", "--kubeconfig", "/nonexistent/kubeconfig"],
    ],
    ids=["status", "open", "controller"],
)
def test_an_unloadable_kubeconfig_is_one_line_and_no_traceback(argv: list[str], tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--kubeconfig: cannot load a cluster config from /nonexistent/kubeconfig" in lines[0]
    assert "Traceback" not in proc.stderr
    if argv[0] == TOOLKIT:
        assert lines[0].startswith(f"toolkit {argv[1]}: "), "the line names the command"
