"""Lightning through the fence (dispatch_fence.lightning.CheckpointIO), with the
real library on a tiny model, into a POSIX root, an s3:// root on the local
S3 server and a gs:// root on the GCS emulator. Each execution is a process (tests/checkpoint/fixtures/lightning_worker.py)
that resumes from what LATEST names and saves every 2 steps through the plugin.

An execution (epoch 5) trains 4 steps and publishes twice; its replacement
(epoch 6) resumes at step 4 with exactly the weights it ended with, trains to 6
and publishes; a run of the superseded execution (epoch 5) then saves and is
refused (exit 1, one line), and LATEST still names the replacement's step 6. The
replacement loads what it resumes from with torch's default `weights_only` (what
Lightning passes when `trainer.fit` is not told otherwise).

The plugin's load passes `weights_only` on to torch.load as given: a checkpoint
holding an object of a class torch does not allow is refused with None (torch's
default) and True, and loads whole with False, from every kind of root.

The replacement and the load also run at the lowest versions the `lightning`
extra allows (devcluster/build-torch-venv.sh lowest), on a POSIX root; there
torch's default loads whole.

Lightning's FSDP strategy, whose sharded checkpoints do not go through a
CheckpointIO, is refused by Lightning's Trainer without a GPU: this machine's
torch has none, so the test holds that refusal (docs/checkpoint.md says it).
"""

from __future__ import annotations

import pathlib
import subprocess


from devcluster import objectstores
from dispatch_fence import checkpoint
from tests.checkpoint import kit, stores

WORKER = kit.REPO / "tests" / "checkpoint" / "fixtures" / "lightning_worker.py"


def run(python: str, server: objectstores.Server | None, root: str, steps: int, workdir: pathlib.Path, *,
        epoch: int, attempt: str) -> tuple[int, list[str], str]:
    env = {**objectstores.clean_env(), **(server.env if server else {}), **kit.env(epoch, attempt),
           "PYTHONPATH": str(kit.REPO / "fence"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([python, str(WORKER), root, str(steps), str(workdir)], env=env, cwd=kit.REPO,
                         capture_output=True, text=True, timeout=600, check=False)
    return out.returncode, out.stdout.splitlines(), out.stderr


def test_a_replacement_resumes_what_was_published_and_the_superseded_save_is_refused(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    replaced_and_refused(torch_python, *where, tmp_path)


def test_at_the_lowest_versions_the_extra_allows_a_replacement_resumes_and_the_superseded_save_is_refused(
        torch_lowest_python: str, tmp_path: pathlib.Path) -> None:
    replaced_and_refused(torch_lowest_python, str(tmp_path / "root"), None, tmp_path)


def replaced_and_refused(python: str, root: str, server: objectstores.Server | None, tmp_path: pathlib.Path) -> None:
    code, lines, err = run(python, server, root, 4, tmp_path / "a", epoch=5, attempt="j.1.0.1.0")
    assert code == 0, err[-3000:]
    end = next(line for line in lines if line.startswith("end at step 4 weights "))
    assert [line for line in lines if line.startswith("published ")] == [
        f"published {checkpoint.name_of(5, s, 'j.1.0.1.0')}" for s in (1, 2)]

    code, lines, err = run(python, server, root, 6, tmp_path / "b", epoch=6, attempt="j.1.0.2.0")
    assert code == 0, err[-3000:]
    assert lines[0] == "start at step 4 weights " + end[len("end at step 4 weights "):]  # resumed bit for bit
    newest = checkpoint.name_of(6, 3, "j.1.0.2.0")
    assert [line for line in lines if line.startswith("published ")] == [f"published {newest}"]

    code, lines, err = run(python, server, root, 8, tmp_path / "c", epoch=5, attempt="j.1.0.1.0")
    assert code == 1 and [line for line in lines if line.startswith("published ")] == []
    refused = [line for line in err.splitlines() if line.startswith("refused: ")]
    assert refused == [f"refused: epoch 5 is lower than epoch 6 ({newest}) in {root}: a superseded execution's "
                       "save, refused; nothing published"], err[-3000:]
    found = stores.latest(server, root) if server else checkpoint.latest(root)
    assert found is not None and found.name == newest
    names = [c.name for c in checkpoint.checkpoints(root)]
    assert names == [checkpoint.name_of(5, 2, "j.1.0.1.0"), newest]  # keep=2, nothing of the refused save


LOAD = """\
import pickle, sys, torch
from dispatch_fence import lightning as fenced

class Opaque:  # a class torch's weights_only unpickler does not allow
    pass

io = fenced.CheckpointIO(sys.argv[1])
io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "extra": Opaque()}, "ignored.ckpt")
for weights_only in (None, True, False):
    try:
        loaded = io.load_checkpoint(io.resume_path(), weights_only=weights_only)
    except pickle.UnpicklingError:
        print(f"{weights_only}: refused")
    else:
        print(f"{weights_only}: {type(loaded['extra']).__name__} {loaded['state_dict']['w'].tolist()}")
"""


def test_the_load_honours_weights_only(torch_python: str, where: tuple[str, objectstores.Server | None]) -> None:
    assert load(torch_python, *where) == ["None: refused", "True: refused", "False: Opaque [1.0, 1.0]"]


def test_at_the_lowest_versions_none_is_torchs_default_there(torch_lowest_python: str,
                                                             tmp_path: pathlib.Path) -> None:
    # torch 2.4 loads whole by default (weights_only=False), with a FutureWarning
    assert load(torch_lowest_python, str(tmp_path / "root"), None) == [
        "None: Opaque [1.0, 1.0]", "True: refused", "False: Opaque [1.0, 1.0]"]


def load(python: str, root: str, server: objectstores.Server | None) -> list[str]:
    env = {**objectstores.clean_env(), **(server.env if server else {}), **kit.env(3, "j.1.0.1.0"),
           "PYTHONPATH": str(kit.REPO / "fence"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([python, "-c", LOAD, root], env=env, cwd=kit.REPO, capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


FSDP = """\
import lightning as L
try:
    L.Trainer(accelerator="cpu", devices=2, strategy="fsdp")
except ValueError as exc:
    print(exc)
"""


def test_lightning_refuses_its_fsdp_strategy_without_a_gpu(torch_python: str) -> None:
    out = subprocess.run([torch_python, "-c", FSDP], env={**objectstores.clean_env(), "CUDA_VISIBLE_DEVICES": ""},
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("The strategy `fsdp` requires a GPU accelerator, but received `accelerator='cpu'`")
