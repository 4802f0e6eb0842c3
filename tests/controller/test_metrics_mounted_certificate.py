"""The metrics endpoint's certificate from `--metrics-cert-dir` (a mounted kubernetes.io/tls
Secret, cert-manager's `tls.crt` and `tls.key`): the pair is served as it is, a chain with it
(a real TLS handshake against the metrics server on 127.0.0.1, the peer certificate's SHA-256
fingerprint that of the mounted one); a pair the server cannot serve is one CertificateError naming
the file, and the controller refuses to start on it in one line. controller/ makes no certificate
through ctypes: it imports cryptography for that."""

from __future__ import annotations

import ast
import datetime
import hashlib
import pathlib
import socket
import ssl
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from controller import certs, metrics_server
from tests.controller import conftest

REPO = pathlib.Path(__file__).resolve().parents[2]
Key = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def _certificate(key: Key, *, subject: str, issuer: tuple[str, Key] | None = None, ca: bool = False) -> x509.Certificate:
    """A certificate for KEY named SUBJECT, signed by ISSUER's (name, key), else by itself."""
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, issuer_name)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=90))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(issuer_key, hashes.SHA256()))


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Key, *, fmt: serialization.PrivateFormat = serialization.PrivateFormat.TraditionalOpenSSL,
             password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, fmt, encryption)


def _mount(directory: pathlib.Path, *, crt: bytes | None, key: bytes | None) -> str:
    """DIRECTORY as the kubelet mounts a kubernetes.io/tls Secret: each file a link into a
    timestamped directory (a file given as None is left out)."""
    data = directory / "..2026_12_07_00_00_00.000000001"
    data.mkdir(parents=True)
    (directory / "..data").symlink_to(data.name)
    for name, content in (("tls.crt", crt), ("tls.key", key)):
        if content is not None:
            (data / name).write_bytes(content)
            (directory / name).symlink_to(f"..data/{name}")
    return str(directory)


class _Allow:
    def decide(self, token: str) -> int:
        return 200 if token == "t" else 401


def _served_certificate(context: ssl.SSLContext, *, client: ssl.SSLContext) -> bytes:
    """The DER certificate the metrics server with CONTEXT presents to CLIENT in a handshake on 127.0.0.1."""
    server = metrics_server.MetricsServer(host="127.0.0.1", port=0, context=context,
                                          reviewer=_Allow(),  # type: ignore[arg-type]
                                          scrape=lambda: b"up 1\n", content_type="text/plain")
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
            tls.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\nAuthorization: Bearer t\r\n\r\n")
            reply = b""
            while chunk := tls.recv(65536):
                reply += chunk
    finally:
        server.stop()
    assert reply.startswith(b"HTTP/1.0 200 ") and reply.endswith(b"\r\n\r\nup 1\n"), reply
    assert der is not None
    return der


def test_a_mounted_pair_is_served_as_it_is(tmp_path: pathlib.Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = _certificate(key, subject="metrics.operator.example")
    cert_dir = _mount(tmp_path / "tls", crt=_pem(cert), key=_key_pem(key))  # an RSA key in PKCS#1, as cert-manager writes it

    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    served = _served_certificate(certs.server_context(cert_dir), client=unverified)

    mounted = cert.public_bytes(serialization.Encoding.DER)
    assert hashlib.sha256(served).hexdigest() == hashlib.sha256(mounted).hexdigest()
    # Not a certificate the controller made: the self-signed one is another.
    assert hashlib.sha256(served).digest() != hashlib.sha256(
        _served_certificate(certs.server_context(None), client=unverified)).digest()


def test_a_mounted_chain_is_served_with_its_leaf_first_and_verifies_against_its_ca(tmp_path: pathlib.Path) -> None:
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _certificate(ca_key, subject="operator CA", ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _certificate(leaf_key, subject="metrics.operator.example", issuer=("operator CA", ca_key))
    cert_dir = _mount(tmp_path / "tls", crt=_pem(leaf) + _pem(ca),
                      key=_key_pem(leaf_key, fmt=serialization.PrivateFormat.PKCS8))

    trusting_the_ca = ssl.create_default_context(cadata=_pem(ca).decode())  # verifies the chain and the host name
    served = _served_certificate(certs.server_context(cert_dir), client=trusting_the_ca)
    assert hashlib.sha256(served).digest() == hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).digest()


_NOT_PEM = "not a PEM certificate (a chain, the server's first)"
_PKCS8 = serialization.PrivateFormat.PKCS8
# Each malformed pair: (tls.crt, tls.key) from the good certificate's PEM and its key (None: the
# file is missing), the file the error names, and the reason it gives.
MALFORMED: dict[str, tuple[Callable[[bytes, Key], tuple[bytes | None, bytes | None]], str, str]] = {
    "a certificate that is not PEM": (lambda crt, key: (b"not a certificate\n", _key_pem(key)), "tls.crt", _NOT_PEM),
    "a certificate cut short": (lambda crt, key: (crt[: len(crt) // 2], _key_pem(key)), "tls.crt", _NOT_PEM),
    "a key in the certificate's place": (lambda crt, key: (_key_pem(key), _key_pem(key)), "tls.crt", _NOT_PEM),
    "no tls.crt": (lambda crt, key: (None, _key_pem(key)), "tls.crt", "cannot read it: No such file or directory"),
    "an empty key": (lambda crt, key: (crt, b""), "tls.key", "not a PEM private key"),
    "a certificate in the key's place": (lambda crt, key: (crt, crt), "tls.key", "not a PEM private key"),
    "an encrypted key": (lambda crt, key: (crt, _key_pem(key, fmt=_PKCS8, password=b"secret")), "tls.key",
                         "an encrypted private key (the server needs it unencrypted)"),
    "the key of another certificate": (lambda crt, key: (crt, _key_pem(ec.generate_private_key(ec.SECP256R1()))),
                                       "tls.key", "not the key of the first certificate in {dir}/tls.crt"),
    "no tls.key": (lambda crt, key: (crt, None), "tls.key", "cannot read it: No such file or directory"),
}


def _malformed(tmp_path: pathlib.Path, case: str) -> tuple[str, str]:
    """A mounted directory with CASE's pair, and the one line the controller must refuse it with."""
    key = ec.generate_private_key(ec.SECP256R1())
    make, named, reason = MALFORMED[case]
    crt_pem, key_pem = make(_pem(_certificate(key, subject="localhost")), key)
    cert_dir = _mount(tmp_path / "tls", crt=crt_pem, key=key_pem)
    return cert_dir, f"{cert_dir}/{named}: {reason.format(dir=cert_dir)}"


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_mounted_pair_is_one_error_naming_the_file(tmp_path: pathlib.Path, case: str) -> None:
    cert_dir, line = _malformed(tmp_path, case)
    with pytest.raises(certs.CertificateError) as refused:
        certs.server_context(cert_dir)
    assert str(refused.value) == line


def test_the_controller_refuses_a_malformed_mounted_certificate_in_one_line(tmp_path: pathlib.Path) -> None:
    cert_dir, line = _malformed(tmp_path, "a certificate cut short")
    proc = conftest.run_controller_once(tmp_path, "--metrics-cert-dir", cert_dir, "--health-port", "0",
                                        "--metrics-port", "0")
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"Error: --metrics-cert-dir: {line}\n")


def ctypes_imports(path: pathlib.Path) -> list[str]:
    """Where PATH imports ctypes (or _ctypes): import statements, and a module named in a string
    (importlib.import_module, __import__), as `line N`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        else:
            continue
        if any(name.split(".")[0] in ("ctypes", "_ctypes") for name in names):
            found.append(f"line {node.lineno}")
    return found


def test_nothing_under_controller_imports_ctypes() -> None:
    # The finder finds: a module of the repo that does call a C library through ctypes.
    assert ctypes_imports(REPO / "devcluster" / "registry.py")
    sources = sorted((REPO / "controller").rglob("*.py"))
    assert REPO / "controller" / "certs.py" in sources
    assert {str(p.relative_to(REPO)): ctypes_imports(p) for p in sources if ctypes_imports(p)} == {}
