"""The metrics server's TLS certificate: the operator's (a directory holding
`tls.crt` and `tls.key`, as a mounted kubernetes.io/tls Secret or
cert-manager gives them), else a self-signed one made at start, as
controller-runtime makes one for its secured metrics when none is given.

A self-signed certificate is enough for what it protects: the bearer token
the scraper sends. Prometheus scrapes it with `insecure_skip_verify` or
the operator mounts one signed by a CA the scraper trusts.

The root filesystem is read-only and the ssl module loads a chain only from
files, so a generated certificate is handed to it through an anonymous
memory file (`memfd_create`, Linux): nothing is written to disk and the key
never leaves the process.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
import socket
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=365)


def self_signed(*, hosts: list[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate and its key (PEM) for `hosts` (DNS names or IP addresses)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "dispatch-controller")])
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def default_hosts() -> list[str]:
    """The names a scraper may use: the pod's host name, localhost, the loopback addresses."""
    return [socket.gethostname(), "localhost", "127.0.0.1", "::1"]


def server_context(cert_dir: str | None) -> ssl.SSLContext:
    """A server context (TLS 1.2 at least) with the directory's pair, or a self-signed one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        base = pathlib.Path(cert_dir)
        context.load_cert_chain(str(base / "tls.crt"), str(base / "tls.key"))
        return context
    cert, key = self_signed(hosts=default_hosts())
    fd = os.memfd_create("dispatch-metrics-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert + key)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return context
