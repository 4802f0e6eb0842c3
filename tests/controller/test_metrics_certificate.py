"""The metrics endpoint's self-signed certificate, made at start with cryptography
(controller/certs.py) and read back as a scraper reads it: the content the controller has always
served (an EC P-256 key, X.509 v3, ECDSA with SHA-256, the validity, the subjectAltName, a critical
basicConstraints CA:FALSE and nothing else), and a client that trusts that certificate alone
completes a verified handshake with the metrics server."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import urllib.error
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID, SignatureAlgorithmOID

from controller import certs, metrics_server

HOSTS = ["dispatch-controller-7d9f-x2k", "localhost", "127.0.0.1", "::1"]


def test_the_certificate_holds_what_the_controller_has_always_served() -> None:
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    cert_pem, key_pem = certs.self_signed(hosts=HOSTS)
    after = datetime.datetime.now(datetime.timezone.utc)
    cert = x509.load_pem_x509_certificate(cert_pem)

    assert cert.version == x509.Version.v3
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and isinstance(public.curve, ec.SECP256R1)
    assert cert.signature_algorithm_oid == SignatureAlgorithmOID.ECDSA_WITH_SHA256
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    cert.verify_directly_issued_by(cert)  # self-signed: the signature checks with its own key
    assert 0 < cert.serial_number < 2**159

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])])
    assert cert.subject == name and cert.issuer == name
    # The validity as a timestamp in whole seconds: notBefore backdated, notAfter VALIDITY on.
    assert before - certs.BACKDATE - datetime.timedelta(seconds=1) <= cert.not_valid_before_utc \
        <= after - certs.BACKDATE
    assert before + certs.VALIDITY - datetime.timedelta(seconds=1) <= cert.not_valid_after_utc <= after + certs.VALIDITY

    assert list(cert.extensions) == [
        x509.Extension(x509.SubjectAlternativeName.oid, False, x509.SubjectAlternativeName([
            x509.DNSName(HOSTS[0]), x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1"))])),
        x509.Extension(x509.BasicConstraints.oid, True, x509.BasicConstraints(ca=False, path_length=None)),
    ]

    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, not encrypted
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == public.public_numbers()


def test_each_certificate_has_a_key_and_serial_of_its_own() -> None:
    first, second = (x509.load_pem_x509_certificate(certs.self_signed(hosts=["localhost"])[0]) for _ in range(2))
    assert first.serial_number != second.serial_number
    assert first.public_key().public_numbers() != second.public_key().public_numbers()
    assert first.subject.rfc4514_string() == "CN=localhost"


class _Allow:
    def decide(self, token: str) -> int:
        return 200 if token == "t" else 401


def test_a_client_trusting_the_certificate_alone_verifies_the_metrics_server() -> None:
    server = metrics_server.MetricsServer(host="127.0.0.1", port=0, context=certs.server_context(None),
                                          reviewer=_Allow(),  # type: ignore[arg-type]
                                          scrape=lambda: b"up 1\n", content_type="text/plain")
    server.start()
    try:
        served = ssl.get_server_certificate(("127.0.0.1", server.port))  # fetched without verifying
        assert x509.load_pem_x509_certificate(served.encode()).subject.get_attributes_for_oid(
            NameOID.COMMON_NAME)[0].value == certs.default_hosts()[0]
        trusting = ssl.create_default_context(cadata=served)  # verifies the chain and the host name
        for host in ("127.0.0.1", "localhost"):
            request = urllib.request.Request(f"https://{host}:{server.port}/metrics",
                                             headers={"Authorization": "Bearer t"})
            with urllib.request.urlopen(request, timeout=10, context=trusting) as response:
                assert (response.status, response.read()) == (200, b"up 1\n")
        # Another certificate as the only CA: the handshake fails verification.
        other = certs.self_signed(hosts=["localhost"])[0].decode()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"https://127.0.0.1:{server.port}/metrics", timeout=10,
                                   context=ssl.create_default_context(cadata=other))
    finally:
        server.stop()
