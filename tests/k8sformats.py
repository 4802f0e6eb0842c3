"""Oracles for the Kubernetes value formats, written from the Kubernetes documentation's wording
(character sets, first and last character, length) without a regular expression, so a test of
`toolkit.formats` (or of a caller) never checks the implementation against its own pattern."""

from __future__ import annotations

import string

DIGITS = frozenset(string.digits)
LOWER_ALNUM = frozenset(string.ascii_lowercase + string.digits)
ALNUM = frozenset(string.ascii_letters + string.digits)
QUANTITY_SUFFIXES = ("", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def is_dns_label(text: str) -> bool:
    """RFC 1123 label: 1..63 of a-z, 0-9 and '-', first and last a-z or 0-9."""
    return (0 < len(text) <= 63 and all(c in LOWER_ALNUM or c == "-" for c in text)
            and text[0] in LOWER_ALNUM and text[-1] in LOWER_ALNUM)


def is_rfc1035_label(text: str) -> bool:
    """RFC 1035 label: an RFC 1123 label whose first character is a letter."""
    return is_dns_label(text) and text[0] in string.ascii_lowercase


def is_dns_subdomain(text: str) -> bool:
    """RFC 1123 subdomain as Kubernetes reads it: at most 253 characters, parts joined by '.', each
    part of a-z, 0-9 and '-' with its first and last a-z or 0-9 (no bound on a part of its own)."""
    return 0 < len(text) <= 253 and all(
        part != "" and all(c in LOWER_ALNUM or c == "-" for c in part) and part[0] in LOWER_ALNUM
        and part[-1] in LOWER_ALNUM for part in text.split("."))


def is_label_value(text: str) -> bool:
    """Empty, or 1..63 of letters, digits, '-', '_' and '.', first and last a letter or digit."""
    return text == "" or (len(text) <= 63 and all(c in ALNUM or c in "-_." for c in text)
                          and text[0] in ALNUM and text[-1] in ALNUM)


def is_resource_quantity(text: str) -> bool:
    """A quantity not below zero: ['+'] digits ['.' digits] (one digit at least), then a suffix
    (binary Ki..Ei, decimal n..E) or an exponent e|E ['+'|'-'] digits."""
    rest = text[1:] if text.startswith("+") else text
    i = digits = 0
    while i < len(rest) and rest[i] in DIGITS:
        i, digits = i + 1, digits + 1
    if i < len(rest) and rest[i] == ".":
        i += 1
        while i < len(rest) and rest[i] in DIGITS:
            i, digits = i + 1, digits + 1
    if digits == 0:
        return False
    suffix = rest[i:]
    if suffix in QUANTITY_SUFFIXES:
        return True
    if suffix[0] not in "eE":
        return False
    exponent = suffix[1:].removeprefix("+").removeprefix("-") if suffix[1:2] in ("+", "-") else suffix[1:]
    return exponent != "" and all(c in DIGITS for c in exponent)
