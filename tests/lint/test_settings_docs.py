"""Every process's settings are documented from its table, one way for all three: the reference
table on its docs page is the one `toolkit.envtable.markdown` writes from the process's `TABLE`
(variable, default, value, meaning; the controller's with its options), between two markers. A
row added, a bound or a default changed in the code and not on the page fails here. To write the
tables after a change:

    .venv/bin/python -m tests.lint.test_settings_docs
"""

from __future__ import annotations

import importlib
import pathlib

import pytest

from toolkit import envtable

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The settings module of each process -> the page that documents it.
PAGES = {
    "controller.settings": "docs/adapter.md",
    "dispatcher.settings": "docs/dispatcher.md",
    "sidecar.settings": "docs/sidecar.md",
}
BEGIN = "<!-- settings table of {module}: written from its TABLE by python -m tests.lint.test_settings_docs -->\n"
END = "<!-- end of the settings table -->\n"


def written(module: str) -> str:
    return envtable.markdown(importlib.import_module(module).TABLE)


def span(text: str, module: str) -> tuple[int, int] | None:
    """Where the table of `module` stands in `text` (between the markers), or None without them."""
    begin = BEGIN.format(module=module)
    if text.count(begin) != 1:
        return None
    start = text.index(begin) + len(begin)
    end = text.find(END, start)
    return None if end == -1 else (start, end)


@pytest.mark.parametrize("module", sorted(PAGES))
def test_the_page_carries_the_table_written_from_the_settings(module: str) -> None:
    text = (ROOT / PAGES[module]).read_text()
    where = span(text, module)
    assert where is not None, f"{PAGES[module]}: no table of {module} between its two markers"
    assert text[where[0]:where[1]] == written(module), (
        f"{PAGES[module]}: the table of {module} is not the one its TABLE writes "
        "(.venv/bin/python -m tests.lint.test_settings_docs writes it)")


def test_no_other_page_carries_a_table_of_a_process() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = sorted((str(page.relative_to(ROOT)), module) for page in pages for module in PAGES
                   if span(page.read_text(), module) is not None)
    assert found == sorted((page, module) for module, page in PAGES.items())


def main() -> None:
    for module, page in PAGES.items():
        path = ROOT / page
        text = path.read_text()
        where = span(text, module)
        if where is None:
            raise SystemExit(f"{page}: put the two markers where the table of {module} goes:\n"
                             f"{BEGIN.format(module=module)}{END}")
        path.write_text(text[:where[0]] + written(module) + text[where[1]:])


if __name__ == "__main__":
    main()
