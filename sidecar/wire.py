"""HTTP/1.1 over TLS, the least the sidecar needs: one keep-alive connection,
a request with a JSON body or none, a response read whole (Content-Length,
chunked, or to the end of a closed connection).

Why not http.client and ssl: they cost memory in every training pod.
http.client imports the email package (its header parser); ssl.py builds a
dozen enum classes over _ssl's constants and wraps socket.py, which builds
its own. Peak RSS by `/usr/bin/time -f %M python -S -c 'import X'` (3.11.7):
the interpreter 8.3 MB, `import _ssl, _socket` 11.1 MB, `import ssl` 14.8 MB,
`import http.client` 16.9 MB. What the sidecar's memory is made of, step by
step: bench/sidecar (docs/benchmarks.md).

A deliberate exception, then: this module uses the C modules under ssl and
socket directly (`_ssl._SSLContext`, its `_wrap_socket`, `_socket.socket`),
which ssl.py itself is built on. The TLS settings are ssl.create_default_context's
for a server: PROTOCOL_TLS_CLIENT, whose C constructor sets the secure
defaults (TLS 1.2 at least, the default cipher string) and turns on
certificate and host name checks, which OpenSSL makes in the handshake; the
CA is the cluster's own file. tests/sidecar/test_wire.py holds it to that:
a wrong CA, a wrong host name and a plain-HTTP server all fail the request.

Every failure is an OSError (refused, reset, timeout, TLS: `_ssl.SSLError` is
one) or `ProtocolError` (a response this cannot read); the caller retries.
"""

from __future__ import annotations

import _socket
import _ssl

TLSError = _ssl.SSLError  # an OSError
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100


class _Socket(_socket.socket):
    """_ssl keeps a weak reference to the socket it wraps, which the C type does not allow."""

    __slots__ = ("__weakref__",)


class ProtocolError(Exception):
    """The server's answer is not an HTTP/1.1 response this can read."""


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers  # names lower-cased
        self.body = body


def tls_context(ca_file: str) -> _ssl._SSLContext:
    """A client context trusting only CA_FILE; raises OSError (a missing file) or _ssl.SSLError."""
    context = _ssl._SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    assert context.check_hostname and context.verify_mode == _ssl.CERT_REQUIRED
    context.load_verify_locations(ca_file)
    return context


class Connection:
    """One TLS connection to HOST:PORT, opened on the first request and again after the server closed it."""

    def __init__(self, host: str, port: int, *, context: _ssl._SSLContext, timeout: float) -> None:
        self._host, self._port, self._context, self._timeout = host, port, context, timeout
        self._sock: _Socket | None = None
        self._tls: _ssl._SSLSocket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._tls = None
        self._buffer = b""

    def _open(self) -> _ssl._SSLSocket:
        # The host as ASCII bytes: a str would be encoded with the idna codec (encodings.idna,
        # stringprep and the Unicode database: ~0.5 MB), and the apiserver's address is an IP
        # address or an ASCII DNS name. A name that is not ASCII fails here, as an OSError.
        try:
            host = self._host.encode("ascii")
        except UnicodeEncodeError:
            raise OSError(f"{self._host!r}: the API server's host name must be ASCII") from None
        family, kind, proto, _, address = _socket.getaddrinfo(host, self._port, 0, _socket.SOCK_STREAM)[0]
        sock = _Socket(family, kind, proto)
        try:
            sock.settimeout(self._timeout)
            sock.connect(address)
            tls = self._context._wrap_socket(sock, False, self._host)
            tls.do_handshake()
        except BaseException:
            sock.close()
            raise
        self._sock, self._tls = sock, tls
        return tls

    def request(self, method: str, path: str, *, headers: dict[str, str], body: bytes | None) -> Response:
        tls = self._tls or self._open()
        host = f"[{self._host}]" if ":" in self._host else self._host  # an IPv6 address
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{self._port}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            head.append(f"Content-Length: {len(body)}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        try:
            view = memoryview(data)
            while view:
                view = view[tls.write(view):]
            response = self._response(method)
        except BaseException:
            self.close()
            raise
        if response.headers.get("connection", "").lower() == "close":
            self.close()
        return response

    def _response(self, method: str) -> Response:
        version, _, rest = self._line().partition(" ")
        code = rest.partition(" ")[0]
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {version} {rest}"[:200])
        status = int(code)
        headers: dict[str, str] = {}
        while line := self._line():
            name, sep, value = line.partition(":")
            if not sep or len(headers) >= MAX_HEADERS:
                raise ProtocolError(f"bad header line: {line[:200]!r}")
            headers[name.strip().lower()] = value.strip()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return Response(status, headers, b"")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return Response(status, headers, self._chunked())
        if "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length: {length[:50]!r}")
            return Response(status, headers, self._exactly(int(length)))
        headers["connection"] = "close"  # no length: the body ends with the connection
        return Response(status, headers, self._to_end())

    def _fill(self) -> bool:
        """Read more into the buffer; False at the end of the connection."""
        assert self._tls is not None
        try:
            data = self._tls.read(65536)
        except (_ssl.SSLZeroReturnError, _ssl.SSLEOFError):
            data = b""
        self._buffer += data
        return bool(data)

    def _line(self) -> str:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > MAX_HEADER_LINE:
                raise ProtocolError("a header line longer than 64 KiB")
            if not self._fill():
                raise ProtocolError("the connection closed before the response ended")
        line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
        return line.decode("latin-1")

    def _exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if not self._fill():
                raise ProtocolError("the connection closed before the response ended")
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _chunked(self) -> bytes:
        parts = []
        while True:
            size = self._line().partition(";")[0].strip()
            if not size or size.strip("0123456789abcdefABCDEF") or len(size) > 16:
                raise ProtocolError(f"bad chunk size: {size[:50]!r}")
            n = int(size, 16)
            if n == 0:
                while self._line():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self._exactly(n))
            if self._exactly(2) != b"\r\n":
                raise ProtocolError("a chunk not followed by CRLF")

    def _to_end(self) -> bytes:
        while self._fill():
            pass
        data, self._buffer = self._buffer, b""
        return data
