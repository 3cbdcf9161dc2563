"""Tokens: a role, signed with the cluster's secret (HMAC-SHA256), checked by every device.

    <base64url of {"role": ..., "id": ..., "issued_at": ...}>.<base64url of its HMAC>

A device holds the cluster's secret and checks the signature in constant time; it keeps no
list of tokens. Roles are ordered: a ``writer`` may do what a ``reader`` may, an ``admin``
anything. ``device`` is the role devices give themselves to ask each other about an ingest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

from quarry.errors import Unauthenticated

SECRET_BYTES = 32
TOKEN_CHARS_MAX = 4096


class Role(StrEnum):
    READER = "reader"  # scan, sql, gene statistics, describe
    WRITER = "writer"  # ingest, drop, commit
    ADMIN = "admin"  # load, calibrate, repair, raw key-values, running programs
    DEVICE = "device"  # devices asking each other (an ingest's outcome)

    @property
    def rank(self) -> int:
        return {"reader": 0, "writer": 1, "device": 1, "admin": 2}[self.value]

    def allows(self, needed: Role) -> bool:
        if needed is Role.DEVICE:
            return self in (Role.DEVICE, Role.ADMIN)
        return self.rank >= needed.rank


@dataclass(frozen=True)
class Claims:
    role: Role
    id: str
    issued_at: float


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, body: str) -> str:
    return _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())


def mint(secret: bytes, role: Role) -> str:
    """A new token for ``role`` (its id lets a log tell tokens apart)."""
    claims = {"role": Role(role).value, "id": uuid.uuid4().hex, "issued_at": time.time()}
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{body}.{_sign(secret, body)}"


def verify(secret: bytes, token: str) -> Claims:
    """The token's claims, or ``Unauthenticated`` saying what is wrong (never which byte)."""
    if not token or len(token) > TOKEN_CHARS_MAX or token.count(".") != 1:
        raise Unauthenticated("not a quarry token: ask the cluster's admin (quarry token create)")
    body, signature = token.split(".")
    if not hmac.compare_digest(signature, _sign(secret, body)):
        raise Unauthenticated("this token was not issued for this cluster (bad signature)")
    try:
        claims = json.loads(_unb64(body))
        return Claims(Role(claims["role"]), str(claims["id"]), float(claims["issued_at"]))
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise Unauthenticated("this token's claims do not read") from None
