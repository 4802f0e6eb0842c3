"""`toolkit checkpoint publish|latest` (CliRunner: exit code, stdout and
stderr apart) and its standard-library twin `python -m dispatch_fence`
(a real process): 0 published, 1 refused, 2 bad input; one line on stderr,
never a traceback."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner, Result

from dispatch_fence import checkpoint
from tests.checkpoint import kit
from toolkit import cli

TOOLKIT = str(kit.REPO / ".venv" / "bin" / "toolkit")
NO_ENV = {"DISPATCH_EPOCH": None, "DISPATCH_ATTEMPT": None}


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli.root, ["checkpoint", *args], prog_name="toolkit", env={**NO_ENV, **(env or {})})


def one_line(text: str, prefix: str) -> str:
    assert text.count("\n") == 1 and text.endswith("\n") and "Traceback" not in text, text
    assert text.startswith(prefix), text
    return text[len(prefix):-1]


def test_publish_prints_the_path_and_latest_reads_it(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    r = run("publish", str(kit.staging(tmp_path, "a")), str(root), env=kit.env(5, "job.1.0.1.0"))
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout == f"{root}/ckpt-0000000000000000005-000001-job.1.0.1.0\n"
    latest = run("latest", str(root))
    assert latest.exit_code == 0 and latest.stdout == r.stdout and latest.stderr == ""


def test_latest_before_the_first_publish_prints_nothing(tmp_path: pathlib.Path) -> None:
    r = run("latest", str(tmp_path / "none-yet"))
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")


def test_a_lower_epoch_exits_1_with_one_line_naming_both_epochs(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    assert run("publish", str(kit.staging(tmp_path, "new")), str(root), env=kit.env(7, "j.1.0.2.0")).exit_code == 0
    before = kit.tree(root)
    staging = kit.staging(tmp_path, "old")
    r = run("publish", str(staging), str(root), env=kit.env(6, "j.1.0.1.0"))
    assert r.exit_code == 1 and r.stdout == ""
    assert one_line(r.stderr, "toolkit checkpoint publish: ") == (
        f"epoch 6 is lower than epoch 7 (ckpt-0000000000000000007-000001-j.1.0.2.0) in {root}: "
        "a superseded execution's save, refused; nothing published")
    assert kit.tree(root) == before and (staging / checkpoint.MARKER).exists()


def test_the_options_override_the_environment(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    r = run("publish", str(kit.staging(tmp_path, "a")), str(root), "--epoch", "9", "--attempt", "mine",
            env=kit.env(1, "theirs"))
    assert r.exit_code == 0 and r.stdout.endswith("/ckpt-0000000000000000009-000001-mine\n")


def test_keep(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    for i in range(3):
        assert run("publish", str(kit.staging(tmp_path, f"s{i}")), str(root), "--keep", "2",
                   env=kit.env(i + 1, f"a{i}")).exit_code == 0
    assert [c.attempt for c in checkpoint.checkpoints(root)] == ["a1", "a2"]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "DISPATCH_EPOCH is not set: run under the dispatch prologue, or give --epoch"),
        ([], {"DISPATCH_EPOCH": "3"}, "DISPATCH_ATTEMPT is not set: run under the dispatch prologue, or give --attempt"),
        ([], kit.env("07", "a"), "DISPATCH_EPOCH = '07' is not a canonical decimal (digits, no sign, no leading zero)"),
        (["--epoch", "0"], kit.env(3, "a"), "--epoch = '0' is not a canonical decimal (digits, no sign, no leading zero)"),
        (["--epoch", "9223372036854775808"], {"DISPATCH_ATTEMPT": "a"},
         "--epoch = 9223372036854775808 does not fit a signed 64-bit integer (max 9223372036854775807)"),
        (["--attempt", "a/b"], kit.env(3, "a"),
         "--attempt = 'a/b' holds '/': only visible ASCII without '/' (no space, NUL or control character)"),
        ([], kit.env(3, "x" * 201), "DISPATCH_ATTEMPT is 201 characters long, above the bound 200 (it names a directory)"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: pathlib.Path, args: list[str], env: dict[str, str],
                                         message: str) -> None:
    staging = kit.staging(tmp_path, "s")
    r = run("publish", str(staging), str(tmp_path / "root"), *args, env=env)
    assert r.exit_code == 2 and r.stdout == ""
    assert one_line(r.stderr, "toolkit checkpoint publish: ") == message
    assert not (tmp_path / "root").exists() and (staging / checkpoint.MARKER).exists()


def test_bad_input_of_every_other_kind_exits_2(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("")
    incomplete = kit.staging(tmp_path, "i", complete=False)
    good = kit.staging(tmp_path, "g")
    e = kit.env(3, "a")
    cases = [
        (["publish", str(incomplete), str(tmp_path / "root")], "is not complete: the marker COMPLETE"),
        (["publish", str(good), str(tmp_path / "file" / "root")], "cannot be created: Not a directory"),
        (["publish", str(good), str(tmp_path / "root"), "--keep", "0"], "Invalid value for '--keep'"),
        (["publish", str(good)], "Missing argument 'ROOT'"),
        (["latest", str(tmp_path / "file")], "is not a directory"),
    ]
    for args, words in cases:
        r = run(*args, env=e)
        assert r.exit_code == 2 and r.stdout == "", (args, r.output)
        assert words in one_line(r.stderr, f"toolkit checkpoint {args[0]}: "), r.stderr
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "LATEST").write_text("garbage")
    r = run("latest", str(tmp_path / "root"))
    assert r.exit_code == 2 and "not one checkpoint name on one line" in one_line(r.stderr, "toolkit checkpoint latest: ")


def test_the_help_names_both_commands() -> None:
    r = run("--help")
    assert r.exit_code == 0 and "publish" in r.stdout and "latest" in r.stdout
    assert "toolkit checkpoint publish /ckpt/.staging-$DISPATCH_ATTEMPT /ckpt --keep 3" in run("publish", "--help").stdout


# -- the real processes -----------------------------------------------------


def proc(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=kit.REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env})


@pytest.mark.parametrize("argv0", [[TOOLKIT, "checkpoint"], [sys.executable, "-m", "dispatch_fence"]],
                         ids=["toolkit", "python-m"])
def test_both_commands_as_processes_agree(tmp_path: pathlib.Path, argv0: list[str]) -> None:
    prog = "toolkit checkpoint" if argv0[0] == TOOLKIT else "python -m dispatch_fence"
    root = str(tmp_path / "root")
    ok = proc(*argv0, "publish", str(kit.staging(tmp_path, "new")), root, env=kit.env(7, "j.1.0.2.0"))
    assert (ok.returncode, ok.stderr) == (0, "") and ok.stdout == f"{root}/ckpt-0000000000000000007-000001-j.1.0.2.0\n"
    late = proc(*argv0, "publish", str(kit.staging(tmp_path, "old")), root, env=kit.env(6, "j.1.0.1.0"))
    assert late.returncode == 1 and late.stdout == ""
    assert one_line(late.stderr, f"{prog} publish: ").startswith("epoch 6 is lower than epoch 7 ")
    bad = proc(*argv0, "publish", str(kit.staging(tmp_path, "bad")), root, env=kit.env("x", "a"))
    assert bad.returncode == 2 and one_line(bad.stderr, f"{prog} publish: ").startswith("DISPATCH_EPOCH = 'x' ")
    usage = proc(*argv0, "publish", env={})
    assert usage.returncode == 2 and "Traceback" not in usage.stderr and usage.stderr.count("\n") == 1
    latest = proc(*argv0, "latest", root, env={})
    assert (latest.returncode, latest.stdout) == (0, ok.stdout)
