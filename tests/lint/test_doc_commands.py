"""Every command block of docs/install.md and docs/operating.md is run by
tests/e2e/test_the_install_docs_run.py or listed, with its reason, as one it does not run
(tests/doc_commands.py), and the pages tag their blocks so that a reader and the run tell a
command from a file's text: `sh` for commands, `yaml`/`python`/`json`/`text` for the rest, never an
untagged fence."""

from __future__ import annotations

import pytest

from tests import doc_commands


@pytest.mark.parametrize("page", doc_commands.PAGES)
def test_every_block_is_tagged_sh_or_as_text(page: str) -> None:
    tags = {doc_commands.SHELL_TAG, *doc_commands.TEXT_TAGS}
    found = [f"{page}:{b.line}: ```{b.tag}" for b in doc_commands.blocks(page) if b.tag not in tags]
    assert found == [], "a command block is ```sh, a file's or a program's text ```yaml, ```python, ..."


def test_every_command_block_is_run_or_listed_with_its_reason() -> None:
    keys = [b.key for b in doc_commands.command_blocks()]
    assert len(keys) == len(set(keys)), "two blocks with the same first line: the tables cannot tell them apart"
    unaccounted = [f"{page}: {first}" for page, first in keys
                   if (page, first) not in doc_commands.RUN and (page, first) not in doc_commands.NOT_RUN]
    assert unaccounted == [], "add each to doc_commands.RUN, or to NOT_RUN with the reason"
    gone = sorted({*doc_commands.RUN, *doc_commands.NOT_RUN} - set(keys))
    assert gone == [], "no block of the pages starts so any more"
    assert not doc_commands.RUN & doc_commands.NOT_RUN.keys()
    assert all(reason.strip() for reason in doc_commands.NOT_RUN.values())


def test_every_placeholder_the_run_fills_is_in_a_block_it_runs() -> None:
    ran = "\n".join(b.text for b in doc_commands.command_blocks() if b.key in doc_commands.RUN)
    unused = [p for p in doc_commands.PLACEHOLDERS if p not in ran]
    assert unused == []
    statuses = [c for b in doc_commands.command_blocks() if b.key in doc_commands.RUN
                for c in doc_commands.commands(b) if doc_commands.allowed_status(c)]
    assert len(statuses) == len(doc_commands.STATUS), "a STATUS entry that no command run starts with"


def test_a_block_that_is_neither_run_nor_listed_is_found() -> None:
    text = "intro\n\n```sh\nkubectl get nodes\n```\n\n```yaml\nkind: Pod\n```\n"
    (found, text_block) = doc_commands.blocks("docs/new.md", text)
    assert (found.is_commands, text_block.is_commands) == (True, False)
    assert found.key == ("docs/new.md", "kubectl get nodes")
    assert found.key not in doc_commands.RUN and found.key not in doc_commands.NOT_RUN


def test_commands_split_on_lines_and_keep_continuations_and_here_documents() -> None:
    block = doc_commands.Block(page="p", line=1, tag="sh", text=(
        "# a comment\na --x \\\n  --y\n\ncat > f <<'EOF'\nk: v\nEOF\nb  # trailing comment\n"))
    assert doc_commands.commands(block) == ["a --x \\\n  --y", "cat > f <<'EOF'\nk: v\nEOF", "b  # trailing comment"]


def test_placeholders_are_replaced_as_whole_words() -> None:
    values = doc_commands.Values(sidecar_image="reg/s@sha256:ab", trainjob="job-1", namespace="ns-1",
                                 checkpoint_root="/tmp/c")
    assert doc_commands.substituted(
        "kubectl get clustertrainingruntime x -n training; toolkit status llama-ft-7 -n training; ls /ckpt",
        values) == "kubectl get clustertrainingruntime x -n ns-1; toolkit status job-1 -n ns-1; ls /tmp/c"


def test_an_unclosed_fence_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^docs/x.md:1: a fence that is never closed$"):
        doc_commands.blocks("docs/x.md", "```sh\nls\n")
