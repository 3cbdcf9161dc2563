"""The cluster's certificate authority and the certificates it issues (EC P-256, X.509).

Made with ``cryptography``; nothing here is hand-written crypto. The CA signs one certificate
per device (its name as the common name, its addresses as subject alternative names) and one
for the admin's machine (the Flight SQL endpoint serves with it, and coordinators there show it
to devices that check their callers' certificates). A certificate carries no extended key use,
so each serves as a server's and as a client's: a device shows its own to the devices it asks.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CERTIFICATE_DAYS = 365
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
HOSTS_MAX = 64  # addresses one certificate names
CLOCK_SKEW_S = 300  # a certificate is valid from a little before it was made


@dataclass(frozen=True)
class Issued:
    """A key and its certificate, as PEM."""

    key_pem: bytes
    cert_pem: bytes


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(seconds=CLOCK_SKEW_S), now + datetime.timedelta(days=days)


def new_authority(days: int = CERTIFICATE_DAYS) -> Issued:
    """A new CA: its key (which never leaves the admin's machine) and its certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quarry cluster CA")])
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def issue(
    authority: Issued, name: str, hosts: tuple[str, ...], days: int = CERTIFICATE_DAYS
) -> Issued:
    """A new key and a certificate for ``name`` at ``hosts`` (IP addresses or DNS names),
    signed by ``authority``."""
    if not hosts:
        raise ValueError("a certificate names at least one address")
    if len(hosts) > HOSTS_MAX:
        raise ValueError(f"a certificate names at most {HOSTS_MAX} addresses")
    ca_key = serialization.load_pem_private_key(authority.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "the CA's key is EC P-256"
    ca_cert = x509.load_pem_x509_certificate(authority.cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def _names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def days_left(cert_pem: bytes) -> float:
    """How long a certificate has to run, in days (negative once expired)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left.total_seconds() / 86_400


def hosts_of(cert_pem: bytes) -> tuple[str, ...]:
    """The addresses a certificate names."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return tuple(str(n.value) for n in names)


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether the CA of ``ca_pem`` signed the certificate of ``cert_pem``."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
