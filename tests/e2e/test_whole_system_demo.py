"""`make demo` runs the whole system on the local cluster and checks its own
outcome: the demo (devcluster/demo.py), run as a newcomer runs it, exits 0
and ends with a table in which, per TrainJob, every execution's epoch is above
every earlier one's, except the one the hand-deleted JobSet made repeat, which
is flagged foreign. This test reads the table itself, so a demo that printed
a wrong table and still exited 0 fails here; and the lines of the sidecar's
Event, of the fence stage (the preempted execution's late save refused on the
cluster's object store with both epochs, the next execution's restore of what
LATEST named, and LATEST standing), of the dispatcher stage, and those that say
our controller and the dispatcher run as the release's pods.

What is timed: the demo's run once this checkout's release images are in
local storage (built by the module's fixture before the clock starts, as
`make demo` builds them in `make release-images` before it runs), less the
time the demo reports for pushing them to its cluster's registry (a registry
that exists only once the cluster is up): at most DEMO_BUDGET_SECONDS. The
demo runs in its own process group; past DEMO_BUDGET_SECONDS plus
PUSH_ALLOWANCE_SECONDS (or when the test ends otherwise) it is sent SIGTERM, which it turns into its normal
cleanup, and either way nothing of its cluster may be left: no process names
its directory, the directory is gone, the host shows nothing of its node.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from devcluster import install, local, node as node_mod
from release import bundle, version as versioning

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
DEMO_BUDGET_SECONDS = 400.0
PUSH_ALLOWANCE_SECONDS = 120.0  # the push to the cluster's registry, reported by the demo and not timed
CLEANUP_SECONDS = 180.0  # after SIGTERM, for the demo's own cleanup


@pytest.fixture(scope="module")
def release_images() -> dict[str, str]:
    """This checkout's release images in local storage, built (or found) before the timed run."""
    with tempfile.TemporaryDirectory(prefix="dispatch-release-images-") as tmp:
        return install.release_images(versioning.describe(bundle.REPO), pathlib.Path(tmp))


def _host_snapshot() -> dict[str, object]:
    lock = node_mod.host_lock(wait=local.NODE_WAIT_SECONDS)
    try:
        return node_mod.host_snapshot()
    finally:
        os.close(lock)


def _naming(path: str) -> list[str]:
    """The processes whose command line names PATH."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if path in cmdline:
                found.append(f"{proc.name}: {cmdline[:200]}")
    return found


# pytest-timeout's bound: the node slot waited for twice (before, and by the demo), the run, its cleanup.
@pytest.mark.timeout(2 * local.NODE_WAIT_SECONDS + DEMO_BUDGET_SECONDS + PUSH_ALLOWANCE_SECONDS + CLEANUP_SECONDS)
def test_the_demo_runs_the_story_and_its_table_holds_the_identity_rule(release_images: dict[str, str]) -> None:
    before = _host_snapshot()
    began = time.monotonic()
    demo = subprocess.Popen([sys.executable, "-m", "devcluster.demo"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        out, err = demo.communicate(timeout=DEMO_BUDGET_SECONDS + PUSH_ALLOWANCE_SECONDS)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGTERM)
        out, err = demo.communicate(timeout=CLEANUP_SECONDS)
        timed_out = True
    finally:  # whatever ended the wait (pytest-timeout's among them), the demo is not left behind
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
            demo.wait(timeout=CLEANUP_SECONDS)
    elapsed = time.monotonic() - began
    workdir = re.search(r"the cluster's directory: (\S+)", out)
    assert workdir, out + err
    assert not _naming(workdir[1]), _naming(workdir[1])
    assert not pathlib.Path(workdir[1]).exists()
    store = re.search(r"the cluster's object store: versitygw at http://(\S+) ", out)
    assert store, out + err
    assert not _naming(store[1]), _naming(store[1])  # the object store stopped with the cluster
    after = _host_snapshot()
    assert {k: (before[k], after[k]) for k in before if before[k] != after[k]} == {}
    assert not timed_out, f"the demo ran past {DEMO_BUDGET_SECONDS + PUSH_ALLOWANCE_SECONDS:.0f}s:\n{out}{err}"
    assert demo.returncode == 0, out + err
    pushed = re.search(r"pushed and the bundle rendered in ([0-9.]+)s", out)
    assert pushed, out
    assert elapsed - float(pushed[1]) <= DEMO_BUDGET_SECONDS, (elapsed, pushed[1])
    # Our controller runs as the release's pods: the Lease holder, the manifest applied as released,
    # each pod's image pulled from the registry by its digest.
    assert re.search(r"the Lease dispatch-system/dispatch-controller is held by pod dispatch-controller-", out), out
    assert "controller.yaml applied as released: sha256 " in out, out
    assert len(re.findall(r"pod dispatch-controller-\S+ on \S+: imageID \S+@sha256:[0-9a-f]{64}", out)) == 2, out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("TrainJob "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("["))
    rows = [line.split(None, 7) for line in lines[start + 2:end] if line.strip()]
    by_job: dict[str, list[list[str]]] = {}
    for row in rows:
        by_job.setdefault(row[0], []).append(row)
    assert len(by_job) == 4, rows
    low = next(r for job, r in by_job.items() if job.startswith("llama-ft"))
    # admission, JobSet restart, re-admission, the reset's repeat, the execution after `toolkit adopt`
    assert [(r[2], r[3]) for r in low] == [(low[0][2], "0"), (low[0][2], "1"), (low[2][2], "1"), (low[2][2], "0"),
                                           (low[4][2], "0")]
    epochs = [int(r[5]) for r in low]
    assert epochs[0] < epochs[1] < epochs[2], epochs
    assert int(low[2][2]) > int(low[0][2])  # A raised again at re-admission
    assert epochs[3] in epochs[:3] and low[3][7] == "repeats an earlier identity: flagged foreign", low[3]
    assert epochs[4] > max(epochs[:4]) and low[4][7] == "ok: epoch above every earlier one", low[4]
    # The controller's own record, as `toolkit executions` prints it: the adoption and the high-water mark.
    assert any(line.startswith("adopted ") and "JobSet deleted by hand" in line for line in lines), lines
    assert f"high-water R: {int(low[4][4])}" in lines, lines
    plain = next(r for job, r in by_job.items() if job.startswith("sweep"))
    assert [(r[2], r[3]) for r in plain] == [("1", "0"), ("2", "0")]  # open, then hold and release
    assert int(plain[0][5]) < int(plain[1][5])
    for r in rows:
        assert int(r[4]) == int(r[2]) + int(r[3])
        assert r[6].endswith(f".{r[2]}.{r[3]}"), r
    assert "flagged foreign: JobSet UID " in out
    # The sidecar's own report, as `kubectl describe trainjob` shows it.
    described = [line for line in lines if "Warning DispatchIdentityViolation" in line]
    assert described and "jobset-uid: JobSet UID " in described[0] and "dispatch-sidecar" in described[0], lines
    # The dispatcher stage: every run done under the caps, the OOM-killed driver reported and its sandbox reaped.
    done = next(line for line in lines if "all 20 runs done:" in line)
    assert "19 succeeded, 1 failed; one Job per run; peak in flight 4 (cap 4)" in done, done
    # Each harness ran and never went over its limit; whether it reached its limit under the global
    # cap depends on which runs the backend hands out when a slot frees, so it is not asserted.
    peaks = {name: (int(peak), int(limit))
             for name, peak, limit in re.findall(r"(swe-bench|gpu-eval) (\d+)/(\d+)", done)}
    assert {name: limit for name, (_, limit) in peaks.items()} == {"swe-bench": 3, "gpu-eval": 2}, done
    assert all(1 <= peak <= limit for peak, limit in peaks.values()), done
    assert any("reported failed: reason OOMKilled, exit code 137, log tail 'step 40" in line for line in lines), lines
    assert any("its orphaned sandbox pod sandbox-" in line and "was reaped" in line for line in lines), lines
    # The dispatcher runs as the release's pod: dispatcher.yaml applied as released, the pod's image
    # pulled by its digest, no host process of ours, and the pod stops on SIGTERM with exit 0.
    assert "dispatcher.yaml applied as released: sha256 " in out, out
    assert re.search(r"pod tcab-dispatch/tcab-dispatcher-\S+ Running on \S+ as tcab-dispatcher: "
                     r"imageID \S+/dispatch/dispatcher@sha256:[0-9a-f]{64}", out), out
    assert "no process outside the kubelet's pods runs our controller or dispatcher" in out, out
    assert "the dispatcher's pod stopped on SIGTERM, exit 0" in out, out
    assert "refused as expected: spec.template.spec.failurePolicy.restartStrategy" in out
    # The fence stage, read from the containers' logs: the execution preempted by Kueue (admitted
    # again with A raised) makes a save after the next one published, through PyTorch DCP and the
    # fence's storage layer; refused, naming both epochs.
    fenced = next(r for job, r in by_job.items() if job.startswith("llama-ckpt"))
    assert [r[3] for r in fenced] == ["0", "0"] and int(fenced[1][2]) > int(fenced[0][2]), fenced
    old, new = (int(r[5]) for r in fenced)
    assert old < new, fenced
    saved = re.search(r"  execution 1 \(epoch (\d+)\) saved through the fence: LATEST names (ckpt-\S+);", out)
    assert saved and int(saved[1]) == old, out
    restored = re.search(r"  re-admitted: execution 2 \(epoch (\d+)\) starts; its log: train: restored (ckpt-\S+) "
                         r"\(epoch (\d+)\), what LATEST names: weights of (\S+), epoch (\d+)$", out, re.M)
    assert restored, out
    assert (int(restored[1]), restored[2], int(restored[3])) == (new, saved[2], old), restored.groups()
    assert (restored[4], int(restored[5])) == (fenced[0][6], old), restored.groups()
    published = re.search(r"  it saved through the fence and exited 0: LATEST names (ckpt-0*(\d+)-\S+)$", out, re.M)
    assert published and int(published[2]) == new, out
    refused = re.search(r"    train: DCP save refused by the fence: epoch (\d+) is lower than epoch (\d+) \((ckpt-\S+)\) "
                        r"in s3://\S+: a superseded execution's save, refused; nothing published$", out, re.M)
    assert refused and (int(refused[1]), int(refused[2]), refused[3]) == (old, new, published[1]), out
    assert published.start() < refused.start(), out  # the late save was tried after the new publish
    assert "    train: the final save's publish exited 1" in out, out
    stands = re.search(r"  LATEST still names (ckpt-\S+) \(epoch (\d+)\): the late save overwrote nothing", out)
    assert stands and (stands[1], int(stands[2])) == (published[1], new), out
