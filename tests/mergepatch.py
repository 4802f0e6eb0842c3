"""A JSON merge patch (RFC 7386) applied as the apiserver applies one, for the tests that check what
a merge patch leaves on an object without a cluster."""

from __future__ import annotations

import copy
from typing import Any


def applied(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A copy of TARGET with PATCH applied: a null removes a key, a mapping merges, anything else
    (a list included) replaces."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = applied(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
