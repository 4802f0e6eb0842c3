"""Two gloo ranks on this machine under torchrun, as the DCP suites run their workers: each rank
prints lines `rank R: ...`, which `finish` gathers."""

from __future__ import annotations

import pathlib
import subprocess
import time

from devcluster import objectstores
from tests.checkpoint import kit


def start(python: str, worker: pathlib.Path, env: dict[str, str], *args: str, epoch: int | None = None,
          attempt: str = "") -> subprocess.Popen[str]:
    """WORKER with ARGS on two ranks in the torch venv's PYTHON, the fence importable, ENV (and the
    identity of EPOCH and ATTEMPT, when given) in their environment."""
    full = {**objectstores.clean_env(), **env, "PYTHONPATH": str(kit.REPO / "fence"), "OMP_NUM_THREADS": "1"}
    if epoch is not None:
        full.update(kit.env(epoch, attempt))
    return subprocess.Popen([python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                             "--nproc-per-node", "2", str(worker), *args], env=full, cwd=kit.REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen[str]) -> tuple[int, list[str], str]:
    """The exit status, the ranks' `rank R: ...` lines sorted, and stderr."""
    out, err = p.communicate(timeout=600)
    return p.returncode, sorted(line for line in out.splitlines() if line.startswith("rank ")), err


def stop(p: subprocess.Popen[str]) -> str:
    """End torchrun (it ends its workers on SIGTERM); its stderr."""
    if p.poll() is None:
        p.terminate()
    try:
        return p.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate(timeout=60)[1]


def wait_for(paths: list[pathlib.Path], p: subprocess.Popen[str], within: float = 300) -> None:
    """Wait until every one of PATHS exists while P runs; fail (P ended) when P ends first or after WITHIN seconds."""
    deadline = time.monotonic() + within
    while not all(path.exists() for path in paths):
        if p.poll() is not None or time.monotonic() > deadline:
            missing = [str(path) for path in paths if not path.exists()]
            raise AssertionError(f"{missing} never appeared: {stop(p)[-3000:]}")
        time.sleep(0.1)
