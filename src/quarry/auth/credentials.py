"""The cluster's authority: made by ``quarry init`` (or ``quarry up``) on the admin's machine,
readable by the owner only, and never copied to a storage host.

    credentials/ca.pem        the cluster's certificate authority (everyone checks with it)
    credentials/ca.key        its key: signs each device's certificate at enrollment
    credentials/signing.key   the Ed25519 key that signs tokens and revocation lists
    credentials/verify.pem    its public key: what devices check tokens with
    credentials/admin.token   a token with the admin role, for the cluster's owner
    credentials/host.pem      this machine's certificate (loopback and the hosts given): the
    credentials/host.key      Flight SQL endpoint serves with it, coordinators show it
    credentials/revoked.json  the signed revocation list (``quarry token revoke``)

A device gets its own folder instead (``quarry.auth.enrollment``): its own key and
certificate, the CA's certificate, the public key and a credential of its own, nothing that
signs. Keys are made with ``cryptography``; nothing here is hand-written crypto.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from quarry import settings
from quarry.auth import certificates
from quarry.auth.certificates import LOOPBACK_HOSTS, Issued
from quarry.auth.revocation import sign, with_revoked
from quarry.auth.tokens import TOKEN_TTL_S_DEFAULT, Role, mint, new_signing_key, verify
from quarry.errors import ClusterError, ProtocolError, Unauthenticated
from quarry.protocol.control import RevocationList, RevokedToken

log = logging.getLogger("quarry.auth")
FOLDER = "credentials"
HOST_NAME = "quarry host"  # the common name of the admin machine's certificate
# What an older quarry's folder held (one HMAC secret, one certificate every device shared).
OLDER_FILES = ("secret", "device.pem", "device.key", "admin.token", "ca.pem", "ca.key")


def older_message(folder: Path) -> str:
    return (
        f"{folder} holds credentials made by an older quarry (one HMAC secret that every device "
        "shared), which this version no longer reads: on one machine re-run `quarry up`, which "
        "makes new ones; across machines run `quarry init` on the admin's machine and `quarry "
        "device enroll` for each device (docs/deploy.md)"
    )


def is_older(folder: Path) -> bool:
    """Whether ``folder`` is an older quarry's credentials (an HMAC secret, no signing key)."""
    return (folder / "secret").exists() and not (folder / "signing.key").exists()


@dataclass(frozen=True)
class Credentials:
    """The admin's folder: the cluster's authority."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.folder / "ca.key"

    @property
    def signing_key_file(self) -> Path:
        return self.folder / "signing.key"

    @property
    def verify_key_file(self) -> Path:
        return self.folder / "verify.pem"

    @property
    def admin_token_file(self) -> Path:
        return self.folder / "admin.token"

    @property
    def cert_file(self) -> Path:
        return self.folder / "host.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "host.key"

    @property
    def revoked_file(self) -> Path:
        return self.folder / "revoked.json"

    def signing_key(self) -> Ed25519PrivateKey:
        if is_older(self.folder):
            raise ClusterError(older_message(self.folder))
        key = serialization.load_pem_private_key(read_private(self.signing_key_file), None)
        assert isinstance(key, Ed25519PrivateKey), f"{self.signing_key_file} is an Ed25519 key"
        return key

    def verify_key(self) -> Ed25519PublicKey:
        return load_verify_key(self.verify_key_file, self.folder)

    def authority(self) -> Issued:
        """The CA's key and certificate (enrollment signs with them)."""
        return Issued(read_private(self.ca_key_file), read_private(self.ca_file))

    def admin_token(self) -> str:
        return read_private(self.admin_token_file).decode().strip()

    def token(self, role: Role, ttl_s: float = TOKEN_TTL_S_DEFAULT, subject: str = "") -> str:
        """A new token for ``role`` (``quarry token create``), valid ``ttl_s``."""
        return mint(self.signing_key(), role, ttl_s, subject)

    def host_identity(self) -> tuple[bytes, bytes] | None:
        """This machine's certificate and key, which a coordinator here shows the devices
        that check their callers' certificates (None in a folder that has none)."""
        if not self.cert_file.exists():
            return None
        return read_private(self.cert_file), read_private(self.key_file)

    def revocations(self) -> RevocationList:
        try:
            return RevocationList.from_json(json.loads(read_private(self.revoked_file)))
        except (ValueError, ProtocolError) as error:
            raise ClusterError(f"cannot read {self.revoked_file}: {error}") from None

    def revoke(self, entries: tuple[RevokedToken, ...]) -> RevocationList:
        """The next version of the revocation list, with ``entries`` added, signed and
        written; the devices learn it when it is pushed (``quarry token revoke``)."""
        current = self.revocations()
        signed = sign(self.signing_key(), current.version + 1, with_revoked(current, entries))
        write_private(self.revoked_file, json.dumps(signed.to_json()).encode())
        return signed


def load_verify_key(path: Path, folder: Path) -> Ed25519PublicKey:
    """The public key tokens are checked with, from ``path`` (of ``folder``)."""
    if is_older(folder):
        raise ClusterError(older_message(folder))
    key = serialization.load_pem_public_key(read_private(path))
    if not isinstance(key, Ed25519PublicKey):
        raise ClusterError(f"{path} is not an Ed25519 public key: enroll again")
    return key


def write_private(path: Path, data: bytes) -> None:
    """Written so that only the owner can ever read it (created 0600, never wider), whole or
    not at all: a new file beside it, then renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def read_private(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ClusterError(f"cannot read the cluster's credentials at {path}: {error}") from None


def private_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def init(
    folder: str | Path, hosts: tuple[str, ...] = (), admin_ttl_s: float | None = None
) -> Credentials:
    """The cluster's authority in ``folder``: made if it is not there, kept if it is (its
    admin token renewed once half its life has gone, its host certificate reissued if it
    lacks one of ``hosts``). An older quarry's folder is replaced, with a log line."""
    credentials = Credentials(Path(folder))
    ttl_s = settings.ADMIN_TOKEN_TTL_S.get() if admin_ttl_s is None else admin_ttl_s
    if is_older(credentials.folder):
        log.warning("replacing an older quarry's credentials in %s", credentials.folder)
        for name in OLDER_FILES:
            (credentials.folder / name).unlink(missing_ok=True)
    if not credentials.signing_key_file.exists():
        _make(credentials, hosts)
    elif not set(hosts) <= set(certificates.hosts_of(read_private(credentials.cert_file))):
        _write_host(credentials, hosts)
    _renew_admin_token(credentials, ttl_s)
    return credentials


def create(root: Path, hosts: tuple[str, ...] = ()) -> Credentials:
    """The authority of a cluster whose data is under ``root`` (``quarry up``)."""
    return init(Path(root) / FOLDER, hosts)


def _make(credentials: Credentials, hosts: tuple[str, ...]) -> None:
    private_folder(credentials.folder)
    authority = certificates.new_authority()
    write_private(credentials.ca_key_file, authority.key_pem)
    write_private(credentials.ca_file, authority.cert_pem)
    key = new_signing_key()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_private(credentials.verify_key_file, public)
    write_private(credentials.revoked_file, json.dumps(sign(key, 1, ()).to_json()).encode())
    _write_host(credentials, hosts)
    write_private(credentials.signing_key_file, pem)  # last: its presence means "made"


def _write_host(credentials: Credentials, hosts: tuple[str, ...]) -> None:
    issued = certificates.issue(credentials.authority(), HOST_NAME, (*LOOPBACK_HOSTS, *hosts))
    write_private(credentials.key_file, issued.key_pem)
    write_private(credentials.cert_file, issued.cert_pem)


def _renew_admin_token(credentials: Credentials, ttl_s: float) -> None:
    """A new admin token unless the one there is this cluster's with over half its life
    left: ``quarry up`` and ``quarry init`` keep the admin's own token from running out."""
    if credentials.admin_token_file.exists():
        try:
            claims = verify(credentials.verify_key(), credentials.admin_token())
            if claims.expires_at - time.time() > (claims.expires_at - claims.issued_at) / 2:
                return
        except Unauthenticated:
            pass
    token = mint(credentials.signing_key(), Role.ADMIN, ttl_s, subject="admin")
    write_private(credentials.admin_token_file, token.encode())
