"""`make demo-prologue` works as the README says: the demo script, run as it is, wraps
the sample trainer and shows, in each of the three images, the epoch and
attempt that each execution saw (first admission, a JobSet restart, a
re-admission) and then one refusal with exit status 125.

It runs scripts/demo.sh itself (the images are made by `make images`, which
`make test` runs first), so a change that breaks the newcomer's first command
fails the suite.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_demo_prints_each_execution_and_one_refusal() -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = re.findall(r"^pid=(\d+) cwd=(\S+) DISPATCH_EPOCH=(\S+) DISPATCH_ATTEMPT=(\S+) args=(.*)$",
                      proc.stdout, flags=re.MULTILINE)
    one_image = [
        ("1", "/work", "2000007000001", "llama-ft.7.0.1.0", "--epochs 3"),
        ("1", "/work", "2000007000002", "llama-ft.7.0.1.1", "--epochs 3"),
        ("1", "/work", "2000007000003", "llama-ft.7.0.2.1", "--epochs 3"),
    ]
    assert seen == one_image * 3, proc.stdout
    for flavour in ("busybox", "alpine", "debian"):
        assert f"== localhost/dispatch/sample-trainer:{flavour}" in proc.stdout
    assert proc.stdout.rstrip().endswith("exit status 125"), proc.stdout
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("dispatch: ")]
    assert refusals == [
        "dispatch: DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero"
    ], proc.stderr
