"""The Kubernetes value formats (toolkit.formats) agree with oracles written from the documented
rules (tests/k8sformats.py, no regular expression), on the edges a pattern gets wrong: a trailing
newline, the length bounds, a leading or trailing '-', non-ASCII letters and digits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import k8sformats
from toolkit import formats

TRICKY = ["", "a", "0", "a-b", "-a", "a-", "A", "a_b", "a.b", "a..b", ".a", "a.", "x\n", "x\r", "x\n\n", " x", "x ",
          "\nx", "ä", "٣", "a" * 62, "a" * 63, "a" * 64, "a" + "-" * 61 + "b", ("a" * 63 + ".") * 3 + "a",
          ("a" * 63 + ".") * 3 + "a" * 61, ("a" * 63 + ".") * 3 + "a" * 62, "A_b.C", "_a", "a_", "x/y", "x\t"]
QUANTITIES = ["0", "1", "100m", "0.5", ".5", "5.", "+1", "-1", "1Ki", "256Mi", "1Ei", "1ki", "1KI", "1K", "1k", "1u",
              "1n", "1E", "1e3", "1E3", "1e+3", "1e-3", "1e", "1e+", "1.5.5", ".", "", "m", "1 m", "1m\n", "1Mi\n",
              "100m\n", "١", "1GB", "1mi", "+", "++1", "1e3Mi", "0x10"]


@pytest.mark.parametrize(("check", "oracle"), [
    (formats.dns_label, k8sformats.is_dns_label),
    (formats.rfc1035_label, k8sformats.is_rfc1035_label),
    (formats.dns_subdomain, k8sformats.is_dns_subdomain),
    (formats.label_value, k8sformats.is_label_value),
], ids=["dns_label", "rfc1035_label", "dns_subdomain", "label_value"])
def test_each_name_format_agrees_with_its_documented_rule(check: Callable[[str], bool],
                                                          oracle: Callable[[str], bool]) -> None:
    assert {text: check(text) for text in TRICKY} == {text: oracle(text) for text in TRICKY}


@pytest.mark.parametrize("text", QUANTITIES)
def test_a_quantity_is_read_as_the_documented_grammar_and_never_negative(text: str) -> None:
    assert formats.quantity(text) is k8sformats.is_resource_quantity(text)


def test_a_trailing_newline_passes_no_check() -> None:
    checks = [formats.dns_label, formats.rfc1035_label, formats.dns_subdomain, formats.label_value, formats.quantity]
    assert [c("a1\n") for c in checks] == [False] * 5
