"""Tokens: a role, an id, a subject and an expiry, signed with the cluster's Ed25519 key.

    <base64url of {"role", "id", "sub", "iat", "exp"}>.<base64url of its Ed25519 signature>

Only the admin's machine holds the signing key (``quarry init``). Devices, storage servers and
the Flight SQL endpoint hold the public key: they check a token's signature, its expiry and the
cluster's revocation list (``quarry.auth.revocation``), so nothing a device holds can mint one.
Roles are ordered for the users of a cluster: a ``writer`` may do what a ``reader`` may, an
``admin`` anything. ``device`` stands apart: the role of a device's own credential (its
subject names the device), which may only ask another device what devices ask each other.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from quarry.errors import Unauthenticated

TOKEN_CHARS_MAX = 4096
ID_CHARS = 32  # uuid4's hex
TOKEN_TTL_S_DEFAULT = 86_400.0  # a day: a leaked token is of use for a day at most
# The longest a token may live (a device's credential lives as long as its certificate, a
# year); a revocation of a token whose expiry is not known is kept this long.
TOKEN_TTL_S_MAX = 400 * 86_400.0
SUBJECT_CHARS_MAX = 256
# what an HMAC-SHA256 signature of an older quarry's token is: 32 bytes
_OLDER_SIGNATURE_BYTES = 32
OLDER = (
    "this token was signed with the shared secret of an older quarry, which devices no longer "
    "accept: re-run `quarry up` (one machine) or `quarry init` (docs/deploy.md), then hand out "
    "new tokens (quarry token create)"
)
ASK_ADMIN = "ask the cluster's admin for a new one (quarry token create)"


class Role(StrEnum):
    READER = "reader"  # scan, sql, gene statistics, describe
    WRITER = "writer"  # ingest, drop, commit
    ADMIN = "admin"  # load, calibrate, repair, raw key-values, running programs, revocations
    DEVICE = "device"  # a device's own credential: what devices ask each other, nothing else

    def allows(self, needed: Role) -> bool:
        if self is Role.ADMIN:
            return True
        if Role.DEVICE in (self, needed):  # a device's credential reads and writes nothing
            return self is needed
        return _USER_RANKS[self] >= _USER_RANKS[needed]


_USER_RANKS = {Role.READER: 0, Role.WRITER: 1, Role.ADMIN: 2}


@dataclass(frozen=True)
class Claims:
    role: Role
    id: str
    issued_at: float
    expires_at: float
    subject: str = ""  # whom it was issued to ("" for a user's; a device's name for its own)


def new_signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint(
    key: Ed25519PrivateKey,
    role: Role,
    ttl_s: float = TOKEN_TTL_S_DEFAULT,
    subject: str = "",
    now: float | None = None,
) -> str:
    """A new token for ``role``, valid ``ttl_s`` from now. Its id lets it be revoked."""
    if not 0 < ttl_s <= TOKEN_TTL_S_MAX:
        raise ValueError(f"a token lives more than 0 s and at most {TOKEN_TTL_S_MAX:.0f} s")
    assert len(subject) <= SUBJECT_CHARS_MAX, "a token's subject is a name"
    issued = time.time() if now is None else now
    claims = {
        "role": Role(role).value,
        "id": uuid.uuid4().hex,
        "sub": subject,
        "iat": round(issued, 3),
        "exp": round(issued + ttl_s, 3),
    }
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{body}.{_b64(key.sign(body.encode()))}"


def when(at: float) -> str:
    """A moment as people read it in an error."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def read_claims(token: str) -> Claims:
    """A token's claims, its signature NOT checked (``quarry token revoke --file``, which checks
    it itself); ``Unauthenticated`` if it is not a token of this quarry."""
    token = token.strip()
    if not token or len(token) > TOKEN_CHARS_MAX or token.count(".") != 1:
        raise Unauthenticated("not a quarry token: ask the cluster's admin (quarry token create)")
    body, _ = token.split(".")
    try:
        claims = json.loads(_unb64(body))
        if "exp" not in claims and "issued_at" in claims:
            raise Unauthenticated(OLDER)
        return Claims(
            Role(claims["role"]),
            _bounded(str(claims["id"]), ID_CHARS * 2),
            float(claims["iat"]),
            float(claims["exp"]),
            _bounded(str(claims.get("sub", "")), SUBJECT_CHARS_MAX),
        )
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise Unauthenticated("this token's claims do not read") from None


def _bounded(text: str, chars_max: int) -> str:
    if len(text) > chars_max:
        raise ValueError("too long")
    return text


def verify(
    public_key: Ed25519PublicKey,
    token: str,
    revoked: frozenset[str] = frozenset(),
    now: float | None = None,
) -> Claims:
    """The token's claims once its signature, expiry and revocation are checked; otherwise
    ``Unauthenticated`` saying which of them failed (never which byte)."""
    if not token or len(token) > TOKEN_CHARS_MAX or token.count(".") != 1:
        raise Unauthenticated("not a quarry token: ask the cluster's admin (quarry token create)")
    body, signature = token.split(".")
    try:
        public_key.verify(_unb64(signature), body.encode())
    except (InvalidSignature, ValueError, binascii.Error):
        if _older(body, signature):
            raise Unauthenticated(OLDER) from None
        raise Unauthenticated(
            "this token was not issued for this cluster (bad signature)"
        ) from None
    return still_good(read_claims(token), revoked, now)


def still_good(
    claims: Claims, revoked: frozenset[str] = frozenset(), now: float | None = None
) -> Claims:
    """``claims`` of a token whose signature was checked, once its expiry and revocation are:
    ``Unauthenticated`` saying which failed."""
    now = time.time() if now is None else now
    if claims.expires_at <= now:
        raise Unauthenticated(
            f"this {claims.role} token expired at {when(claims.expires_at)} "
            f"({now - claims.expires_at:,.0f} s ago): {ASK_ADMIN}"
        )
    if claims.id in revoked:
        raise Unauthenticated(f"this {claims.role} token (id {claims.id}) was revoked: {ASK_ADMIN}")
    return claims


def _older(body: str, signature: str) -> bool:
    """Whether a token is an older quarry's: HMAC-signed, with no expiry."""
    try:
        claims = json.loads(_unb64(body))
        return (
            len(_unb64(signature)) == _OLDER_SIGNATURE_BYTES
            and isinstance(claims, dict)
            and "issued_at" in claims
            and "exp" not in claims
        )
    except (ValueError, binascii.Error):
        return False
