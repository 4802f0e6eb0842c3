"""HTTP/1.1 over TLS, the least the sidecar needs: one keep-alive connection,
a request with a JSON body or none, a response read whole (Content-Length,
chunked, or to the end of a closed connection).

TLS is the standard library's public `ssl` API: `ssl.create_default_context`
for a server (PROTOCOL_TLS_CLIENT: TLS 1.2 at least, the default cipher
string, certificate and host name checks, which OpenSSL makes in the
handshake), trusting only the cluster's own CA file. tests/sidecar/test_wire.py
holds it to that: a wrong CA, a wrong host name and a plain-HTTP server all
fail the request. What `ssl` costs in RSS over the C modules it is built on is
measured by bench/sidecar (docs/benchmarks.md).

Why not http.client: it imports the email package (its header parser) for
what the few lines below do; the sidecar runs in every training pod and pays
for every import.

Host names are passed as ASCII bytes: a str would be encoded with the idna
codec (encodings.idna, stringprep and the Unicode database: ~0.5 MB), and the
apiserver's address is an IP address or an ASCII DNS name.

Every failure is an OSError (refused, reset, timeout, TLS: `ssl.SSLError` is
one) or `ProtocolError` (a response this cannot read); the caller retries.
"""

from __future__ import annotations

import socket
import ssl

TLSError = ssl.SSLError  # an OSError
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100


class ProtocolError(Exception):
    """The server's answer is not an HTTP/1.1 response this can read."""


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers  # names lower-cased
        self.body = body


def tls_context(ca_file: str) -> ssl.SSLContext:
    """A client context trusting only CA_FILE; raises OSError (a missing file) or ssl.SSLError."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    return context


class Connection:
    """One TLS connection to HOST:PORT, opened on the first request and again after the server closed it."""

    def __init__(self, host: str, port: int, *, context: ssl.SSLContext, timeout: float) -> None:
        self._host, self._port, self._context, self._timeout = host, port, context, timeout
        self._tls: ssl.SSLSocket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._tls is not None:
            self._tls.close()
        self._tls = None
        self._buffer = b""

    def _open(self) -> ssl.SSLSocket:
        # The host as ASCII bytes (see the module docstring). A name that is not ASCII fails here,
        # as an OSError.
        try:
            host = self._host.encode("ascii")
        except UnicodeEncodeError:
            raise OSError(f"{self._host!r}: the API server's host name must be ASCII") from None
        family, kind, proto, _, address = socket.getaddrinfo(host, self._port, 0, socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(self._timeout)
            sock.connect(address)
            tls = self._context.wrap_socket(sock, server_hostname=host)  # the handshake, at once
        except BaseException:
            sock.close()
            raise
        self._tls = tls
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
            tls.sendall(data)
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
            data = self._tls.recv(65536)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
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
