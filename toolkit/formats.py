"""The Kubernetes value formats the project checks before it sends a value to
the apiserver: one definition each, for the toolkit, the controller and the
dispatcher.

Each check is a predicate on the whole text: a pattern is matched with
`fullmatch`, never `match` with `$` (which also accepts the text followed by
one newline, so `"x\\n"` would pass for a label), and the length bound is
part of the check. The patterns spell their characters out (`[0-9]`, not
`\\d`, which would accept other scripts' digits).

- `dns_label`: an RFC 1123 label (a namespace, a ServiceAccount, a Job name):
  lowercase ASCII letters, digits and '-', starting and ending with a letter
  or digit, at most 63 characters.
- `rfc1035_label`: the same, starting with a letter (a TrainJob's name).
- `dns_subdomain`: labels joined by '.', at most 253 characters.
- `label_value`: a label's value: empty, or ASCII letters, digits, '-', '_'
  and '.', starting and ending with a letter or digit, at most 63.
- `quantity`: a resource amount as the apiserver reads one (a number, with
  an optional binary suffix Ki..Ei, decimal suffix n, u, m, k, M..E or
  exponent), not negative: every quantity the project reads is a request or
  a limit, which the apiserver refuses below zero.

Standard library only, and no I/O: the dispatcher's image copies this file.
"""

from __future__ import annotations

import re

LABEL_MAX = 63
SUBDOMAIN_MAX = 253

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)
_RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def dns_label(text: str) -> bool:
    """An RFC 1123 label of at most 63 characters."""
    return len(text) <= LABEL_MAX and _DNS_LABEL.fullmatch(text) is not None


def rfc1035_label(text: str) -> bool:
    """An RFC 1035 label (an RFC 1123 label that starts with a letter) of at most 63 characters."""
    return len(text) <= LABEL_MAX and _RFC1035_LABEL.fullmatch(text) is not None


def dns_subdomain(text: str) -> bool:
    """An RFC 1123 subdomain of at most 253 characters."""
    return len(text) <= SUBDOMAIN_MAX and _DNS_SUBDOMAIN.fullmatch(text) is not None


def label_value(text: str) -> bool:
    """A label value (the empty string is one) of at most 63 characters."""
    return len(text) <= LABEL_MAX and _LABEL_VALUE.fullmatch(text) is not None


def quantity(text: str) -> bool:
    """A resource quantity in the apiserver's grammar, zero or more."""
    return _QUANTITY.fullmatch(text) is not None
