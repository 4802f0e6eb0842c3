"""What `toolkit` imports to start: `toolkit wrap` without click, the command
list without any command's module, and the fast path's answers the click
command's own (toolkit/cli.py's docstring)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from toolkit import cli, cli_root

HEAVY = ("click", "kubernetes", "docker", "yaml", "requests", "urllib3", "toolkit.kube", "toolkit.cli_root",
         "toolkit.cli_cluster", "toolkit.render", "toolkit.request")


def modules_after(code: str) -> list[str]:
    """The heavy modules loaded once `code` has run in a fresh interpreter."""
    probe = (
        "import sys\n"
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) +
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(sorted(m for m in sys.modules if m in {HEAVY!r} or m.split('.')[0] in {HEAVY!r}), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == 0, out.stderr
    loaded: list[str] = ast.literal_eval(out.stderr.strip().splitlines()[-1])
    return loaded


def test_wrap_runs_without_click() -> None:
    code = "from toolkit import cli\nsys.argv = ['toolkit', 'wrap', '--', 'true']\ncli.main()"
    assert modules_after(code) == []


def test_help_lists_the_commands_without_importing_them() -> None:
    code = "from toolkit import cli\nsys.argv = ['toolkit', '--help']\ncli.main()"
    loaded = modules_after(code)
    assert "toolkit.cli_root" in loaded
    assert [m for m in loaded if m.split(".")[0] != "click" and m != "toolkit.cli_root"] == []


def test_summaries_are_the_commands_own_first_sentences() -> None:
    assert set(cli.SUMMARIES) == set(cli.COMMANDS) | set(cli.CONTRIBUTED)
    for name in cli.SUMMARIES:
        real = cli_root.root.get_command(None, name)  # type: ignore[arg-type]
        listed = cli_root.root.listed(None, name)  # type: ignore[arg-type]
        assert real is not None and listed is not None and real.hidden == listed.hidden, name
        for limit in range(20, 200):
            assert listed.get_short_help_str(limit) == real.get_short_help_str(limit), (name, limit)


def test_help_lists_what_the_commands_themselves_would() -> None:
    eager = click.Group("toolkit", help=cli_root.root.help, params=cli_root.root.params,
                        context_settings=cli_root.root.context_settings,
                        commands={name: cli_root.root.get_command(None, name) for name in cli.SUMMARIES})  # type: ignore[arg-type, misc]
    lazy = CliRunner().invoke(cli_root.root, ["--help"], prog_name="toolkit")
    assert lazy.exit_code == 0
    assert lazy.stdout == CliRunner().invoke(eager, ["--help"], prog_name="toolkit").stdout


def test_completion_lists_the_commands_without_importing_them() -> None:
    code = (
        "import os\nos.environ.update(_TOOLKIT_COMPLETE='bash_complete', COMP_WORDS='toolkit ', COMP_CWORD='1')\n"
        "from toolkit import cli\nsys.argv = ['toolkit']\ncli.main()"
    )
    assert "toolkit.cli_cluster" not in modules_after(code)


# Argument lists the fast path answers, and ones it leaves to click.
ANSWERED = [
    ["wrap", "--", "true"],
    ["wrap", "true"],
    ["wrap", "--", "python", "-u", "train.py", "--epochs", "3"],
    ["wrap", "python", "train.py", "-o", "shell"],
    ["wrap", "-o", "shell", "--workdir", "/app", "--", "sh", "-c", "echo \"$DISPATCH_EPOCH\" 'it''s'"],
    ["wrap", "--output=shell", "--workdir=/app", "--", "./run.sh"],
    ["wrap", "-o", "yaml", "--workdir", "/app", "--", "python", "t.py"],
    ["wrap", "-o", "yaml", "-o", "json", "--", "true"],
    ["wrap", "--output", "json", "--", "x"],
    ["wrap", "-o", "yaml", "--", "-x"],
]
LEFT_TO_CLICK = [
    [],
    ["--help"],
    ["render", "trainjob", "x.yaml"],
    ["wrap"],
    ["wrap", "--"],
    ["wrap", "-h"],
    ["wrap", "--help", "--", "true"],
    ["wrap", "--", ""],
    ["wrap", "--", "-x"],
    ["wrap", "-x"],
    ["wrap", "-oshell", "--", "true"],
    ["wrap", "-o=shell", "--", "true"],
    ["wrap", "-o", "xml", "--", "true"],
    ["wrap", "-o"],
    ["wrap", "--format", "json", "--", "true"],
    ["wrap", "--workdir", "/x", "--", "true"],
    ["wrap", "-o", "shell", "--workdir", "", "--", "true"],
    ["wrap", "--workdir", "--", "-o", "shell", "true"],
    ["wrap", "-o", "shell", "--", "printf", "\x1b[31m"],
    ["wrap", "-o", "shell", "--", "echo", "h\u00e9"],
]


@pytest.mark.parametrize("args", ANSWERED, ids=lambda args: " ".join(args) or "(none)")
def test_fast_path_prints_what_the_click_command_prints(args: list[str]) -> None:
    text = cli.fast_wrap(args)
    r = CliRunner().invoke(cli_root.root, args, prog_name="toolkit")
    assert text is not None
    assert r.exit_code == 0 and r.stderr == "" and r.stdout == text


@pytest.mark.parametrize("args", LEFT_TO_CLICK, ids=lambda args: " ".join(args) or "(none)")
def test_anything_else_is_left_to_click(args: list[str]) -> None:
    assert cli.fast_wrap(args) is None


def test_console_script_answers_as_click_does() -> None:
    toolkit = os.path.join(os.path.dirname(sys.executable), "toolkit")
    for args in ANSWERED[:3]:
        out = subprocess.run([toolkit, *args], capture_output=True, text=True, check=True)
        assert out.stdout == CliRunner().invoke(cli_root.root, args, prog_name="toolkit").stdout
        assert out.stderr == ""
