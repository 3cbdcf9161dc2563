"""A device's own credentials folder, issued by the admin's machine and copied to its host.

    <folder>/ca.pem         the cluster's CA certificate: whom to trust
    <folder>/device.pem     this device's certificate (its name; its addresses as SANs)
    <folder>/device.key     its key: the only private key in the folder
    <folder>/verify.pem     the public key that checks tokens (it cannot sign one)
    <folder>/device.token   this device's credential: a token of role ``device`` naming it,
                            which it shows the devices it asks (an ingest's outcome, a newer
                            revocation list), and which may do nothing else
    <folder>/labels.json    its name and failure-domain labels (host, rack)
    <folder>/revoked.json   the cluster's revocation list as of its enrollment

``quarry device enroll NAME --host ADDR --output DIR`` makes one; ``quarry up`` makes one per
local device under its data folder. Nothing in it signs: whoever takes a storage host can
neither mint a token nor issue a certificate (docs/security.md).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from quarry.auth import certificates
from quarry.auth.credentials import (
    Credentials,
    is_older,
    load_verify_key,
    older_message,
    private_folder,
    read_private,
    write_private,
)
from quarry.auth.revocation import Revocations, Verifier
from quarry.auth.tokens import TOKEN_TTL_S_MAX, Role, mint, verify
from quarry.errors import ClusterError, ProtocolError, Unauthenticated
from quarry.protocol.control import NAME_CHARS_MAX, RevocationList
from quarry.protocol.message import Message, bounded

DEVICE_TOKEN_TTL_S = certificates.CERTIFICATE_DAYS * 86_400.0  # as long as its certificate
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Files only the authority holds: a folder with one of them is never a device's.
AUTHORITY_FILES = ("ca.key", "signing.key", "secret")
# A folder ``quarry up`` keeps is enrolled again when its certificate has fewer days left.
RENEW_DAYS = 30


@dataclass(frozen=True)
class DeviceLabels(Message):
    """Who a device is, from its enrollment: its name, and the failure domains it sits in
    (the host it runs on, its rack), which it reports in its hello."""

    name: str = bounded(chars_max=NAME_CHARS_MAX)
    host: str = bounded(chars_max=NAME_CHARS_MAX, default="")
    rack: str = bounded(chars_max=NAME_CHARS_MAX, default="")


@dataclass(frozen=True)
class DeviceFolder:
    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.folder / "device.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "device.key"

    @property
    def verify_key_file(self) -> Path:
        return self.folder / "verify.pem"

    @property
    def token_file(self) -> Path:
        return self.folder / "device.token"

    @property
    def labels_file(self) -> Path:
        return self.folder / "labels.json"

    @property
    def revoked_file(self) -> Path:
        return self.folder / "revoked.json"

    def check(self) -> None:
        """A clear error unless this is an enrolled device's folder (and only that)."""
        if is_older(self.folder):
            raise ClusterError(older_message(self.folder))
        found = [name for name in AUTHORITY_FILES if (self.folder / name).exists()]
        if found:
            raise ClusterError(
                f"{self.folder} holds the cluster's authority ({', '.join(found)}): a device "
                "must never hold it. Enroll the device on the admin's machine (quarry device "
                "enroll NAME --host ADDR --output DIR) and give it that folder"
            )
        if not self.token_file.exists() or not self.labels_file.exists():
            raise ClusterError(
                f"{self.folder} is not an enrolled device's folder (no device.token or "
                "labels.json): make one with quarry device enroll NAME --host ADDR --output DIR"
            )

    def labels(self) -> DeviceLabels:
        try:
            return DeviceLabels.from_json(json.loads(read_private(self.labels_file)))
        except (ValueError, ProtocolError) as error:
            raise ClusterError(f"cannot read {self.labels_file}: {error}") from None

    def token(self) -> str:
        return read_private(self.token_file).decode().strip()

    def identity(self) -> tuple[bytes, bytes]:
        """Its certificate and key."""
        return read_private(self.cert_file), read_private(self.key_file)

    def revocations(self) -> RevocationList | None:
        if not self.revoked_file.exists():
            return None
        try:
            return RevocationList.from_json(json.loads(read_private(self.revoked_file)))
        except (ValueError, ProtocolError) as error:
            raise ClusterError(f"cannot read {self.revoked_file}: {error}") from None

    def verifier(self, held_file: Path | None) -> Verifier:
        """What a server started from this folder checks tokens with: the public key, and the
        revocation list (the newer of the enrolled one and what it took since, in
        ``held_file``)."""
        key = load_verify_key(self.verify_key_file, self.folder)
        return Verifier(key, Revocations(key, held_file, self.revocations()))


def enroll(
    authority: Credentials,
    name: str,
    hosts: tuple[str, ...],
    output: str | Path,
    rack: str = "",
    host_label: str | None = None,
    ttl_s: float = DEVICE_TOKEN_TTL_S,
) -> DeviceFolder:
    """Issue device ``name``'s folder in ``output``: its own key and certificate for
    ``hosts``, the CA certificate, the public key, its credential and its labels (its host
    label is ``host_label``, else its first address)."""
    if not NAME_PATTERN.fullmatch(name):
        raise ClusterError(
            f"device name {name!r}: use letters, digits, '.', '_' or '-' (at most 128), "
            "starting with a letter or digit"
        )
    if not hosts:
        raise ClusterError(f"give device {name} the addresses it is reached at (--host ADDR)")
    if not 0 < ttl_s <= TOKEN_TTL_S_MAX:
        raise ClusterError(f"--ttl must be more than 0 and at most {TOKEN_TTL_S_MAX:.0f} s")
    device = DeviceFolder(Path(output))
    if device.folder.resolve() == authority.folder.resolve() or any(
        (device.folder / n).exists() for n in AUTHORITY_FILES
    ):
        raise ClusterError(
            f"{device.folder} holds the cluster's authority: enroll into another folder"
        )
    issued = certificates.issue(authority.authority(), name, hosts)
    labels = DeviceLabels(name, hosts[0] if host_label is None else host_label, rack)
    private_folder(device.folder)
    write_private(device.ca_file, read_private(authority.ca_file))
    write_private(device.key_file, issued.key_pem)
    write_private(device.cert_file, issued.cert_pem)
    write_private(device.verify_key_file, read_private(authority.verify_key_file))
    write_private(device.revoked_file, read_private(authority.revoked_file))
    write_private(device.labels_file, json.dumps(labels.to_json()).encode())
    token = mint(authority.signing_key(), Role.DEVICE, ttl_s, subject=name)
    write_private(device.token_file, token.encode())
    return device


def ensure_enrolled(
    authority: Credentials, name: str, hosts: tuple[str, ...], output: Path
) -> DeviceFolder:
    """``output`` as it is if it is ``name``'s, from this authority, for ``hosts``, and far
    from expiring; enrolled anew otherwise (``quarry up``: each start checks, few issue)."""
    device = DeviceFolder(output)
    try:
        device.check()
        cert = read_private(device.cert_file)
        fresh = (
            device.labels().name == name
            and read_private(device.ca_file) == read_private(authority.ca_file)
            and read_private(device.verify_key_file) == read_private(authority.verify_key_file)
            and set(hosts) <= set(certificates.hosts_of(cert))
            and certificates.days_left(cert) > RENEW_DAYS
            and verify(authority.verify_key(), device.token()).expires_at
            > time.time() + RENEW_DAYS * 86_400
        )
    except (ClusterError, Unauthenticated, ValueError):
        fresh = False
    return device if fresh else enroll(authority, name, hosts, output, host_label="")
