"""The docs describe what is (/README.md and every page under docs/; CHANGELOG.md is exempt, it is
the history).

- The README is the page a newcomer reads first: at most 200 lines.
- No page tells how a figure or a design got where it is: none says "before this change", "earlier
  figures" or "used to " (git history and CHANGELOG.md say it).
- A run date (YYYY-MM-DD) stands only on a figure's own date line: a line that starts with
  "Measured" ("Measured with `bench/x` on the 2-core VM, 2026-12-06: ..."), one per table or figure.
  Text inside a fenced code block is quoted as a program printed or reads it (a transcript's
  timestamps, a policy's "Version") and is not checked.
- The README's parts table (the table in its "## The parts" section) has one row per top-level
  folder that git tracks, hidden ones excepted, each named in its first cell as `name/`, and names
  no folder that does not exist.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = ("before this change", "earlier figures", "used to ")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
DATE_LINE = "Measured"


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line outside a fenced code block."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def test_prose_lines_skip_fenced_blocks() -> None:
    assert prose_lines("a\n```\nb\n```\nc\n") == [(1, "a"), (5, "c")]


def test_the_readme_fits_in_200_lines() -> None:
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_tells_its_history(page: pathlib.Path) -> None:
    found = [f"{page.relative_to(ROOT)}:{number}: {phrase!r}"
             for number, line in enumerate(page.read_text().splitlines(), start=1)
             for phrase in HISTORY if phrase in line.lower()]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_run_date_stands_only_on_a_measured_line(page: pathlib.Path) -> None:
    found = [f"{page.relative_to(ROOT)}:{number}: {line.strip()[:80]}"
             for number, line in prose_lines(page.read_text())
             if DATE.search(line) and not line.lstrip().startswith(DATE_LINE)]
    assert found == []


def tracked_top_level_folders() -> set[str]:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    return {f.split("/", 1)[0] for f in files if "/" in f and not f.startswith(".")}


def parts_table() -> list[str]:
    """The folder each row of the README's parts table names in its first cell."""
    text = README.read_text()
    start = text.index("\n## The parts\n")
    end = text.find("\n## ", start + 1)
    rows = [line for line in text[start:end if end != -1 else None].splitlines() if line.startswith("| `")]
    names = [re.fullmatch(r"`([^`/]+)/`", row.split("|")[1].strip()) for row in rows]
    assert all(names), [row for row, name in zip(rows, names) if not name]
    return [name.group(1) for name in names if name]


def test_the_parts_table_names_every_tracked_folder_once() -> None:
    named = parts_table()
    assert len(named) == len(set(named)), named
    assert sorted(set(named) - tracked_top_level_folders()) == [], "rows for folders git does not track"
    assert sorted(tracked_top_level_folders() - set(named)) == [], "folders without a row"
    assert [n for n in named if not (ROOT / n).is_dir()] == []
