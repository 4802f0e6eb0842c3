"""PyTorch DCP through the fence, with real torch on CPU: two gloo ranks started
by torchrun (tests/checkpoint/fixtures/dcp_worker.py), into a POSIX root, an
s3:// root on the local S3 server and a gs:// root on the GCS emulator. torch
lives in a virtualenv of its own, cached in the user cache
(devcluster/build-torch-venv.sh).

- a save publishes once every rank's shards are written, and a load on a new
  pair of ranks restores it bit for bit
- two executions race: the newer publishes, the older one saves late and is
  refused on every rank (exit 1), and the restore is the newer one's, bit for bit
- dcp.async_save: nothing is published while a rank's write is still under
  way, though every rank is in result(); when result() returns, LATEST names
  the new checkpoint and every shard its DCP metadata names is there; the
  restore is the state as it was at the call, bit for bit; an async save of a
  superseded execution, planned before the newer execution published and
  written after, is refused on every rank, and so is one started after
- docs/checkpoint.md's DCP example runs as written
- at the lowest versions the `dcp` extra allows (torch 2.4), a save, an async save and their loads,
  and a superseded async save refused on every rank, on a POSIX root
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import time

import pytest

from devcluster import objectstores
from dispatch_fence import checkpoint
from tests.checkpoint import kit, stores
from tests.checkpoint import torchrun as runner

WORKER = kit.REPO / "tests" / "checkpoint" / "fixtures" / "dcp_worker.py"
DOC = kit.REPO / "docs" / "checkpoint.md"


@pytest.fixture(autouse=True)
def _torchrun_temp_under_the_test(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun makes a directory per run under TMPDIR (torchelastic_*) and leaves it: under the
    test's own temporary directory, not the host's /tmp."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))


def torchrun(python: str, env: dict[str, str], *args: str, epoch: int | None = None,
             attempt: str = "") -> subprocess.Popen[str]:
    return runner.start(python, WORKER, env, *args, epoch=epoch, attempt=attempt)


finish = runner.finish


def test_a_save_publishes_after_every_rank_and_loads_bit_exact(
        torch_python: str, where: tuple[str, objectstores.Server | None]) -> None:
    root, server = where
    env = server.env if server else {}
    code, lines, err = finish(torchrun(torch_python, env, "save", root, epoch=5, attempt="j.1.0.1.0"))
    name = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert (code, lines) == (0, [f"rank 0: published {name}", f"rank 1: published {name}"]), err[-3000:]
    code, lines, err = finish(torchrun(torch_python, env, "load", root, "5"))
    assert (code, lines) == (0, [f"rank 0: loaded {name} bit-exact", f"rank 1: loaded {name} bit-exact"]), err[-3000:]


def test_a_superseded_execution_is_refused_on_every_rank_and_the_restore_is_the_newer(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    root, server = where
    env = server.env if server else {}
    gate = tmp_path / "gate"
    old = torchrun(torch_python, env, "save", root, str(gate), epoch=5, attempt="j.1.0.1.0")
    new = torchrun(torch_python, env, "save", root, epoch=6, attempt="j.1.0.2.0")
    try:
        code, lines, err = finish(new)
        name = checkpoint.name_of(6, 1, "j.1.0.2.0")
        assert (code, lines) == (0, [f"rank 0: published {name}", f"rank 1: published {name}"]), err[-3000:]
    finally:
        gate.touch()  # the old execution saves only now: late, gated on the new publish
    code, lines, err = finish(old)
    refused = sorted(line for line in err.splitlines() if line.startswith("rank ") and "refused" in line)
    assert code != 0 and lines == []
    assert refused == [f"rank {r}: refused: epoch 5 is lower than epoch 6 ({name}) in {root}: a superseded "
                       "execution's save, refused; nothing published" for r in (0, 1)], err[-3000:]
    code, lines, err = finish(torchrun(torch_python, env, "load", root, "6"))
    assert (code, lines) == (0, [f"rank 0: loaded {name} bit-exact", f"rank 1: loaded {name} bit-exact"]), err[-3000:]
    # The refused save left nothing under the root (on a volume, its staging directory stays beside).
    if server is not None:
        assert not [k for k in stores.tree(server, root) if "-j.1.0.1.0/" in k]
    else:
        assert [c.epoch for c in checkpoint.checkpoints(root)] == [6]


stop = runner.stop
wait_for = runner.wait_for


def test_an_async_save_publishes_in_result_after_every_rank_wrote_and_loads_the_state_at_the_call(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    root, server = where
    env = server.env if server else {}
    hold = tmp_path / "hold"
    p = torchrun(torch_python, env, "async", root, "--hold", str(hold), epoch=6, attempt="j.1.0.2.0")
    try:
        # Rank 1's write is held in DCP's background thread; both ranks are in result().
        wait_for([pathlib.Path(f"{hold}.writing")] + [pathlib.Path(f"{hold}.result.{r}") for r in (0, 1)], p, 120)
        for _ in range(15):  # a publish that did not wait for the write would show here
            found = stores.latest(server, root) if server else checkpoint.latest(root)
            assert found is None and p.poll() is None, found
            time.sleep(0.2)
    except BaseException:
        hold.touch()
        stop(p)
        raise
    hold.touch()
    code, lines, err = finish(p)
    name = checkpoint.name_of(6, 1, "j.1.0.2.0")
    assert (code, lines) == (0, [
        "rank 0: before result() LATEST names None", f"rank 0: published {name}; LATEST names it; "
        "shards __0_0.distcp __1_0.distcp", "rank 1: before result() LATEST names None",
        f"rank 1: published {name}; LATEST names it; shards __0_0.distcp __1_0.distcp"]), err[-3000:]
    code, lines, err = finish(torchrun(torch_python, env, "load", root, "6"))
    assert (code, lines) == (0, [f"rank 0: loaded {name} bit-exact", f"rank 1: loaded {name} bit-exact"]), err[-3000:]
    # A superseded execution's async save started only now is refused in result(), on every rank.
    code, lines, err = finish(torchrun(torch_python, env, "async", root, epoch=5, attempt="j.1.0.1.0"))
    refused = sorted(line for line in err.splitlines() if line.startswith("rank ") and "refused" in line)
    assert code == 1 and lines == [f"rank {r}: before result() LATEST names {name}" for r in (0, 1)], err[-3000:]
    assert refused == [f"rank {r}: refused: epoch 5 is lower than epoch 6 ({name}) in {root}: a superseded "
                       "execution's save, refused; nothing published" for r in (0, 1)], err[-3000:]


def test_an_async_save_overtaken_by_a_newer_execution_is_refused_on_every_rank(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    root, server = where
    env = server.env if server else {}
    hold = tmp_path / "hold"
    old = torchrun(torch_python, env, "async", root, "--hold", str(hold), epoch=5, attempt="j.1.0.1.0")
    try:
        # Its save is planned (and on an object store its name claimed); rank 1's write is held.
        wait_for([pathlib.Path(f"{hold}.writing")] + [pathlib.Path(f"{hold}.result.{r}") for r in (0, 1)], old)
        code, lines, err = finish(torchrun(torch_python, env, "async", root, epoch=6, attempt="j.1.0.2.0"))
        found = stores.latest(server, root) if server else checkpoint.latest(root)
        name = found.name if found else None
        assert name is not None and found.epoch == 6, err[-3000:]
        assert (code, lines[1::2]) == (0, [f"rank {r}: published {name}; LATEST names it; shards __0_0.distcp "
                                           "__1_0.distcp" for r in (0, 1)]), err[-3000:]
    except BaseException:
        hold.touch()
        stop(old)
        raise
    hold.touch()  # the old execution's write ends only now, after the newer one published
    code, lines, err = finish(old)
    refused = sorted(line for line in err.splitlines() if line.startswith("rank ") and "refused" in line)
    assert code == 1 and lines == [f"rank {r}: before result() LATEST names None" for r in (0, 1)], err[-3000:]
    assert refused == [f"rank {r}: refused: epoch 5 is lower than epoch 6 ({name}) in {root}: a superseded "
                       "execution's save, refused; nothing published" for r in (0, 1)], err[-3000:]
    code, lines, err = finish(torchrun(torch_python, env, "load", root, "6"))
    assert (code, lines) == (0, [f"rank 0: loaded {name} bit-exact", f"rank 1: loaded {name} bit-exact"]), err[-3000:]
    if server is not None:
        assert not [k for k in stores.tree(server, root) if "-j.1.0.1.0/" in k]
    else:
        assert [c.epoch for c in checkpoint.checkpoints(root)] == [6]


def test_at_the_lowest_versions_the_extra_allows_a_save_and_an_async_save_publish_and_load_and_a_late_one_is_refused(
        torch_lowest_python: str, tmp_path: pathlib.Path) -> None:
    """torch 2.4 (devcluster/build-torch-venv.sh lowest) on a POSIX root, for what differs between
    the ends: DCP's save, async_save (the state restored is the one at the call, though training
    changed it: the writer's own staging) and load, and a refusal through DCP's CheckpointException.
    The races and the stores run at the pinned end only; the storage layer's suite runs the rest."""
    root = str(tmp_path / "root")
    python = torch_lowest_python
    code, lines, err = finish(torchrun(python, {}, "save", root, epoch=5, attempt="j.1.0.1.0"))
    old = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert (code, lines) == (0, [f"rank 0: published {old}", f"rank 1: published {old}"]), err[-3000:]
    code, lines, err = finish(torchrun(python, {}, "load", root, "5"))
    assert (code, lines) == (0, [f"rank 0: loaded {old} bit-exact", f"rank 1: loaded {old} bit-exact"]), err[-3000:]
    code, lines, err = finish(torchrun(python, {}, "async", root, epoch=6, attempt="j.1.0.2.0"))
    name = checkpoint.name_of(6, 2, "j.1.0.2.0")
    assert (code, lines) == (0, [
        f"rank {r}: {said}" for r in (0, 1) for said in (
            f"before result() LATEST names {old}",
            f"published {name}; LATEST names it; shards __0_0.distcp __1_0.distcp")]), err[-3000:]
    code, lines, err = finish(torchrun(python, {}, "load", root, "6"))
    assert (code, lines) == (0, [f"rank 0: loaded {name} bit-exact", f"rank 1: loaded {name} bit-exact"]), err[-3000:]
    code, lines, err = finish(torchrun(python, {}, "async", root, epoch=5, attempt="j.1.0.1.0"))
    refused = sorted(line for line in err.splitlines() if line.startswith("rank ") and "refused" in line)
    want = [(f"rank {r}: refused: epoch 5 is lower than epoch 6 ({name}) in {root}: a superseded execution's save, "
             "refused; nothing published") for r in (0, 1)]
    assert (code, refused) == (1, want), err[-3000:]


def test_the_doc_example_runs_as_written(torch_python: str, s3: objectstores.Server, tmp_path: pathlib.Path) -> None:
    """docs/checkpoint.md's DCP example, under torchrun on the local S3 server: an execution saves at
    steps 1 and 2, the next resumes at 2 and saves at 3 and 4, a superseded one is refused."""
    text = DOC.read_text()
    section = text[text.index("\n## PyTorch DCP\n"):]
    section = section[:section.index("\n## ", 1)]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example, "the PyTorch DCP section lost its example"
    script = tmp_path / "train.py"
    script.write_text(example.group(1))
    s3.add_bucket("training")
    root = "s3://training/llama-ft"

    def run(epoch: int, attempt: str) -> subprocess.CompletedProcess[str]:
        full = {**objectstores.clean_env(), **s3.env, **kit.env(epoch, attempt),
                "PYTHONPATH": str(kit.REPO / "fence"), "OMP_NUM_THREADS": "1"}
        return subprocess.run([torch_python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                               "--nproc-per-node", "2", str(script)], env=full, cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, check=False)

    out = run(7, "llama-ft.7.0.1.0")
    assert (out.returncode, out.stdout) == (0, f"{checkpoint.name_of(7, 2, 'llama-ft.7.0.1.0')} 2\n"), out.stderr[-3000:]
    out = run(8, "llama-ft.7.0.2.0")
    newest = checkpoint.name_of(8, 4, "llama-ft.7.0.2.0")
    assert (out.returncode, out.stdout) == (0, f"{newest} 4\n"), out.stderr[-3000:]
    out = run(7, "llama-ft.7.0.1.0")
    assert out.returncode != 0 and out.stdout == ""
    refusal = f"StaleEpoch: epoch 7 is lower than epoch 8 ({newest}) in {root}"
    for rank in (0, 1):  # DCP's CheckpointException, on each rank, carries the fence's refusal
        assert [line for line in out.stderr.splitlines() if line.startswith(f"[rank{rank}]:") and refusal in line], \
            out.stderr[-3000:]
    assert stores.latest(s3, root).name == newest
