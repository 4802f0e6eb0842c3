"""JSON-lines logging with a `component` field, on stderr; every token the process holds redacted.

Tokens never reach a log. No code path passes one to a log call (the Claim
type keeps its token out of repr), and as the second line of defence every
token this process holds is registered here (`hold`: the service token at
start, each per-job token as it enters, from a claim or read back from a
Secret) and replaced by `[redacted]` in the record before it is formatted:
in the message, in every field (nested dicts and lists too, keys as well)
and in the exception text. Redaction works on the record, not on the
finished JSON line: JSON escaping (`"` -> `\\"`, a newline -> `\\n`,
non-ASCII -> `\\uXXXX`) would defeat a string match there.

Two kinds of held token:
- valid bearer tokens (RFC 6750 characters, see `backend.token_problem`):
  kept in a set; a text is scanned run by run of token characters, so the
  cost does not grow with the number held. At most `MAX_HELD` are kept (the
  oldest go first: far more than the in-flight cap allows at once);
- anything else (a token the dispatcher refused): at most `MAX_ODD`, each
  matched literally and in its escaped forms (repr of the str and of its
  UTF-8 bytes, JSON), as an error message would quote it.

`scrub` is the same redaction for any value (a death report's body).
Structured fields go in `extra={"fields": {...}}`. The record is the one all
three processes write (toolkit.jsonlog: `time`, `level`, `component`,
`message`, then the fields), redacted whole before it becomes a line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Iterable

from dispatcher import names
from toolkit import jsonlog

REDACTED = "[redacted]"
MAX_HELD = 1 << 17
MAX_ODD = 256
# The characters of an RFC 6750 b64token, and its `=` padding.
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9\-._~+/=]+")

_lock = threading.Lock()
_plain: dict[str, None] = {}  # insertion-ordered: the oldest first
_length_counts: dict[int, int] = {}
_lengths: tuple[int, ...] = ()  # longest first; replaced whole, so a reader never sees it change
_odd: dict[str, tuple[str, ...]] = {}


def _escapings(text: str) -> set[str]:
    return {text, repr(text)[1:-1], json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1],
            repr(text.encode("utf-8", "surrogatepass"))[2:-1]}


def _variants(token: str) -> tuple[str, ...]:
    """The token as it may be quoted: itself, and its repr / JSON / bytes-repr escapings, once and twice
    (the repr of an exception whose message holds the repr of a header)."""
    forms = {twice for once in _escapings(token) for twice in _escapings(once)}
    return tuple(sorted((f for f in forms if f), key=len, reverse=True))


def hold(token: str | None) -> None:
    """Register a token this process holds: from now on no log record carries it."""
    global _lengths
    if not token:
        return
    with _lock:
        if _TOKEN_CHARS.fullmatch(token):
            if token in _plain:
                return
            _plain[token] = None
            _length_counts[len(token)] = _length_counts.get(len(token), 0) + 1
            while len(_plain) > MAX_HELD:
                oldest = next(iter(_plain))
                del _plain[oldest]
                _length_counts[len(oldest)] -= 1
                if not _length_counts[len(oldest)]:
                    del _length_counts[len(oldest)]
            _lengths = tuple(sorted(_length_counts, reverse=True))
        elif token not in _odd:
            _odd[token] = _variants(token)
            while len(_odd) > MAX_ODD:
                del _odd[next(iter(_odd))]


def _redact_plain(text: str, tokens: dict[str, None], lengths: tuple[int, ...]) -> str:
    if not lengths:
        return text
    shortest = lengths[-1]
    out: list[str] = []
    last = 0
    for run in _TOKEN_CHARS.finditer(text):
        start, end = run.span()
        if end - start < shortest:
            continue
        i = start
        while i < end:
            for length in lengths:
                if i + length <= end and text[i:i + length] in tokens:
                    out.append(text[last:i])
                    out.append(REDACTED)
                    i += length
                    last = i
                    break
            else:
                i += 1
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _literal_forms(secrets: Iterable[str]) -> tuple[list[str], tuple[int, ...]]:
    """The forms matched literally (odd held tokens and every escaping of `secrets`), longest first, and
    the lengths of the plain held tokens: computed once for a whole `scrub`, not once per string."""
    with _lock:
        odd = [form for forms in _odd.values() for form in forms]
        lengths = _lengths
    extra = [form for s in secrets if s for form in _variants(s)]
    return sorted((*odd, *extra), key=len, reverse=True), lengths


def _redact(text: str, forms: list[str], lengths: tuple[int, ...]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, REDACTED)
    return _redact_plain(text, _plain, lengths)


def redact(text: str, *, secrets: Iterable[str] = ()) -> str:
    """`text` with every held token (and each of `secrets`) replaced by `[redacted]`."""
    return _redact(text, *_literal_forms(secrets))


def scrub(value: object, *, secrets: Iterable[str] = ()) -> object:
    """`value` with `redact` applied to every string in it (dict keys too); other leaves as they are,
    except objects JSON cannot hold, which become their (redacted) str."""
    forms, lengths = _literal_forms(tuple(secrets))

    def walk(item: object) -> object:
        if isinstance(item, str):
            return _redact(item, forms, lengths)
        if item is None or isinstance(item, (bool, int, float)):
            return item
        if isinstance(item, dict):
            return {_redact(str(k), forms, lengths): walk(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v) for v in item]
        return _redact(str(item), forms, lengths)

    return walk(value)


def held() -> int:
    """How many tokens are held (for tests and the bench)."""
    with _lock:
        return len(_plain) + len(_odd)


class JsonFormatter(logging.Formatter):
    def __init__(self, *, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        for secret in secrets:
            hold(secret)

    def format(self, record: logging.LogRecord) -> str:
        entry = scrub(jsonlog.from_log_record(record, component=names.COMPONENT))
        assert isinstance(entry, dict)  # scrub keeps a dict a dict
        return jsonlog.line(entry)


def configure(*, level: str, secrets: tuple[str, ...] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets=secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client libraries' own chatter (urllib3 retries, kubernetes debug) is not ours.
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fields(**values: object) -> dict[str, dict[str, object]]:
    """`log.info("...", extra=logs.fields(job_id=...))`."""
    return {"fields": values}
