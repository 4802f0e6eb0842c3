"""Random hostile requests to the real server over real HTTP (raw bytes on a socket).

For every request: an HTTP answer arrives (for each request the bytes held,
when a short Content-Length leaves a second one behind), none is a 5xx, every
refusal is a JSON object with an error, and a request whose every answer was
a refusal left every SQLite table exactly as it was.
"""

from __future__ import annotations

import json
import re
import socket

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.refbackend import proc

FIELDS = ["harness", "launch_request", "id", "jam", "model", "status", "max_parallel", "error", "count", "on",
          "delay", "retry_after"]
NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "99999999999999999999999", "9223372036854775808",
           "-9223372036854775809", "9223372036854775807", "-0", "0", "1", "2", "1.5", "1e3", "true", "false", "null"]
STRINGS = ['""', '"h"', '"spring"', '"m1"', '"running"', '"succeeded"', '"failed"', '"\\ud800"', '"\\udfff x"',
           '"a\\u0000b"', '"' + "x" * 300 + '"', '"existing"', '"next"']


def json_text() -> st.SearchStrategy[str]:
    """JSON-looking text, hostile where it matters: odd numbers, lone surrogates, repeated keys, depth."""
    scalar = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS),
                       st.integers(-2**70, 2**70).map(str), st.text(max_size=12).map(json.dumps))
    key = st.one_of(st.sampled_from(FIELDS), st.sampled_from(STRINGS), st.text(max_size=6).map(json.dumps))

    def containers(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        array = st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
        members = st.lists(st.tuples(key.map(lambda k: k if k.startswith('"') else json.dumps(k)), inner),
                           max_size=5)
        obj = members.map(lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}")
        return st.one_of(array, obj)

    nested = st.integers(20, 5000).map(lambda n: "[" * n + "]" * n)
    return st.one_of(st.recursive(scalar, containers, max_leaves=12), nested)


@st.composite
def requests(draw: st.DrawFn, ids: list[str], tokens: list[str]) -> bytes:
    # Half the requests are well formed up to the body (method, version, token, length), so that the
    # body's checks are reached and some requests are served; the other half are hostile throughout.
    sane = draw(st.booleans())
    method = draw(st.one_of(st.sampled_from(["GET", "POST", "PUT", "POST", "POST", "DELETE", "HEAD", "OPTIONS"]),
                            st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8)))
    run_id = draw(st.one_of(st.sampled_from(ids), st.text(max_size=8).map(lambda t: t.encode().hex())))
    path = draw(st.sampled_from([
        "/jobs", "/jobs/next", f"/jobs/{run_id}", f"/jobs/{run_id}/status", "/harnesses/h", "/harnesses/%00",
        "/harnesses/" + "x" * 300, "/_faults", "/", "*", "/jobs/next/status", f"/jobs/{run_id}/status/x",
        "/jobs/%ff%fe", "/jobs//next", "/jobs?x=1", "http://h/jobs", "/%E9t%C3%A9"]))
    if sane:
        method = {"/jobs/next": "POST", f"/jobs/{run_id}/status": "POST", "/harnesses/h": "PUT",
                  "/jobs": draw(st.sampled_from(["GET", "POST"]))}.get(path, method)
    version = "HTTP/1.1" if sane else draw(st.sampled_from(
        ["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1", "HTTX/1.1", ""]))
    lines = [f"{method} {path} {version}".rstrip()]
    auth = f"Bearer {draw(st.sampled_from(tokens))}" if sane else draw(st.one_of(
        st.none(), st.sampled_from([f"Bearer {t}" for t in tokens]),
        st.text(st.characters(max_codepoint=255, blacklist_characters="\r\n"), max_size=20).map(
            lambda t: "Bearer " + t),
        st.sampled_from(["Bearer", "Bearer ", "Basic abc", "bearer " + proc.SERVICE_TOKEN,
                         "Bearer " + proc.SERVICE_TOKEN + " ", "Bearer \u00e9\u00ff"])))
    if auth is not None:
        lines.append(f"Authorization: {auth}")
    body = draw(st.one_of(st.none(), json_text().map(str.encode), st.binary(max_size=40),
                          st.sampled_from([b'{"harness": "h"}', b'{"harness": "h", "jam": "j", "model": "m"}',
                                           b'{"status": "running"}', b'{"max_parallel": 2}'])))
    length = "exact" if sane else draw(st.sampled_from(
        ["exact", "exact", "exact", "none", "-1", "huge", "garbage", "short", "long", "twice"]))
    size = len(body or b"")
    value = {"exact": str(size), "-1": "-1", "huge": str(2 * 1024 * 1024), "garbage": "12abc", "twice": None,
             "short": str(max(0, size - 3)), "long": str(size + 7), "none": None}[length]
    if length == "twice":
        lines += [f"Content-Length: {size}", f"Content-Length: {size + 1}"]
    elif value is not None and (body is not None or length != "exact"):
        lines.append(f"Content-Length: {value}")
    if draw(st.booleans()):
        lines.append("Connection: close")
    if not sane and draw(st.integers(0, 9)) == 0:
        lines.append("Transfer-Encoding: chunked")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b"")


HEAD = re.compile(rb"HTTP/1\.[01] (\d{3}) [^\r\n]*\r\n((?:[^\r\n]+\r\n)*)\r\n")


def answers(backend: proc.Backend, raw: bytes) -> list[tuple[int, bytes]]:
    """Every response on one connection: send, half-close, read to the server's close."""
    with socket.create_connection(backend.address, timeout=15) as s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    out = []
    while data:
        head = HEAD.match(data)
        assert head, f"not an HTTP response: {data[:300]!r}"
        headers = dict(line.split(b":", 1) for line in head.group(2).splitlines())
        length = int(headers[b"Content-Length"].strip())
        end = head.end() + length
        out.append((int(head.group(1)), data[head.end():end]))
        data = data[end:]
    return out


def test_random_hostile_requests_get_a_json_4xx_or_an_answer_and_refusals_change_nothing() -> None:
    with proc.Backend(faults=False, extra_args=("--timeout", "2")) as backend:
        assert backend.call("PUT", "/harnesses/h", {"max_parallel": 3})[0] == 200
        runs = [backend.enqueue(id="existing"), backend.enqueue(jam="spring", model="m1"),
                backend.enqueue(jam="spring", model="m1")]
        assert backend.call("POST", "/jobs/next")[0] == 200
        ids = [r["id"] for r in runs]
        tokens = [proc.SERVICE_TOKEN] + [r["token"] for r in runs]
        seen: set[int] = set()

        @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(raw=requests(ids, tokens))
        def one(raw: bytes) -> None:
            before = backend.dump()
            got = answers(backend, raw)
            assert got, f"no answer to {raw[:300]!r}"
            for status, body in got:
                seen.add(status)
                assert status < 500, (status, body, raw[:300])
                if status >= 400:
                    answer = json.loads(body)
                    assert isinstance(answer, dict) and isinstance(answer["error"], str), body
            if all(status >= 400 for status, _ in got):
                assert backend.dump() == before, f"a refused request changed the database: {raw[:300]!r}"

        one()
        assert backend.proc.poll() is None
        assert "Traceback" not in backend.stderr() and "failed:" not in backend.stderr(), backend.stderr()
        # The run of examples reached past the refusals: some requests were served.
        assert {400, 401} <= seen and any(s < 300 for s in seen), seen
