"""Every refusal of `publish`: a one-line error naming the field, nothing
published, nothing lost (the staging directory whole where it was, the root
byte for byte as it was).

The unwritable roots really refuse root (the tests run as root, to whom mode
bits mean nothing): a path under a regular file (ENOTDIR), and a read-only
bind mount in a private mount namespace (EROFS), where a probe write must
fail first.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from dispatch_fence import checkpoint, posix
from tests.checkpoint import kit

A1 = "job.1.0.1.0"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("DISPATCH_EPOCH", "5")
    monkeypatch.setenv("DISPATCH_ATTEMPT", A1)
    return monkeypatch


@pytest.fixture
def populated(tmp_path: pathlib.Path) -> pathlib.Path:
    """A root holding epochs 5 and 7 (LATEST names 7)."""
    root = tmp_path / "root"
    checkpoint.publish(kit.staging(tmp_path, "a5"), root, epoch=5, attempt="a5")
    checkpoint.publish(kit.staging(tmp_path, "a7"), root, epoch=7, attempt="a7")
    return root


def refused(exc_type: type[Exception], staging: pathlib.Path, root: pathlib.Path, **kwargs: object) -> str:
    """Publish and expect EXC_TYPE; the staging dir and the root unchanged. Returns the message."""
    staging_before, root_before = kit.tree(staging), kit.tree(root)
    with pytest.raises(exc_type) as caught:
        checkpoint.publish(staging, root, **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message and message
    assert kit.tree(staging) == staging_before and kit.tree(root) == root_before
    return message


# -- the epoch ------------------------------------------------------------


def test_a_missing_dispatch_epoch(tmp_path: pathlib.Path, env: pytest.MonkeyPatch, populated: pathlib.Path) -> None:
    env.delenv("DISPATCH_EPOCH")
    message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated)
    assert message == "DISPATCH_EPOCH is not set: run under the dispatch prologue, or pass epoch="


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "is not a canonical decimal"),
        ("0", "is not a canonical decimal"),
        ("010", "is not a canonical decimal"),
        ("-1", "is not a canonical decimal"),
        ("+1", "is not a canonical decimal"),
        (" 1", "is not a canonical decimal"),
        ("1\n", "is not a canonical decimal"),
        ("1_000", "is not a canonical decimal"),
        ("0x10", "is not a canonical decimal"),
        ("1e3", "is not a canonical decimal"),
        ("\u0661", "is not a canonical decimal"),  # ARABIC-INDIC DIGIT ONE: int() would take it
        ("9223372036854775808", "does not fit a signed 64-bit integer"),
        ("99999999999999999999999", "does not fit a signed 64-bit integer"),
    ],
)
def test_a_malformed_dispatch_epoch(tmp_path: pathlib.Path, env: pytest.MonkeyPatch, populated: pathlib.Path,
                                    value: str, words: str) -> None:
    env.setenv("DISPATCH_EPOCH", value)
    message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated)
    assert message.startswith("DISPATCH_EPOCH = ") and words in message


@pytest.mark.parametrize(("value", "words"), [(0, "below 1"), (-3, "below 1"), (2**63, "signed 64-bit"),
                                              (True, "decimal string or an int"), (7.0, "decimal string or an int")])
def test_a_bad_epoch_argument_names_the_argument(tmp_path: pathlib.Path, populated: pathlib.Path, value: object,
                                                 words: str) -> None:
    message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated, epoch=value, attempt=A1)
    assert message.startswith("epoch ") and words in message


def test_the_largest_epoch_is_taken() -> None:
    assert checkpoint.parse_epoch("9223372036854775807") == checkpoint.MAX_EPOCH == 2**63 - 1
    assert checkpoint.parse_epoch(1) == 1


# -- the attempt ----------------------------------------------------------


def test_a_missing_dispatch_attempt(tmp_path: pathlib.Path, env: pytest.MonkeyPatch, populated: pathlib.Path) -> None:
    env.delenv("DISPATCH_ATTEMPT")
    message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated, epoch=9)
    assert message == "DISPATCH_ATTEMPT is not set: run under the dispatch prologue, or pass attempt="


@pytest.mark.parametrize(
    ("value", "words"),
    [("", "is empty"), ("a/b", "holds '/'"), ("a\0b", "holds '\\x00'"), ("a b", "holds ' '"),
     ("a\nb", "holds '\\n'"), ("caf\u00e9", "holds '\u00e9'"), ("x" * 201, "above the bound 200")],
)
def test_a_malformed_dispatch_attempt(tmp_path: pathlib.Path, env: pytest.MonkeyPatch, populated: pathlib.Path,
                                      value: str, words: str) -> None:
    if "\0" in value:
        # The environment cannot carry a NUL: the argument can.
        message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated, epoch=9, attempt=value)
        assert message.startswith("attempt = ")
    else:
        env.setenv("DISPATCH_ATTEMPT", value)
        message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated, epoch=9)
        assert message.startswith("DISPATCH_ATTEMPT ")
    assert words in message


def test_the_longest_attempt_makes_a_valid_file_name(tmp_path: pathlib.Path) -> None:
    longest = "j" * checkpoint.MAX_ATTEMPT_LEN
    found = checkpoint.publish(kit.staging(tmp_path, "x"), tmp_path / "root", epoch=checkpoint.MAX_EPOCH,
                               attempt=longest)
    assert len(found.name) <= 255 and found.attempt == longest
    assert checkpoint.latest(tmp_path / "root") == found


@pytest.mark.parametrize("value", [0, -1, True, "3", 1.5])
def test_a_bad_keep(tmp_path: pathlib.Path, env: pytest.MonkeyPatch, populated: pathlib.Path, value: object) -> None:
    message = refused(checkpoint.BadInput, kit.staging(tmp_path, "x"), populated, keep=value)
    assert message.startswith("keep = ")


# -- the staging directory ------------------------------------------------


def test_an_incomplete_staging_dir_is_not_published(tmp_path: pathlib.Path, env: pytest.MonkeyPatch,
                                                     populated: pathlib.Path) -> None:
    staging = kit.staging(tmp_path, "x", complete=False)
    message = refused(checkpoint.BadInput, staging, populated, epoch=9)
    assert message == (f"staging {staging} is not complete: the marker COMPLETE (written last) is missing; "
                       "nothing published")


def test_a_marker_that_is_not_a_file(tmp_path: pathlib.Path, env: pytest.MonkeyPatch, populated: pathlib.Path) -> None:
    staging = kit.staging(tmp_path, "x", complete=False)
    (staging / checkpoint.MARKER).mkdir()
    assert "is not complete" in refused(checkpoint.BadInput, staging, populated, epoch=9)
    (staging / checkpoint.MARKER).rmdir()
    (staging / checkpoint.MARKER).symlink_to(staging / "model.bin")
    assert "is not complete" in refused(checkpoint.BadInput, staging, populated, epoch=9)


def test_a_staging_dir_that_is_missing_a_file_or_a_symlink(tmp_path: pathlib.Path, env: pytest.MonkeyPatch,
                                                           populated: pathlib.Path) -> None:
    assert refused(checkpoint.BadInput, tmp_path / "nope", populated) == (
        f"staging {tmp_path / 'nope'}: No such file or directory")
    (tmp_path / "file").write_text("")
    assert refused(checkpoint.BadInput, tmp_path / "file", populated).endswith("is not a directory")
    real = kit.staging(tmp_path, "real")
    (tmp_path / "link").symlink_to(real)
    assert refused(checkpoint.BadInput, tmp_path / "link", populated).endswith("is not a directory")


def test_a_staging_dir_that_is_the_root_or_holds_it_or_is_published(tmp_path: pathlib.Path, env: pytest.MonkeyPatch,
                                                                    populated: pathlib.Path) -> None:
    outer = kit.staging(tmp_path, "outer")
    assert "is inside staging" in refused(checkpoint.BadInput, outer, outer / "root")
    latest = checkpoint.latest(populated)
    assert latest is not None
    assert "is already a checkpoint of" in refused(checkpoint.BadInput, pathlib.Path(latest.path), populated, epoch=9)


# -- the root ---------------------------------------------------------------


def test_a_root_under_a_regular_file(tmp_path: pathlib.Path, env: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    staging = kit.staging(tmp_path, "x")
    message = refused(checkpoint.UnwritableRoot, staging, tmp_path / "file" / "ckpt")
    assert message == f"root {tmp_path / 'file' / 'ckpt'} cannot be created: Not a directory; nothing published"
    assert "cannot be created: File exists" in refused(checkpoint.UnwritableRoot, staging, tmp_path / "file")


def namespace(script: str, **paths: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """SCRIPT (sh) in a private mount namespace, with the paths as shell variables."""
    for tool in ("unshare", "mount"):
        assert shutil.which(tool), f"{tool} is missing (util-linux; make deps)"
    assigns = "".join(f"{k}='{v}'; " for k, v in paths.items())
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-euc", assigns + script],
                          capture_output=True, text=True, timeout=60, cwd=kit.REPO,
                          env={"PATH": "/usr/bin:/bin", "PY": sys.executable, **kit.env(9, A1)})


def test_a_read_only_root_refuses_even_root(tmp_path: pathlib.Path, populated: pathlib.Path) -> None:
    staging = kit.staging(tmp_path, "x")
    before, staging_before = kit.tree(populated), kit.tree(staging)
    out = namespace(
        'mount --bind "$R" "$R"; mount -o remount,bind,ro "$R"\n'
        'if touch "$R/probe" 2>/dev/null; then echo "root could write to $R" >&2; exit 99; fi\n'
        'exec "$PY" -m dispatch_fence publish "$S" "$R"\n',
        R=populated, S=staging)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (f"python -m dispatch_fence publish: root {populated} is not writable: .lock: "
                          "Read-only file system; nothing published\n")
    assert kit.tree(populated) == before and kit.tree(staging) == staging_before


def test_a_staging_dir_on_another_filesystem_is_not_copied(tmp_path: pathlib.Path, populated: pathlib.Path) -> None:
    before = kit.tree(populated)
    other = tmp_path / "other"
    other.mkdir()
    out = namespace(
        'mount -t tmpfs tmpfs "$O"; mkdir "$O/s"; echo x >"$O/s/model.bin"; : >"$O/s/COMPLETE"\n'
        'rc=0; "$PY" -m dispatch_fence publish "$O/s" "$R" || rc=$?\n'
        'test -f "$O/s/COMPLETE" && test "$(cat "$O/s/model.bin")" = x && echo "staging intact"; exit $rc\n',
        R=populated, O=other)
    assert out.returncode == 2 and out.stdout == "staging intact\n", out.stderr
    assert out.stderr == (f"python -m dispatch_fence publish: staging {other}/s is on another filesystem "
                          f"(or mount) than root {populated}: it must be renamed, not copied; nothing published\n")
    assert kit.tree(populated) == before


def test_a_latest_not_written_by_the_fence(tmp_path: pathlib.Path, env: pytest.MonkeyPatch,
                                           populated: pathlib.Path) -> None:
    (populated / "LATEST").write_text("../../etc\n")
    message = refused(checkpoint.CorruptRoot, kit.staging(tmp_path, "x"), populated, epoch=9)
    assert message == f"{populated / 'LATEST'} holds '../../etc\\n', not one checkpoint name on one line: not written by this fence"
    with pytest.raises(checkpoint.CorruptRoot):
        checkpoint.latest(populated)


# -- a lower epoch ----------------------------------------------------------


def test_a_lower_epoch_leaves_latest_and_every_newer_checkpoint_untouched(tmp_path: pathlib.Path,
                                                                          populated: pathlib.Path) -> None:
    staging = kit.staging(tmp_path, "late")
    latest = checkpoint.latest(populated)
    for epoch, keep in ((6, None), (1, 1), (4, 1)):
        message = refused(checkpoint.StaleEpoch, staging, populated, epoch=epoch, attempt="late", keep=keep)
    with pytest.raises(checkpoint.StaleEpoch) as caught:
        checkpoint.publish(staging, populated, epoch=4, attempt="late")
    assert (caught.value.epoch, caught.value.fence) == (4, 7) and caught.value.exit_code == 1
    assert message == (f"epoch 4 is lower than epoch 7 (ckpt-0000000000000000007-000002-a7) in {populated}: "
                        "a superseded execution's save, refused; nothing published")
    assert checkpoint.latest(populated) == latest
    assert [c.epoch for c in checkpoint.checkpoints(populated)] == [5, 7]


def test_a_refusal_leaves_even_a_crashed_publish_s_leftovers(tmp_path: pathlib.Path, populated: pathlib.Path) -> None:
    (populated / ".LATEST.99999.tmp").write_text("ckpt-half")
    (populated / ".trash-ckpt-0000000000000000001-000001-x").mkdir()
    refused(checkpoint.StaleEpoch, kit.staging(tmp_path, "late"), populated, epoch=6, attempt="late")


def test_a_checkpoint_of_a_higher_epoch_fences_even_when_latest_does_not_name_it(tmp_path: pathlib.Path,
                                                                                 populated: pathlib.Path) -> None:
    # A publish of epoch 9 that crashed after its rename, before LATEST: its
    # checkpoint is whole, and a newer execution wrote it. A late save of 8 is refused.
    orphan = populated / checkpoint.name_of(9, 3, "a9")
    shutil.copytree(kit.staging(tmp_path, "a9"), orphan)
    message = refused(checkpoint.StaleEpoch, kit.staging(tmp_path, "late"), populated, epoch=8, attempt="late")
    assert message.startswith(f"epoch 8 is lower than epoch 9 ({orphan.name}) in ")
    assert checkpoint.latest(populated).epoch == 7  # type: ignore[union-attr]
    assert checkpoint.publish(kit.staging(tmp_path, "a10"), populated, epoch=10, attempt="a10").serial == 4


def test_a_filesystem_without_flock_is_refused(tmp_path: pathlib.Path, populated: pathlib.Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    message = refused(checkpoint.UnwritableRoot, kit.staging(tmp_path, "x"), populated, epoch=9, attempt=A1)
    assert message == (f"root {populated} cannot be locked (flock: No locks available): the fence needs a "
                       "filesystem with working locks (docs/checkpoint.md); nothing published")


def test_a_failure_after_the_rename_says_where_the_checkpoint_is(tmp_path: pathlib.Path, populated: pathlib.Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(root: str, name: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(root, ".LATEST.1.tmp"))

    monkeypatch.setattr(posix, "_write_latest", full)
    latest = checkpoint.latest(populated)
    with pytest.raises(checkpoint.UnwritableRoot) as caught:
        checkpoint.publish(kit.staging(tmp_path, "x"), populated, epoch=9, attempt=A1)
    moved = populated / checkpoint.name_of(9, 3, A1)
    assert str(caught.value) == (f"root {populated}: No space left on device ({populated}/.LATEST.1.tmp); "
                                 f"the checkpoint is in {moved}, LATEST not advanced")
    assert checkpoint.latest(populated) == latest and (moved / "model.bin").read_text() == "x"  # nothing lost
