"""The transformers Trainer through the fence (dispatch_fence.huggingface.Callback), with the real
library on a tiny Llama built from a config (nothing downloaded: HF_HUB_OFFLINE=1), on CPU, into a
POSIX root, an s3:// root on the local S3 server and a gs:// root on the GCS emulator. Each
execution is a process (tests/checkpoint/fixtures/huggingface_worker.py) that resumes from what
LATEST names and saves every 2 steps through the callback; with --hold it waits after each publish
until the test lets it go on.

- Preempted: an execution (epoch 5) publishes steps 2 and 4 and is killed (SIGKILL); its
  replacement (epoch 6) resumes at step 4 with exactly the weights that were published, trains to
  6 and publishes.
- Late: an execution (epoch 5) publishes step 2 and stalls; its replacement (epoch 6) resumes at
  step 2 and publishes step 4; the stalled one then trains on and saves, and that save is refused
  (exit 1, one line): LATEST still names the replacement's, and nothing of the late save is left.

Both run with the pinned versions on every kind of root, and at the lowest versions the
`huggingface` extra allows (devcluster/build-torch-venv.sh lowest) on a POSIX root: the callback
uses the same Trainer API at both ends. Two processes under torchrun publish each save once (both
RNG states in it), resume, and are refused together; processes on two nodes are refused. The example of
docs/checkpoint.md's "Hugging Face Trainer" runs as written on the local S3 server.
"""

from __future__ import annotations

import pathlib
import re
import socket
import subprocess

from devcluster import objectstores
from dispatch_fence import checkpoint
from tests.checkpoint import kit, stores

WORKER = kit.REPO / "tests" / "checkpoint" / "fixtures" / "huggingface_worker.py"
OLD, NEW = "j.1.0.1.0", "j.1.0.2.0"


def start(python: str, server: objectstores.Server | None, root: str, steps: int, workdir: pathlib.Path, *,
          epoch: int, attempt: str, hold: bool = False) -> subprocess.Popen[str]:
    env = {**objectstores.clean_env(), **(server.env if server else {}), **kit.env(epoch, attempt),
           "PYTHONPATH": str(kit.REPO / "fence"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workdir / "hf-home")}
    argv = [python, str(WORKER), root, str(steps), str(workdir), *(["--hold"] if hold else [])]
    return subprocess.Popen(argv, env=env, cwd=kit.REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, list[str], str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out.splitlines(), err


def read_until_published(proc: subprocess.Popen[str], step: int) -> list[str]:
    """The worker's lines up to its publish of STEP (it waits there, held)."""
    assert proc.stdout is not None
    lines: list[str] = []
    while not (lines and lines[-1].startswith("published ") and f" at step {step} " in lines[-1]):
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            err = proc.communicate()[1]
            raise AssertionError(f"the worker ended before publishing step {step}: {lines} {err[-3000:]}")
        lines.append(line.rstrip("\n"))
        if lines[-1].startswith("published ") and f" at step {step} " not in lines[-1]:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
    return lines


def weights_of(line: str) -> str:
    return line.rsplit(" weights ", 1)[1]


def latest(server: objectstores.Server | None, root: str) -> checkpoint.Checkpoint | None:
    return stores.latest(server, root) if server else checkpoint.latest(root)


def test_a_preempted_run_is_resumed_from_what_it_published(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    preempted_and_resumed(torch_python, *where, tmp_path)


def test_a_stalled_runs_late_save_is_refused(
        torch_python: str, where: tuple[str, objectstores.Server | None], tmp_path: pathlib.Path) -> None:
    stalled_and_refused(torch_python, *where, tmp_path)


def test_at_the_lowest_versions_the_extra_allows_a_run_resumes_and_a_late_save_is_refused(
        torch_lowest_python: str, tmp_path: pathlib.Path) -> None:
    preempted_and_resumed(torch_lowest_python, str(tmp_path / "root"), None, tmp_path / "preempted")
    stalled_and_refused(torch_lowest_python, str(tmp_path / "root2"), None, tmp_path / "stalled")


def preempted_and_resumed(python: str, root: str, server: objectstores.Server | None, tmp_path: pathlib.Path) -> None:
    old = start(python, server, root, 8, tmp_path / "a", epoch=5, attempt=OLD, hold=True)
    try:
        lines = read_until_published(old, 4)
    finally:
        old.kill()
        old.communicate(timeout=60)
    assert lines[0].startswith("start at step 0 weights ")
    published = [line.split()[1] for line in lines if line.startswith("published ")]
    assert published == [checkpoint.name_of(5, s, OLD) for s in (1, 2)]

    code, new_lines, err = finish(start(python, server, root, 6, tmp_path / "b", epoch=6, attempt=NEW))
    assert code == 0, err[-3000:]
    assert new_lines[0] == f"start at step 4 weights {weights_of(lines[-1])}"  # resumed bit for bit
    newest = checkpoint.name_of(6, 3, NEW)
    assert [line.split()[1] for line in new_lines if line.startswith("published ")] == [newest]
    found = latest(server, root)
    assert found is not None and found.name == newest
    assert not any((tmp_path / "b").glob("checkpoint-*"))  # moved into the root or uploaded, none left behind


def stalled_and_refused(python: str, root: str, server: objectstores.Server | None, tmp_path: pathlib.Path) -> None:
    old = start(python, server, root, 4, tmp_path / "a", epoch=5, attempt=OLD, hold=True)
    try:
        lines = read_until_published(old, 2)
        code, new_lines, err = finish(start(python, server, root, 4, tmp_path / "b", epoch=6, attempt=NEW))
        assert code == 0, err[-3000:]
        assert new_lines[0] == f"start at step 2 weights {weights_of(lines[-1])}"
        newest = checkpoint.name_of(6, 2, NEW)
        assert [line.split()[1] for line in new_lines if line.startswith("published ")] == [newest]

        assert old.stdin is not None
        old.stdin.write("go\n")
        old.stdin.flush()
        code, old_lines, err = finish(old)
    finally:
        old.kill()
    assert code == 1 and [line for line in old_lines if line.startswith("published ")] == []
    refused = [line for line in err.splitlines() if line.startswith("refused: ")]
    want = (f"refused: epoch 5 is lower than epoch 6 ({newest}) in {root}: a superseded execution's save, refused; "
            "nothing published")
    assert refused == [want], err[-3000:]
    found = latest(server, root)
    assert found is not None and found.name == newest
    assert [c.name for c in checkpoint.checkpoints(root)] == [checkpoint.name_of(5, 1, OLD), newest]
    if server is None:  # nothing of the refused save in the root, nor in the Trainer's output directory
        assert sorted(p.name for p in pathlib.Path(root).iterdir()) == sorted(
            [checkpoint.LATEST, checkpoint.LOCK, checkpoint.name_of(5, 1, OLD), newest])
    assert not any((tmp_path / "a").glob("checkpoint-*"))


REFUSE = """\
import sys, torch, transformers
from dispatch_fence import checkpoint, huggingface
config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2)
args = transformers.TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to="none")
try:
    transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args,
                         callbacks=[huggingface.Callback(sys.argv[2])])
except checkpoint.BadInput as exc:
    print(f"{args.process_index}: {exc}", flush=True)
    torch.distributed.barrier()  # both have printed before the first exit ends the other
    sys.exit(1)
"""


def test_processes_on_more_than_one_node_are_refused_before_the_first_step(torch_python: str,
                                                                          tmp_path: pathlib.Path) -> None:
    # Two nodes of one process each, both on this machine: world_size 2, LOCAL_WORLD_SIZE 1.
    (tmp_path / "refuse.py").write_text(REFUSE)
    env = {**objectstores.clean_env(), "PYTHONPATH": str(kit.REPO / "fence"), "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf-home"), "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen([torch_python, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                               str(tmp_path / "refuse.py"), str(tmp_path / f"out{rank}"), str(tmp_path / "root")],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [1, 1], [err[-3000:] for _, err in outs]
    assert [out for out, _ in outs] == [
        f"{rank}: world_size is 2, LOCAL_WORLD_SIZE 1: dispatch_fence.huggingface publishes from one node only "
        "(world_size <= LOCAL_WORLD_SIZE)\n" for rank in (0, 1)]
    assert not (tmp_path / "root").exists()


def torchrun(python: str, root: str, steps: int, workdir: pathlib.Path, *, epoch: int,
             attempt: str) -> tuple[int, list[str], str]:
    env = {**objectstores.clean_env(), **kit.env(epoch, attempt), "PYTHONPATH": str(kit.REPO / "fence"),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(workdir / "hf-home")}
    out = subprocess.run([python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER),
                          root, str(steps), str(workdir)], env=env, cwd=kit.REPO, capture_output=True, text=True,
                         timeout=600, check=False)
    # without the Trainer's progress bars, so that a failure shows both processes' own lines
    return out.returncode, out.stdout.splitlines(), "\n".join(
        line for line in out.stderr.splitlines() if "Writing model shards" not in line)


def test_two_processes_publish_each_save_once_resume_and_are_refused_together(
        torch_python: str, tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "root")
    code, lines, err = torchrun(torch_python, root, 4, tmp_path / "a", epoch=5, attempt=OLD)
    assert code == 0, err[-6000:]
    published = [line for line in lines if line.startswith("published ")]
    assert [line.split()[1] for line in published] == [checkpoint.name_of(5, s, OLD) for s in (1, 2)]
    # both processes' RNG states are in what was published, and nothing is left in the output directory
    assert sorted(p.name for p in pathlib.Path(root, checkpoint.name_of(5, 2, OLD)).glob("rng_state*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]
    assert not any((tmp_path / "a").glob("checkpoint-*"))

    code, new_lines, err = torchrun(torch_python, root, 6, tmp_path / "b", epoch=6, attempt=NEW)
    assert code == 0, err[-3000:]
    assert new_lines[0] == f"start at step 4 weights {weights_of(published[-1])}"
    newest = checkpoint.name_of(6, 3, NEW)
    assert [line.split()[1] for line in new_lines if line.startswith("published ")] == [newest]

    code, old_lines, err = torchrun(torch_python, root, 8, tmp_path / "c", epoch=5, attempt=OLD)
    assert code != 0 and [line for line in old_lines if line.startswith("published ")] == []
    want = (f"refused: epoch 5 is lower than epoch 6 ({newest}) in {root}: a superseded execution's save, refused; "
            "nothing published")
    assert [line for line in err.splitlines() if line.startswith("refused: ")] == [want, want], err[-3000:]
    assert checkpoint.latest(root).name == newest
    assert [c.name for c in checkpoint.checkpoints(root)] == [checkpoint.name_of(5, 2, OLD), newest]


EXAMPLE_MODEL = """\
import torch, transformers
config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2)
model = transformers.LlamaForCausalLM(config)
ids = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))
data = [{"input_ids": row, "labels": row} for row in ids]
"""
EXAMPLE_REPORT = """
print([c.name for c in fence.published], trainer.state.global_step)
"""


def example() -> str:
    text = (kit.REPO / "docs" / "checkpoint.md").read_text()
    section = text[text.index("\n## Hugging Face Trainer\n"):]
    found = re.search(r"```python\n(.*?)```", section[:section.index("\n## ", 1)], re.S)
    assert found, "the Hugging Face Trainer section lost its example"
    return found.group(1)


def test_the_docs_example_runs_as_written(torch_python: str, s3: objectstores.Server) -> None:
    # The example's root is s3://training/llama-ft and its directories /tmp/out and /tmp/resume.
    s3.add_bucket("training")
    env = {**objectstores.clean_env(), **s3.env, "PYTHONPATH": str(kit.REPO / "fence"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    outputs = []
    try:
        for epoch, attempt in ((3, OLD), (4, NEW)):
            out = subprocess.run([torch_python, "-c", EXAMPLE_MODEL + example() + EXAMPLE_REPORT],
                                 env={**env, **kit.env(epoch, attempt)}, capture_output=True, text=True, timeout=600,
                                 check=False)
            assert out.returncode == 0, out.stderr[-3000:]
            outputs.append(out.stdout.splitlines()[-1])
    finally:
        subprocess.run(["rm", "-rf", "/tmp/out", "/tmp/resume"], check=True)
    first = checkpoint.name_of(3, 1, OLD)
    # the first trains 3 epochs of 2 steps and publishes at the end; the second resumes there, done
    assert outputs == [f"['{first}'] 6", "[] 6"]
    assert stores.latest(s3, "s3://training/llama-ft").name == first
