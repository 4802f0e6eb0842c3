"""The suite leaves nothing running, and its session-end check would see it
if it did (tests/e2e/conftest.py): a process group still alive, a container
of this session still there. A container whose run timed out is removed, not
left to conmon.

No control plane here: these check the checks.
"""

from __future__ import annotations

import subprocess
import uuid

import pytest

from devcluster import execute, scenario as flow, stack as stack_mod


def _pod(command: list[str]) -> dict:
    return {"metadata": {"name": f"leak-{uuid.uuid4().hex[:6]}", "namespace": "ns"},
            "spec": {"containers": [{"name": "node", "image": flow.IMAGE, "command": command}]}}


def test_a_container_that_runs_over_its_timeout_is_removed() -> None:
    with pytest.raises(execute.Timeout, match="ran over 3.0s; removed$"):
        execute.run(_pod(["/bin/sh", "-c", "echo started; sleep 120"]), container_name="node", timeout=3.0)
    assert execute.leftover_containers() == []


def test_a_container_that_finishes_is_gone_after_its_run() -> None:
    result = execute.run(_pod(["/bin/sh", "-c", "echo done"]), container_name="node")
    assert (result.exit_code, result.stdout) == (0, "done\n")
    assert execute.leftover_containers() == []


def test_the_session_check_sees_a_live_process_group_and_a_leftover_container() -> None:
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    name = f"e2e-{execute.SESSION}-{uuid.uuid4().hex[:8]}"
    created = execute.podman("create", "--name", name, "--label", f"{execute.SESSION_LABEL}={execute.SESSION}",
                             "--network=none", "--pull=never", flow.IMAGE, "true")
    try:
        assert created.returncode == 0, created.stderr
        groups = [("sleeper", sleeper.pid)]
        assert stack_mod.leftovers(groups) == [f"sleeper (process group {sleeper.pid})", f"podman container {name}"]
        stack_mod.clean_up(groups)
        sleeper.wait(10)
        assert stack_mod.leftovers(groups) == []
    finally:
        sleeper.kill()
        sleeper.wait()
        execute.podman("rm", "--force", "--time=0", name)
