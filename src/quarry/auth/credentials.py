"""A cluster's credentials, made by ``quarry up`` in its folder, readable by the owner only.

    credentials/secret      the key that signs tokens (devices check every call with it)
    credentials/admin.token a token with the admin role, for the cluster's owner
    credentials/ca.pem      the cluster's certificate authority (clients check devices with it)
    credentials/ca.key      its key (only to sign device certificates)
    credentials/device.pem  the devices' TLS certificate, for loopback and the given hosts
    credentials/device.key  its key

Keys are EC P-256, made with ``cryptography``; nothing here is hand-written crypto.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from quarry.auth.tokens import Role, mint, new_secret
from quarry.errors import ClusterError

FOLDER = "credentials"
CERTIFICATE_DAYS = 365
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Credentials:
    folder: Path

    @property
    def secret_file(self) -> Path:
        return self.folder / "secret"

    @property
    def admin_token_file(self) -> Path:
        return self.folder / "admin.token"

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.folder / "device.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "device.key"

    def secret(self) -> bytes:
        return read_private(self.secret_file)

    def admin_token(self) -> str:
        return read_private(self.admin_token_file).decode()

    def token(self, role: Role) -> str:
        """A new token for ``role`` (``quarry token create``)."""
        return mint(self.secret(), role)


def _write_private(path: Path, data: bytes) -> None:
    """Written so that only the owner can ever read it (created 0600, never wider)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def read_private(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ClusterError(f"cannot read the cluster's credentials at {path}: {error}") from None


def create(root: Path, hosts: tuple[str, ...] = ()) -> Credentials:
    """Make the credentials of a new cluster under ``root`` (kept if they exist)."""
    folder = Path(root) / FOLDER
    credentials = Credentials(folder)
    if credentials.secret_file.exists():
        return credentials
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    secret = new_secret()
    _write_private(credentials.secret_file, secret)
    _write_private(credentials.admin_token_file, mint(secret, Role.ADMIN).encode())
    ca_key, ca_cert = _authority()
    _write_private(folder / "ca.key", _key_pem(ca_key))
    _write_private(credentials.ca_file, ca_cert.public_bytes(serialization.Encoding.PEM))
    key, cert = _device_certificate(ca_key, ca_cert, (*LOOPBACK_HOSTS, *hosts))
    _write_private(credentials.key_file, _key_pem(key))
    _write_private(credentials.cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return credentials


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=CERTIFICATE_DAYS)


def _authority() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quarry cluster CA")])
    start, end = _validity()
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
    return key, cert


def _device_certificate(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, hosts: tuple[str, ...]
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    start, end = _validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quarry device")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert
