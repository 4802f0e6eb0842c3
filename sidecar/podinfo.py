"""The pod's own metadata, read from its Downward API volume (no API call).

The kubelet writes `name` and `namespace` as the bare value, and `labels` and
`annotations` as one line per key, sorted, `key="value"`, the value quoted by
Go's `%q` (strconv.Quote: backslash escapes for quote, backslash and control
characters, \\xNN, \\uNNNN and \\UNNNNNNNN for the rest). `unquote` undoes
exactly that, so an annotation holding quotes, newlines or `=` reads back as
the string the apiserver holds; anything else is refused as PodInfoError
(one line naming the file and the line), never a traceback.

The kubelet rewrites these files when the pod's labels or annotations change,
so the loop reads them again before every check.
"""

from __future__ import annotations

import collections
import os

_SIMPLE = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34, "'": 39}
_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}


class PodInfoError(ValueError):
    pass


# Named tuples, not dataclasses: dataclasses imports inspect (ast, dis, tokenize...), ~1.7 MB of
# RSS in every pod (bench/sidecar).
class PodInfo(collections.namedtuple("PodInfo", "name namespace labels annotations")):
    __slots__ = ()
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


def unquote(quoted: str) -> str:
    """The string a Go double-quoted literal stands for. ValueError if it is not one."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise ValueError("not a double-quoted string")
    body = quoted[1:-1]
    out = bytearray()
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == '"':
            raise ValueError("unescaped quote")
        if c != "\\":
            j = i
            while j < n and body[j] not in '\\"':
                j += 1
            out += body[i:j].encode()
            i = j
            continue
        if i + 1 >= n:
            raise ValueError("backslash at the end")
        e = body[i + 1]
        if e in _SIMPLE:
            out.append(_SIMPLE[e])
            i += 2
        elif e in _HEX_WIDTH:
            digits = body[i + 2:i + 2 + _HEX_WIDTH[e]]
            if len(digits) != _HEX_WIDTH[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"bad \\{e} escape")
            value = int(digits, 16)
            if e == "x":
                out.append(value)  # a raw byte, as Go's \x is
            else:
                if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                    raise ValueError(f"\\{e}{digits} is not a Unicode scalar value")
                out += chr(value).encode()
            i += 2 + len(digits)
        elif e in "01234567":
            digits = body[i + 1:i + 4]
            if len(digits) != 3 or not all(d in "01234567" for d in digits) or int(digits, 8) > 255:
                raise ValueError("bad octal escape")
            out.append(int(digits, 8))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{e}")
    # A Go string may hold bytes that are not UTF-8 (\xNN); keep them visible.
    return out.decode("utf-8", errors="backslashreplace")


def parse_map(text: str, *, source: str) -> dict[str, str]:
    """The kubelet's labels/annotations file format, back into a dict."""
    result: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if line == "":
            continue  # the kubelet trims the last newline; an empty file has no lines
        key, eq, quoted = line.partition("=")
        if not eq or not key:
            raise PodInfoError(f"{source} line {number}: expected key=\"value\"")
        try:
            result[key] = unquote(quoted)
        except ValueError as e:
            raise PodInfoError(f"{source} line {number}: the value of {key} is not a Go quoted string ({e})") from None
    return result


def _read(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        raise PodInfoError(f"{path}: missing (is the Downward API volume mounted there?)") from None
    except OSError as e:
        raise PodInfoError(f"{path}: cannot read ({e.strerror})") from None


def read(directory: str) -> PodInfo:
    """All four files must be there: a volume without `annotations` would
    otherwise read as a pod without the admission annotation, a false report."""
    name = _read(directory, "name").strip()
    namespace = _read(directory, "namespace").strip()
    if not name or not namespace:
        raise PodInfoError(f"{directory}: name and namespace must not be empty")
    labels = parse_map(_read(directory, "labels"), source=os.path.join(directory, "labels"))
    annotations = parse_map(_read(directory, "annotations"), source=os.path.join(directory, "annotations"))
    return PodInfo(name=name, namespace=namespace, labels=labels, annotations=annotations)
