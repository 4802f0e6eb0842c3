"""docs/checkpoint.md's object-store examples run as written, against the local
S3 server (devcluster/objectstores.py), configured by the environment only: the
Python example with a `save_model` that writes two files (the doc's "any
framework"), then the shell example; the second execution's save is refused
once the first one's replacement has published."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devcluster import objectstores
from dispatch_fence import checkpoint
from tests.checkpoint import kit, stores

DOC = kit.REPO / "docs" / "checkpoint.md"
BUCKET, ROOT = "training", "s3://training/llama-ft"
SAVE_MODEL = '''
import os
def save_model(path):
    os.makedirs(path)
    with open(os.path.join(path, "model.bin"), "w") as f:
        f.write(os.environ["DISPATCH_ATTEMPT"])
'''


def examples() -> tuple[str, str]:
    """The first python and the first sh block of the doc's "Object stores" section."""
    text = DOC.read_text()
    section = text[text.index("\n## Object stores\n"):]
    section = section[:section.index("\n## ", 1)]
    python = re.search(r"```python\n(.*?)```", section, re.S)
    sh = re.search(r"```sh\n(.*?)```", section, re.S)
    assert python and sh, "the Object stores section lost its examples"
    return python.group(1), sh.group(1)


@pytest.fixture(scope="module")
def s3() -> Iterator[objectstores.Server]:
    server = objectstores.S3Server()
    try:
        server.start()
        server.add_bucket(BUCKET)
        yield server
    finally:
        server.close()


def env(server: objectstores.Server, epoch: int, attempt: str) -> dict[str, str]:
    venv = str(pathlib.Path(sys.executable).parent)  # python3 of the examples: the project's
    base = objectstores.clean_env()
    return {**base, **server.env, **kit.env(epoch, attempt), "PATH": f"{venv}:{base.get('PATH', '')}"}


def run_shell(server: objectstores.Server, sh: str, epoch: int, attempt: str) -> subprocess.CompletedProcess[str]:
    staging = pathlib.Path(f"/tmp/staging-{attempt}")  # where the example's trainer staged
    subprocess.run(["rm", "-rf", str(staging)], check=True)
    kit.staging(staging.parent, attempt, name=staging.name)
    try:
        return subprocess.run(["sh", "-c", sh], env=env(server, epoch, attempt), capture_output=True, text=True,
                              timeout=120, check=False)
    finally:
        subprocess.run(["rm", "-rf", str(staging)], check=True)


def test_the_examples_run_as_written(s3: objectstores.Server) -> None:
    python, sh = examples()
    # The Python example, as the execution with epoch 7: publishes, prints the path, reads it back.
    staging = "/tmp/staging-llama-ft.7.0.2.0"  # the example's (it is uploaded, not moved: left behind)
    subprocess.run(["rm", "-rf", staging], check=True)
    try:
        out = subprocess.run([sys.executable, "-c", SAVE_MODEL + python], env=env(s3, 7, "llama-ft.7.0.2.0"),
                             capture_output=True, text=True, timeout=120, check=False)
    finally:
        subprocess.run(["rm", "-rf", staging], check=True)
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == f"{ROOT}/{checkpoint.name_of(7, 1, 'llama-ft.7.0.2.0')}\n"
    found = stores.latest(s3, ROOT)
    assert found.epoch == 7 and stores.tree(s3, ROOT)[f"{found.name}/model.bin"] == b"llama-ft.7.0.2.0"
    # The shell example, as the superseded execution (epoch 6): refused, one line, nothing changed.
    # (`sh -c` goes on after the refused publish and runs the second line, which exits 0.)
    before = stores.tree(s3, ROOT)
    out = run_shell(s3, sh, 6, "llama-ft.7.0.1.0")
    assert out.stderr.startswith("python -m dispatch_fence publish: epoch 6 is lower than epoch 7 ")
    assert out.stderr.count("\n") == 1 and out.returncode == 0 and out.stdout == ""
    assert stores.tree(s3, ROOT) == before
    # And as the next execution (epoch 8): published, LATEST names it.
    out = run_shell(s3, sh, 8, "llama-ft.7.0.3.0")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{ROOT}/{checkpoint.name_of(8, 2, 'llama-ft.7.0.3.0')}\n", "")
    assert stores.latest(s3, ROOT).epoch == 8
