"""The Downward API labels/annotations files, as the kubelet writes them.

The files are produced by the real kubelet code (k8s.io/kubernetes
pkg/fieldpath.FormatMap at the control plane's pinned version, built from
tests/sidecar/formatmap), and the sidecar must read back exactly the map that
went in: quotes, backslashes, newlines, `=`, control and non-ASCII characters.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator

import hypothesis
import hypothesis.strategies as st
import pytest

from sidecar import podinfo

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def formatmap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    binary = tmp_path_factory.mktemp("formatmap") / "formatmap"
    # Built in the control plane's module, which pins k8s.io/kubernetes.
    subprocess.run(["go", "build", "-o", str(binary), str(REPO / "tests/sidecar/formatmap/main.go")],
                   cwd=REPO / "devcluster", check=True)
    yield binary


def kubelet_format(binary: pathlib.Path, maps: list[dict[str, str]]) -> list[str]:
    done = subprocess.run([str(binary)], input=json.dumps(maps), capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    assert isinstance(result, list)
    return result


# Label and annotation keys are qualified names: never '=' or a newline.
keys = st.text(alphabet=st.characters(blacklist_characters="=\n\r", blacklist_categories=("Cs",)), min_size=1,
               max_size=30)
values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
maps = st.dictionaries(keys, values, max_size=6)

EXAMPLES: list[dict[str, str]] = [
    {},
    {"dispatch.phpboyscout.uk/admission": "3"},
    {"a": ""},
    {"a": 'say "hi"', "b": "back\\slash", "c": "x=y=z"},
    {"multi": "line one\nline two\r\n\ttab"},
    {"ctl": "\x00\x01\x07\x08\x0b\x0c\x1b\x7f"},
    {"uni": "é 日本 \u200b \ufeff \U0001f600 \u2028"},
    {"a": "1", "b": "2", "c": "3"},
]


def test_examples_read_back_exactly(formatmap: pathlib.Path) -> None:
    for original, text in zip(EXAMPLES, kubelet_format(formatmap, EXAMPLES), strict=True):
        assert podinfo.parse_map(text, source="annotations") == original, text


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(maps, min_size=1, max_size=20))
def test_any_map_reads_back_exactly(formatmap: pathlib.Path, batch: list[dict[str, str]]) -> None:
    for original, text in zip(batch, kubelet_format(formatmap, batch), strict=True):
        assert podinfo.parse_map(text, source="labels") == original, text


def test_escapes_go_has_but_quote_never_writes() -> None:
    # Octal and \' are valid Go escapes; accept them though FormatMap uses neither.
    assert podinfo.unquote(r'"\101\'\x41\u0041\U00000041"') == "A'AAA"


@pytest.mark.parametrize("line", [
    'key',                      # no '='
    '=value',                   # no key
    'key=value',                # not quoted
    'key="unterminated',
    'key="a"b"',                # bare quote inside
    'key="tail\\"',             # escaped closing quote
    'key="\\q"',                # unknown escape
    'key="\\x4"',               # short hex
    'key="\\uD800"',            # a surrogate is not a character
    'key="\\U00110000"',        # beyond Unicode
    'key="\\400"',              # octal beyond a byte
])
def test_a_malformed_line_is_one_line_error(line: str) -> None:
    with pytest.raises(podinfo.PodInfoError) as raised:
        podinfo.parse_map(f'ok="1"\n{line}', source="/etc/dispatch/podinfo/annotations")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("/etc/dispatch/podinfo/annotations line 2:")


def write_podinfo(directory: pathlib.Path, *, name: str = "p", namespace: str = "ns",
                  labels: str = "", annotations: str = "") -> pathlib.Path:
    for file, text in (("name", name), ("namespace", namespace), ("labels", labels), ("annotations", annotations)):
        (directory / file).write_text(text)
    return directory


def test_reads_the_four_files(tmp_path: pathlib.Path) -> None:
    write_podinfo(tmp_path, name="trainer-node-0-0-x\n", labels='jobset.sigs.k8s.io/restart-attempt="2"',
                  annotations='dispatch.phpboyscout.uk/admission="5"\nother="a\\nb"')
    info = podinfo.read(str(tmp_path))
    assert info.name == "trainer-node-0-0-x"
    assert info.namespace == "ns"
    assert info.labels == {"jobset.sigs.k8s.io/restart-attempt": "2"}
    assert info.annotations == {"dispatch.phpboyscout.uk/admission": "5", "other": "a\nb"}


@pytest.mark.parametrize("missing", ["name", "namespace", "labels", "annotations"])
def test_a_missing_file_is_an_error_not_an_empty_map(tmp_path: pathlib.Path, missing: str) -> None:
    # An absent annotations file must not read as "no admission annotation".
    write_podinfo(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(podinfo.PodInfoError, match=f"{missing}: missing"):
        podinfo.read(str(tmp_path))
