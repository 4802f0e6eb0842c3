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

The certificate is made by the OpenSSL the ssl module already loads (the libcrypto its _ssl
extension links, as this process maps it, called through ctypes), so the image carries no second
cryptographic library: an EC P-256 key, an X.509 v3 certificate with a random 159-bit serial,
subject and issuer CN the first host, the hosts as its subjectAltName and a critical
basicConstraints CA:FALSE, signed with ECDSA and SHA-256. Every OpenSSL function called has its
result and argument types declared (a pointer left to ctypes' default, a C int, would be cut to 32
bits), every result is checked (a failure is one OpenSSLError naming the call, with OpenSSL's
reasons), and every object made is freed on the way out, failed or not.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import ipaddress
import os
import pathlib
import socket
import ssl
from collections.abc import Callable
from typing import Any

VALIDITY = datetime.timedelta(days=365)
BACKDATE = datetime.timedelta(minutes=5)  # notBefore: a scraper's clock a little behind ours still accepts it

# OpenSSL's constants (openssl/asn1.h, obj_mac.h, x509v3.h).
_MBSTRING_UTF8 = 0x1000
_NID_SUBJECT_ALT_NAME = 85
_NID_BASIC_CONSTRAINTS = 87
_GEN_DNS = 2
_GEN_IPADD = 7
_X509V3_ADD_DEFAULT = 0

_P = ctypes.c_void_p
_INT = ctypes.c_int
# Every function used, its result and its arguments: a pointer is a c_void_p (ctypes' default int
# would cut it to 32 bits).
_SIGNATURES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "ERR_get_error": (ctypes.c_ulong, ()),
    "ERR_clear_error": (None, ()),
    "ERR_error_string_n": (None, (ctypes.c_ulong, ctypes.c_char_p, ctypes.c_size_t)),
    "EVP_PKEY_CTX_new_from_name": (_P, (_P, ctypes.c_char_p, ctypes.c_char_p)),
    "EVP_PKEY_keygen_init": (_INT, (_P,)),
    "EVP_PKEY_CTX_set_group_name": (_INT, (_P, ctypes.c_char_p)),
    "EVP_PKEY_generate": (_INT, (_P, ctypes.POINTER(_P))),
    "EVP_PKEY_CTX_free": (None, (_P,)),
    "EVP_PKEY_free": (None, (_P,)),
    "EVP_sha256": (_P, ()),
    "X509_new": (_P, ()),
    "X509_free": (None, (_P,)),
    "X509_set_version": (_INT, (_P, ctypes.c_long)),
    "BN_bin2bn": (_P, (ctypes.c_char_p, _INT, _P)),
    "BN_free": (None, (_P,)),
    "BN_to_ASN1_INTEGER": (_P, (_P, _P)),
    "ASN1_INTEGER_free": (None, (_P,)),
    "X509_set_serialNumber": (_INT, (_P, _P)),
    "X509_getm_notBefore": (_P, (_P,)),
    "X509_getm_notAfter": (_P, (_P,)),
    "X509_gmtime_adj": (_P, (_P, ctypes.c_long)),
    "X509_NAME_new": (_P, ()),
    "X509_NAME_free": (None, (_P,)),
    "X509_NAME_add_entry_by_txt": (_INT, (_P, ctypes.c_char_p, _INT, ctypes.c_char_p, _INT, _INT, _INT)),
    "X509_set_subject_name": (_INT, (_P, _P)),
    "X509_set_issuer_name": (_INT, (_P, _P)),
    "X509_set_pubkey": (_INT, (_P, _P)),
    "OPENSSL_sk_new_null": (_P, ()),
    "OPENSSL_sk_push": (_INT, (_P, _P)),
    "GENERAL_NAMES_free": (None, (_P,)),
    "GENERAL_NAME_free": (None, (_P,)),
    "a2i_GENERAL_NAME": (_P, (_P, _P, _P, _INT, ctypes.c_char_p, _INT)),
    "BASIC_CONSTRAINTS_new": (_P, ()),
    "BASIC_CONSTRAINTS_free": (None, (_P,)),
    "X509_add1_ext_i2d": (_INT, (_P, _INT, _P, _INT, ctypes.c_ulong)),
    "X509_sign": (_INT, (_P, _P, _P)),
    "BIO_s_mem": (_P, ()),
    "BIO_new": (_P, (_P,)),
    "BIO_free": (_INT, (_P,)),
    "BIO_ctrl_pending": (ctypes.c_size_t, (_P,)),
    "BIO_read": (_INT, (_P, _P, _INT)),
    "PEM_write_bio_X509": (_INT, (_P, _P)),
    "PEM_write_bio_PrivateKey": (_INT, (_P, _P, _P, _P, _INT, _P, _P)),
}


class OpenSSLError(RuntimeError):
    """An OpenSSL call that failed while making the certificate (its name and OpenSSL's reasons)."""


def libcrypto_path() -> str:
    """The libcrypto the ssl module's _ssl extension is linked with: the one this process maps
    (importing ssl, above, loaded it)."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6:
                path = fields[5].strip()
                if os.path.basename(path).startswith("libcrypto") and ".so" in os.path.basename(path):
                    return path
    raise OpenSSLError("the ssl module's libcrypto is not a shared library this process maps "
                       "(an interpreter with OpenSSL linked statically): no self-signed certificate; "
                       "mount one with --metrics-cert-dir")


_lib: ctypes.CDLL | None = None


def _libcrypto() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(libcrypto_path())
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        _lib = lib
    return _lib


def _failed(lib: ctypes.CDLL, call: str) -> OpenSSLError:
    """The error for CALL's failure, with the reasons OpenSSL queued (the queue is emptied)."""
    reasons = []
    buffer = ctypes.create_string_buffer(256)
    while code := lib.ERR_get_error():
        lib.ERR_error_string_n(code, buffer, len(buffer))
        reasons.append(buffer.value.decode(errors="replace"))
    return OpenSSLError(f"making the metrics certificate: OpenSSL's {call} failed"
                        + (f": {'; '.join(reasons)}" if reasons else ""))


def self_signed(*, hosts: list[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate and its key (PEM, the key PKCS#8) for `hosts` (DNS names or IP addresses)."""
    lib = _libcrypto()
    lib.ERR_clear_error()
    with contextlib.ExitStack() as frees:

        def made(call: str, result: Any, *, free: Callable[[Any], Any] | None = None) -> Any:
            """RESULT of CALL, a pointer to be freed with FREE on the way out; raises on NULL."""
            if not result:
                raise _failed(lib, call)
            if free is not None:
                frees.callback(free, result)
            return result

        def ok(call: str, result: int) -> None:
            if result <= 0:
                raise _failed(lib, call)

        context = made("EVP_PKEY_CTX_new_from_name", lib.EVP_PKEY_CTX_new_from_name(None, b"EC", None),
                       free=lib.EVP_PKEY_CTX_free)
        ok("EVP_PKEY_keygen_init", lib.EVP_PKEY_keygen_init(context))
        ok("EVP_PKEY_CTX_set_group_name", lib.EVP_PKEY_CTX_set_group_name(context, b"P-256"))
        key = _P()
        ok("EVP_PKEY_generate", lib.EVP_PKEY_generate(context, ctypes.byref(key)))
        made("EVP_PKEY_generate", key.value, free=lib.EVP_PKEY_free)

        cert = made("X509_new", lib.X509_new(), free=lib.X509_free)
        ok("X509_set_version", lib.X509_set_version(cert, 2))  # v3
        serial = 0
        while not serial:  # positive, at most 159 bits (RFC 5280: at most 20 octets)
            serial = int.from_bytes(os.urandom(20), "big") >> 1
        raw = serial.to_bytes(20, "big")
        number = made("BN_bin2bn", lib.BN_bin2bn(raw, len(raw), None), free=lib.BN_free)
        integer = made("BN_to_ASN1_INTEGER", lib.BN_to_ASN1_INTEGER(number, None), free=lib.ASN1_INTEGER_free)
        ok("X509_set_serialNumber", lib.X509_set_serialNumber(cert, integer))
        not_before = made("X509_getm_notBefore", lib.X509_getm_notBefore(cert))
        made("X509_gmtime_adj", lib.X509_gmtime_adj(not_before, -int(BACKDATE.total_seconds())))
        not_after = made("X509_getm_notAfter", lib.X509_getm_notAfter(cert))
        made("X509_gmtime_adj", lib.X509_gmtime_adj(not_after, int(VALIDITY.total_seconds())))

        name = made("X509_NAME_new", lib.X509_NAME_new(), free=lib.X509_NAME_free)
        common = (hosts[0] if hosts else "dispatch-controller").encode()
        ok("X509_NAME_add_entry_by_txt",
           lib.X509_NAME_add_entry_by_txt(name, b"CN", _MBSTRING_UTF8, common, len(common), -1, 0))
        ok("X509_set_subject_name", lib.X509_set_subject_name(cert, name))
        ok("X509_set_issuer_name", lib.X509_set_issuer_name(cert, name))
        ok("X509_set_pubkey", lib.X509_set_pubkey(cert, key))

        alt = made("OPENSSL_sk_new_null", lib.OPENSSL_sk_new_null(), free=lib.GENERAL_NAMES_free)
        for host in hosts:
            try:
                kind, value = _GEN_IPADD, str(ipaddress.ip_address(host))
            except ValueError:
                kind, value = _GEN_DNS, host
            entry = made("a2i_GENERAL_NAME", lib.a2i_GENERAL_NAME(None, None, None, kind, value.encode(), 0))
            if lib.OPENSSL_sk_push(alt, entry) <= 0:
                lib.GENERAL_NAME_free(entry)
                raise _failed(lib, "OPENSSL_sk_push")
        ok("X509_add1_ext_i2d", lib.X509_add1_ext_i2d(cert, _NID_SUBJECT_ALT_NAME, alt, 0, _X509V3_ADD_DEFAULT))
        constraints = made("BASIC_CONSTRAINTS_new", lib.BASIC_CONSTRAINTS_new(), free=lib.BASIC_CONSTRAINTS_free)
        # A new BASIC_CONSTRAINTS is CA:FALSE, no path length; critical, as before.
        ok("X509_add1_ext_i2d",
           lib.X509_add1_ext_i2d(cert, _NID_BASIC_CONSTRAINTS, constraints, 1, _X509V3_ADD_DEFAULT))

        ok("X509_sign", lib.X509_sign(cert, key, made("EVP_sha256", lib.EVP_sha256())))

        def pem(call: str, write: Callable[[Any], int]) -> bytes:
            bio = made("BIO_new", lib.BIO_new(made("BIO_s_mem", lib.BIO_s_mem())), free=lib.BIO_free)
            ok(call, write(bio))
            size = lib.BIO_ctrl_pending(bio)
            out = ctypes.create_string_buffer(size)
            if lib.BIO_read(bio, out, size) != size:
                raise _failed(lib, "BIO_read")
            return out.raw

        cert_pem = pem("PEM_write_bio_X509", lambda bio: lib.PEM_write_bio_X509(bio, cert))
        key_pem = pem("PEM_write_bio_PrivateKey",
                      lambda bio: lib.PEM_write_bio_PrivateKey(bio, key, None, None, 0, None, None))
        return cert_pem, key_pem


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
