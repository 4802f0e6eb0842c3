"""What a publish does when it is accepted: the name, LATEST, equal and
higher epochs, retention, a crashed publish's leftovers, the order of the
fsyncs and renames that the crash-safety argument (docs/checkpoint.md) rests
on, and the lock."""

from __future__ import annotations

import fcntl
import os
import pathlib
import subprocess
import sys
import time

import pytest

from dispatch_fence import checkpoint
from tests.checkpoint import kit


def test_a_first_publish_moves_the_staging_dir_in_and_latest_names_it(tmp_path: pathlib.Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_EPOCH", "2000007000001")
    monkeypatch.setenv("DISPATCH_ATTEMPT", "llama-ft.7.0.1.0")
    staging = kit.staging(tmp_path, "first")
    content = kit.tree(staging)
    root = tmp_path / "deep" / "root"
    assert checkpoint.latest(root) is None  # no root yet
    found = checkpoint.publish(staging, root)
    assert found == checkpoint.Checkpoint(
        path=str(root / "ckpt-0000002000007000001-000001-llama-ft.7.0.1.0"),
        name="ckpt-0000002000007000001-000001-llama-ft.7.0.1.0",
        epoch=2000007000001, serial=1, attempt="llama-ft.7.0.1.0")
    assert not staging.exists() and kit.tree(pathlib.Path(found.path)) == content  # the marker stays
    assert (root / "LATEST").read_text() == found.name + "\n"
    assert checkpoint.latest(root) == found
    assert sorted(os.listdir(root)) == [".lock", "LATEST", found.name]


def test_an_empty_root_has_no_latest(tmp_path: pathlib.Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.checkpoints(tmp_path) == []


def test_an_equal_epoch_advances_and_a_higher_one_too(tmp_path: pathlib.Path) -> None:
    # One execution saving again (or another rank of it): the later save is the newer one.
    root = tmp_path / "root"
    a = checkpoint.publish(kit.staging(tmp_path, "s1"), root, epoch=3, attempt="j.1.0.1.2")
    b = checkpoint.publish(kit.staging(tmp_path, "s2"), root, epoch=3, attempt="j.1.0.1.2")
    assert (a.serial, b.serial) == (1, 2) and a.name != b.name
    assert checkpoint.latest(root) == b
    c = checkpoint.publish(kit.staging(tmp_path, "s3"), root, epoch=4, attempt="j.1.0.2.2")
    assert checkpoint.latest(root) == c
    assert checkpoint.checkpoints(root) == [a, b, c]  # every one kept without --keep


def test_names_sort_as_the_fence_orders_them(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    for i, epoch in enumerate((9, 10, 10, 1000000000000)):
        checkpoint.publish(kit.staging(tmp_path, f"s{i}"), root, epoch=epoch, attempt="a")
    names = [c.name for c in checkpoint.checkpoints(root)]
    assert names == sorted(n for n in os.listdir(root) if n.startswith("ckpt-"))  # ls order is epoch order


def test_keep_k_keeps_the_newest_k(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    published = [checkpoint.publish(kit.staging(tmp_path, f"s{i}"), root, epoch=e, attempt=f"a{i}", keep=2)
                 for i, e in enumerate((1, 2, 2, 5))]
    assert checkpoint.checkpoints(root) == published[-2:]
    assert checkpoint.latest(root) == published[-1]
    checkpoint.publish(kit.staging(tmp_path, "last"), root, epoch=5, attempt="last", keep=1)
    assert [c.attempt for c in checkpoint.checkpoints(root)] == ["last"]
    assert sorted(os.listdir(root)) == [".lock", "LATEST", checkpoint.latest(root).name]  # type: ignore[union-attr]


def test_without_keep_nothing_is_removed_and_other_files_are_left_alone(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    (root / "ckpt-not-ours").mkdir()
    for i in range(3):
        checkpoint.publish(kit.staging(tmp_path, f"s{i}"), root, epoch=1, attempt="a", keep=1 if i == 2 else None)
    assert (root / "notes.txt").read_text() == "mine" and (root / "ckpt-not-ours").is_dir()


def test_a_crashed_publish_s_leftovers_go_with_the_next_publish(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    checkpoint.publish(kit.staging(tmp_path, "s0"), root, epoch=1, attempt="a")
    (root / ".LATEST.4242.tmp").write_text("ckpt-0000000000000000009-000009-x")  # no newline: half written
    (root / ".trash-ckpt-0000000000000000001-000000-old").mkdir()
    assert checkpoint.latest(root).serial == 1  # type: ignore[union-attr]  # readers never look at them
    checkpoint.publish(kit.staging(tmp_path, "s1"), root, epoch=1, attempt="a")
    assert sorted(n for n in os.listdir(root) if n.startswith(".")) == [".lock"]


def test_latest_names_a_checkpoint_that_is_gone(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    found = checkpoint.publish(kit.staging(tmp_path, "s0"), root, epoch=5, attempt="a")
    os.rename(found.path, tmp_path / "away")  # by hand
    with pytest.raises(checkpoint.CorruptRoot, match=f"^{root / 'LATEST'} names {found.name}, which is not a directory"):
        checkpoint.latest(root)
    # LATEST's name still carries its epoch, which still fences; a publish not lower repairs it.
    with pytest.raises(checkpoint.StaleEpoch, match="^epoch 4 is lower than epoch 5 "):
        checkpoint.publish(kit.staging(tmp_path, "s1"), root, epoch=4, attempt="b")
    again = checkpoint.publish(kit.staging(tmp_path, "s2"), root, epoch=5, attempt="b")
    assert checkpoint.latest(root) == again and again.serial == 2


def test_the_steps_happen_in_the_order_the_crash_argument_needs(tmp_path: pathlib.Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every staged file and directory is fsynced before the rename; the root after it and
    before LATEST; the new LATEST before it replaces the old; the root again after."""
    root = tmp_path / "root"
    checkpoint.publish(kit.staging(tmp_path, "s0"), root, epoch=1, attempt="a")
    staging = kit.staging(tmp_path, "s1")
    log: list[tuple[str, str]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(fd: int) -> None:
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str, dst: str) -> None:
        log.append(("rename", f"{src} -> {dst}"))
        real_rename(src, dst)

    def replace(src: str, dst: str) -> None:
        log.append(("replace", f"{os.path.basename(src)} -> {os.path.basename(dst)}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    new = checkpoint.publish(staging, root, epoch=2, attempt="b", keep=1)
    s, r = str(staging), str(root)
    staged = {("fsync", p) for p in (s, f"{s}/shards", f"{s}/model.bin", f"{s}/COMPLETE", f"{s}/shards/0.bin")}
    assert set(log[:5]) == staged
    tmp = f"{r}/.LATEST.{os.getpid()}.tmp"
    assert log[5:] == [
        ("rename", f"{s} -> {new.path}"),
        ("fsync", r),
        ("fsync", str(tmp_path)),  # the staging dir's old parent: its entry is gone for good
        ("fsync", tmp),
        ("replace", f".LATEST.{os.getpid()}.tmp -> LATEST"),
        ("fsync", r),
        ("rename", f"{r}/ckpt-0000000000000000001-000001-a -> {r}/.trash-ckpt-0000000000000000001-000001-a"),
        ("fsync", r),
    ]


def test_a_second_publisher_waits_for_the_lock(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    checkpoint.publish(kit.staging(tmp_path, "s0"), root, epoch=1, attempt="a")
    staging = kit.staging(tmp_path, "s1")
    fd = os.open(root / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another execution is publishing
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dispatch_fence", "publish", str(staging), str(root)],
                                cwd=kit.REPO, env={**os.environ, **kit.env(2, "b")},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        assert proc.poll() is None and staging.exists()  # waiting, nothing moved
        assert checkpoint.latest(root).epoch == 1  # type: ignore[union-attr]
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and err == "" and out.startswith(str(root / "ckpt-0000000000000000002-"))
