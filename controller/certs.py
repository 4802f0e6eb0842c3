"""The metrics server's TLS certificate: the operator's (a directory holding
`tls.crt` and `tls.key`, as a mounted kubernetes.io/tls Secret or
cert-manager gives them), else a self-signed one made at start, as
controller-runtime makes one for its secured metrics when none is given.

A self-signed certificate is enough for what it protects: the bearer token
the scraper sends. Prometheus scrapes it with `insecure_skip_verify` or
the operator mounts one signed by a CA the scraper trusts.

A mounted pair is served as it is, read once at start: each file is read
once and checked with `cryptography` (`tls.crt` a PEM certificate chain,
its first certificate the server's; `tls.key` an unencrypted PEM private
key, the key of that certificate) before the ssl module gets those same
bytes, so what is served is what was checked, even when the Secret's files
are replaced in between. A pair that fails a check is one CertificateError
naming the file, never a traceback or ssl's "PEM lib".

The self-signed certificate is made with `cryptography`: an EC P-256 key,
an X.509 v3 certificate with a random 159-bit serial, subject and issuer
CN the first host, the hosts as its subjectAltName and a critical
basicConstraints CA:FALSE, signed with ECDSA and SHA-256, valid from
BACKDATE before the start for VALIDITY.

The root filesystem is read-only and the ssl module loads a chain only from
files, so either pair is handed to it through an anonymous memory file
(`memfd_create`, Linux): nothing is written to disk and the key never
leaves the process.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
import socket
import ssl

from cryptography import exceptions, x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

VALIDITY = datetime.timedelta(days=365)
BACKDATE = datetime.timedelta(minutes=5)  # notBefore: a scraper's clock a little behind ours still accepts it
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"


class CertificateError(ValueError):
    """A mounted pair the metrics server cannot serve: one line naming the file and why."""


def self_signed(*, hosts: list[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate and its key (PEM, the key PKCS#8) for `hosts` (DNS names or IP addresses)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, hosts[0] if hosts else "dispatch-controller")])
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    # Whole seconds: the certificate's times have no fraction, so a reader compares what it states.
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())  # positive, at most 159 bits (RFC 5280: 20 octets)
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def mounted(cert_dir: str) -> tuple[bytes, bytes]:
    """The directory's `tls.crt` and `tls.key` as read, once each checked to be a pair ssl can serve."""
    base = pathlib.Path(cert_dir)
    cert_path, key_path = base / CERT_FILE, base / KEY_FILE
    cert_pem, key_pem = _read(cert_path), _read(key_path)
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise CertificateError(f"{cert_path}: not a PEM certificate (a chain, the server's first)") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:  # cryptography's word for a key that needs a password
        raise CertificateError(f"{key_path}: an encrypted private key (the server needs it unencrypted)") from None
    except (ValueError, exceptions.UnsupportedAlgorithm):
        raise CertificateError(f"{key_path}: not a PEM private key") from None
    if key.public_key() != chain[0].public_key():
        raise CertificateError(f"{key_path}: not the key of the first certificate in {cert_path}")
    # One file for both (the key's block on a line of its own): ssl takes the chain's certificates
    # and the key from it.
    return cert_pem.rstrip(b"\n") + b"\n", key_pem


def _read(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def default_hosts() -> list[str]:
    """The names a scraper may use: the pod's host name, localhost, the loopback addresses."""
    return [socket.gethostname(), "localhost", "127.0.0.1", "::1"]


def server_context(cert_dir: str | None) -> ssl.SSLContext:
    """A server context (TLS 1.2 at least) with the directory's pair, or a self-signed one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = mounted(cert_dir) if cert_dir else self_signed(hosts=default_hosts())
    fd = os.memfd_create("dispatch-metrics-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert + key)
        try:
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        except ssl.SSLError as exc:  # checked above; what ssl still refuses (a key type it lacks)
            where = pathlib.Path(cert_dir) / CERT_FILE if cert_dir else "the self-signed certificate"
            raise CertificateError(f"{where}: the ssl module refuses the pair: {exc.reason or exc}") from None
    finally:
        os.close(fd)
    return context
