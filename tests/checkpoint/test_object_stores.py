"""The fence on object stores, against real servers (devcluster/objectstores.py):
versitygw for S3 (If-None-Match: *, If-Match) and fake-gcs-server for GCS
(ifGenerationMatch), each test once on each. Every publish is a real process,
`python -m dispatch_fence publish ... s3://|gs://...`, configured by its
environment only, as a training pod is; most are driven step by step through
the test hook (objectstore.STEPS).

- a late save (a lower epoch) is refused, exit 1, one line, the root unchanged
- twelve publishers with different epochs, all past the fence before any
  uploads: the highest wins, every other one is refused or was overtaken, and
  every checkpoint that was published is whole
- a publisher SIGKILLed at every step: LATEST is the old one before the commit
  point and the new one after, whole either way; what it uploaded still fences
- retention never removes what LATEST names, nor a checkpoint above it that
  another publish is about to name
- a release of the same server that ignores the preconditions is refused (exit
  2), and nothing is left in the root
"""

from __future__ import annotations

import pathlib
import random
import re
import subprocess
import sys
import threading

import pytest

from devcluster import objectstores
from dispatch_fence import checkpoint, objectstore
from tests.checkpoint import kit, stores


def run(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, "-m", "dispatch_fence", *args], env={**objectstores.clean_env(), **env},
                         capture_output=True, text=True, timeout=120, cwd=kit.REPO, check=False)
    return out.returncode, out.stdout, out.stderr


def publish(server: objectstores.Server, staging: pathlib.Path, root: str, epoch: int, attempt: str,
            *extra: str) -> tuple[int, str, str]:
    return run("publish", str(staging), root, "--epoch", str(epoch), "--attempt", attempt, *extra, env=server.env)


def files_of(token: str) -> dict[str, bytes]:
    """What kit.staging(..., token) uploads, relative to the checkpoint."""
    return {"COMPLETE": b"", "model.bin": token.encode(), "shards/0.bin": token.encode() * 3}


def whole(tree: dict[str, bytes], name: str, token: str) -> bool:
    return {k[len(name) + 1:]: v for k, v in tree.items() if k.startswith(name + "/")} == files_of(token)


def test_publish_uploads_every_file_and_latest_names_it(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    staging = kit.staging(tmp_path, "a")
    before = kit.tree(staging)
    assert publish(server, staging, root, 5, "j.1.0.1.0") == (0, f"{root}/{checkpoint.name_of(5, 1, 'j.1.0.1.0')}\n", "")
    first = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert stores.tree(server, root) == {"LATEST": f"{first}\n".encode(),
                                         **{f"{first}/{k}": v for k, v in files_of("a").items()}}
    assert kit.tree(staging) == before  # uploaded, not moved
    # Equal epochs advance (the same execution saving again): the next serial.
    assert publish(server, kit.staging(tmp_path, "b"), root, 5, "j.1.0.1.0")[0] == 0
    second = checkpoint.name_of(5, 2, "j.1.0.1.0")
    assert run("latest", root, env=server.env) == (0, f"{root}/{second}\n", "")
    found = stores.latest(server, root)
    assert (found.name, found.epoch, found.serial, found.path) == (second, 5, 2, f"{root}/{second}")
    assert [c.name for c in checkpoint.checkpoints(root)] == [first, second]


def test_latest_before_the_first_publish_prints_nothing(server: objectstores.Server) -> None:
    assert run("latest", server.root(), env=server.env) == (0, "", "")


def test_a_late_save_is_refused_and_changes_nothing(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    assert publish(server, kit.staging(tmp_path, "new"), root, 7, "j.1.0.2.0")[0] == 0
    before = stores.tree(server, root)
    code, out, err = publish(server, kit.staging(tmp_path, "old"), root, 6, "j.1.0.1.0")
    assert (code, out) == (1, "")
    assert err == (f"python -m dispatch_fence publish: epoch 6 is lower than epoch 7 "
                   f"({checkpoint.name_of(7, 1, 'j.1.0.2.0')}) in {root}: "
                   "a superseded execution's save, refused; nothing published\n")
    assert stores.tree(server, root) == before


def test_twelve_publishers_race_and_the_highest_epoch_wins(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    epochs = list(range(1, 13))
    random.Random(12).shuffle(epochs)
    procs = [stores.Publisher(kit.staging(tmp_path, f"e{e}"), root, epoch=e, attempt=f"j.1.0.{e}.0", env=server.env)
             for e in epochs]
    # Every one has listed the empty root and passed the fence before any of them uploads.
    for p in procs:
        p.run_to("fenced")
    results: dict[int, tuple[int, str, str]] = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(p.epoch, p.finish())) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(results) == list(range(1, 13))
    tree = stores.tree(server, root)
    winner = checkpoint.name_of(12, 1, "j.1.0.12.0")
    assert results[12] == (0, f"{root}/{winner}\n", "")
    assert tree["LATEST"] == f"{winner}\n".encode()
    for e, (code, out, err) in results.items():
        name = checkpoint.name_of(e, 1, f"j.1.0.{e}.0")
        if code == 0:  # published, maybe overtaken since: whole under its name
            assert err == "" and whole(tree, name, f"e{e}"), (e, err)
        else:  # refused: one line naming a higher epoch, and what it uploaded removed
            m = re.fullmatch(r"python -m dispatch_fence publish: epoch (\d+) is lower than epoch (\d+) \(\S+\) in \S+: "
                             r"a superseded execution's save, refused; nothing published\n", err)
            assert code == 1 and m and int(m.group(1)) == e and int(m.group(2)) > e, (e, code, err)
            assert not [k for k in tree if k.startswith(name + "/")], (e, "left objects behind")
    assert stores.latest(server, root).epoch == 12


@pytest.mark.parametrize("step", objectstore.STEPS)
def test_a_publisher_killed_at_any_step_leaves_the_old_or_the_new_latest(
        server: objectstores.Server, tmp_path: pathlib.Path, step: str) -> None:
    root = server.root()
    for token in ("old1", "old2"):
        assert publish(server, kit.staging(tmp_path, token), root, 3, "j.1.0.1.0")[0] == 0
    old = checkpoint.name_of(3, 2, "j.1.0.1.0")
    new = checkpoint.name_of(4, 3, "j.1.0.2.0")
    p = stores.Publisher(kit.staging(tmp_path, "new"), root, epoch=4, attempt="j.1.0.2.0", env=server.env, keep=1)
    p.run_to(step)
    p.kill()
    committed = objectstore.STEPS.index(step) >= objectstore.STEPS.index("replaced")
    tree = stores.tree(server, root)
    found = stores.latest(server, root)
    assert found.name == (new if committed else old)
    assert whole(tree, found.name, "new" if committed else "old2")
    # What the killed publish uploaded fences: an older execution's save is refused once its first object is there.
    uploaded = objectstore.STEPS.index(step) >= objectstore.STEPS.index("uploading")
    code, _, err = publish(server, kit.staging(tmp_path, "late"), root, 3, "j.1.0.1.0")
    assert code == (1 if uploaded else 0), err
    # And the next save of the new execution publishes and is read back whole.
    code, out, err = publish(server, kit.staging(tmp_path, "next"), root, 4, "j.1.0.2.0")
    assert code == 0, err
    found = stores.latest(server, root)
    assert out == f"{found.path}\n" and whole(stores.tree(server, root), found.name, "next")


def test_retention_never_removes_what_latest_names(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    assert publish(server, kit.staging(tmp_path, "first"), root, 9, "j.1.0.1.0")[0] == 0
    # A uploads (serial 2) and stops before its commit; B of the same execution publishes serial 3.
    a = stores.Publisher(kit.staging(tmp_path, "a"), root, epoch=9, attempt="j.1.0.1.0", env=server.env, keep=1)
    a.run_to("uploaded")
    assert publish(server, kit.staging(tmp_path, "b"), root, 9, "j.1.0.1.0")[0] == 0
    # A commits after it (an equal epoch advances), so LATEST names serial 2, not the newest; keep=1 keeps it.
    assert a.finish()[0] == 0
    found = stores.latest(server, root)
    assert found.serial == 2 and whole(stores.tree(server, root), found.name, "a")
    assert [c.serial for c in checkpoint.checkpoints(root)] == [2, 3]


def test_retention_leaves_a_checkpoint_about_to_be_named(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    assert publish(server, kit.staging(tmp_path, "first"), root, 9, "j.1.0.1.0")[0] == 0
    # A commits (serial 2) and stops before it prunes; B uploads serial 3 and stops before its commit.
    a = stores.Publisher(kit.staging(tmp_path, "a"), root, epoch=9, attempt="j.1.0.1.0", env=server.env, keep=1)
    a.run_to("replaced")
    b = stores.Publisher(kit.staging(tmp_path, "b"), root, epoch=9, attempt="j.1.0.1.0", env=server.env)
    b.run_to("uploaded")
    assert a.finish()[0] == 0  # prunes serial 1 only: serial 3 is above what LATEST names
    assert b.finish()[0] == 0
    found = stores.latest(server, root)
    assert found.serial == 3 and whole(stores.tree(server, root), found.name, "b")
    assert [c.serial for c in checkpoint.checkpoints(root)] == [2, 3]


def test_a_store_without_conditional_writes_is_refused(server_without_conditional_writes: objectstores.Server,
                                                       tmp_path: pathlib.Path) -> None:
    server = server_without_conditional_writes
    root = server.root()
    staging = kit.staging(tmp_path, "a")
    code, out, err = publish(server, staging, root, 5, "j.1.0.1.0")
    assert (code, out) == (2, "")
    assert err == (f"python -m dispatch_fence publish: {root} does not honour conditional writes: a create-only "
                   "write over an existing object succeeded; the fence cannot be kept there; refused, nothing "
                   "published (docs/checkpoint.md, Object stores)\n")
    assert stores.tree(server, root) == {}  # the probe's object is gone, nothing else was written


@pytest.mark.parametrize(("root", "words"), [
    ("s3://", "root s3:// names no bucket"),
    ("ftp://bucket/x", "root ftp://bucket/x: the scheme 'ftp' is not one of s3://, gs://"),
    ("gs://bucket/a/../b", "root gs://bucket/a/../b: the prefix 'a/../b' has an empty, '.' or '..' segment"),
])
def test_a_root_that_is_not_a_store_location_exits_2(tmp_path: pathlib.Path, root: str, words: str) -> None:
    code, out, err = run("publish", str(kit.staging(tmp_path, "a")), root, "--epoch", "5", "--attempt", "j.1.0.1.0",
                         env={})
    assert (code, out, err) == (2, "", f"python -m dispatch_fence publish: {words}\n")


def test_an_incomplete_staging_directory_is_refused_before_any_request(tmp_path: pathlib.Path) -> None:
    staging = kit.staging(tmp_path, "a", complete=False)
    code, out, err = run("publish", str(staging), "s3://bucket/x", "--epoch", "5", "--attempt", "j.1.0.1.0", env={})
    assert (code, out) == (2, "")
    assert err == (f"python -m dispatch_fence publish: staging {staging} is not complete: the marker COMPLETE "
                   "(written last) is missing; nothing published\n")


def test_toolkit_checkpoint_takes_a_store_root_too(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    toolkit = str(kit.REPO / ".venv" / "bin" / "toolkit")
    full = {**objectstores.clean_env(), **server.env}
    new = subprocess.run([toolkit, "checkpoint", "publish", str(kit.staging(tmp_path, "new")), root, "--epoch", "8",
                          "--attempt", "j.1.0.2.0"], env=full, capture_output=True, text=True, timeout=120, check=False)
    assert (new.returncode, new.stderr) == (0, "") and new.stdout == f"{root}/{checkpoint.name_of(8, 1, 'j.1.0.2.0')}\n"
    old = subprocess.run([toolkit, "checkpoint", "publish", str(kit.staging(tmp_path, "old")), root, "--epoch", "7",
                          "--attempt", "j.1.0.1.0"], env=full, capture_output=True, text=True, timeout=120, check=False)
    assert (old.returncode, old.stdout) == (1, "")
    assert old.stderr.startswith("toolkit checkpoint publish: epoch 7 is lower than epoch 8 ") and old.stderr.count("\n") == 1
    latest = subprocess.run([toolkit, "checkpoint", "latest", root], env=full, capture_output=True, text=True,
                            timeout=120, check=False)
    assert (latest.returncode, latest.stdout, latest.stderr) == (0, new.stdout, "")


def test_a_checkpoint_of_the_marker_alone_publishes(server: objectstores.Server, tmp_path: pathlib.Path) -> None:
    root = server.root()
    staging = tmp_path / "empty"
    staging.mkdir()
    (staging / checkpoint.MARKER).write_text("")
    name = checkpoint.name_of(5, 1, "j.1.0.1.0")
    assert publish(server, staging, root, 5, "j.1.0.1.0") == (0, f"{root}/{name}\n", "")
    assert stores.tree(server, root) == {"LATEST": f"{name}\n".encode(), f"{name}/COMPLETE": b""}
