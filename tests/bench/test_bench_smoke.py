"""Every bench under bench/ still runs: its smoke mode (`--smoke`, a handful
of runs) exits 0 and prints its table. The figures of a smoke run mean
nothing and are not checked; the full runs are `make bench`.

A bench file with no entry here fails `test_every_bench_has_a_smoke_run`, so a
new bench cannot be left out.

A bench that runs the local cluster with its real node (controller, admission, dispatcher) first waits
for the one node slot of the host, as the node suites do (DISPATCH_NODE_WAIT_SECONDS,
devcluster/local.py): its time allowed is that wait plus its own.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from devcluster import local

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
# The seconds a bench that runs the real node may wait for the host's node slot, on top of its own.
NODE = local.NODE_WAIT_SECONDS
# name: (the interpreter it runs under, the marks of what it needs, seconds it may take)
SMOKE = {
    "checkpoint": ([sys.executable], [], 120),
    "checkpoint-s3": ([sys.executable], [], 300),
    "prologue": ([sys.executable], [], 300),
    "wrap": (["bash"], [], 120),
    "controller": ([sys.executable], [pytest.mark.cluster, pytest.mark.timeout(NODE + 660)], NODE + 600),
    "admission": ([sys.executable], [pytest.mark.cluster, pytest.mark.timeout(NODE + 660)], NODE + 600),
    "dispatcher": ([sys.executable], [pytest.mark.cluster, pytest.mark.timeout(NODE + 660)], NODE + 600),
    "sidecar": ([sys.executable], [pytest.mark.cluster, pytest.mark.images], 900),
}
TABLE_SEPARATOR = re.compile(r"^\|( *:?-{3,}:? *\|)+$")


def test_every_bench_has_a_smoke_run() -> None:
    assert sorted(p.name for p in BENCH.iterdir() if p.is_file()) == sorted(SMOKE)


@pytest.mark.parametrize("name", [pytest.param(name, marks=marks) for name, (_, marks, _) in SMOKE.items()])
def test_the_bench_runs_and_prints_its_table(name: str) -> None:
    runner, _, timeout = SMOKE[name]
    done = subprocess.run([*runner, str(BENCH / name), "--smoke"], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"bench/{name} --smoke exited {done.returncode}:\n{done.stderr[-4000:]}"
    lines = done.stdout.splitlines()
    separators = [i for i, line in enumerate(lines) if TABLE_SEPARATOR.match(line)]
    assert separators, f"bench/{name} --smoke printed no table:\n{done.stdout}"
    for i in separators:
        assert i > 0 and lines[i - 1].startswith("| "), f"a table without a header:\n{done.stdout}"
        assert i + 1 < len(lines) and lines[i + 1].startswith("| "), f"a table without rows:\n{done.stdout}"
