"""Revoked tokens: a list the cluster's authority signs, which every server holds and checks.

``quarry token revoke`` adds a token to the list in the admin's folder, signs a new version
and pushes it to every device (``revoke``, admin role). A device takes a list only when the key
it checks tokens with verifies the signature and the version is newer than its own, keeps it in
its data folder (so a restart does not forget it), and asks the peers the push named for a
newer one every ``QUARRY_REVOCATION_SYNC_S`` (``quarry.device.revocation_sync``). So a device
that was down or cut off when the admin revoked learns it from any peer within that period once
it reaches one; a coordinator of the admin's that finds a device behind (its hello says the
version it holds) pushes the list too. A token stops working at its own expiry in any case.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from quarry.auth.tokens import TOKEN_TTL_S_MAX, Claims, still_good, verify
from quarry.errors import ProtocolError, Unauthenticated
from quarry.protocol.control import (
    PEERS_MAX,
    REVOKED_MAX,
    RevocationList,
    RevocationPush,
    RevokedToken,
)

log = logging.getLogger("quarry.auth")
HELD_FILE = "revocations.json"  # in a server's data folder: the newest push it took


def sign(key: Ed25519PrivateKey, version: int, revoked: tuple[RevokedToken, ...]) -> RevocationList:
    """A revocation list of ``version``, signed by the authority's key."""
    if len(revoked) > REVOKED_MAX:
        raise Unauthenticated(
            f"more than {REVOKED_MAX} revoked tokens that have not expired: wait for some to "
            "expire, or start a new cluster authority (quarry init)"
        )
    unsigned = RevocationList(version, round(time.time(), 3), revoked)
    signature = key.sign(unsigned.signed_bytes())
    text = base64.urlsafe_b64encode(signature).decode().rstrip("=")
    return RevocationList(unsigned.version, unsigned.issued_at, unsigned.revoked, text)


def checked(revocations: RevocationList, public_key: Ed25519PublicKey) -> RevocationList:
    """The list, once its signature is the cluster's; ``Unauthenticated`` otherwise."""
    text = revocations.signature
    try:
        signature = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        public_key.verify(signature, revocations.signed_bytes())
    except (InvalidSignature, ValueError, binascii.Error):
        raise Unauthenticated(
            f"revocation list version {revocations.version} was not signed by this cluster's "
            "authority: refused"
        ) from None
    return revocations


def with_revoked(
    current: RevocationList, entries: tuple[RevokedToken, ...], now: float | None = None
) -> tuple[RevokedToken, ...]:
    """``current``'s entries and ``entries``, each id once, less those expired (a device
    refuses an expired token anyway): the list stays as short as it can be."""
    now = time.time() if now is None else now
    kept: dict[str, RevokedToken] = {}
    for entry in (*current.revoked, *entries):
        if entry.expires_at > now:
            known = kept.get(entry.id)
            if known is None or known.expires_at < entry.expires_at:
                kept[entry.id] = entry
    return tuple(sorted(kept.values(), key=lambda e: (e.expires_at, e.id)))


def unknown_expiry(now: float | None = None) -> float:
    """The expiry to keep a revocation of a token whose own is not known: the longest any
    token lives."""
    return (time.time() if now is None else now) + TOKEN_TTL_S_MAX


class Revocations:
    """The newest signed list a server holds, and the peers it asks for a newer one.

    Read by every call's token check (``ids``), replaced whole by a push or a peer's answer
    (``take``), kept in ``file`` so a restart starts from it. Thread-safe."""

    def __init__(
        self,
        public_key: Ed25519PublicKey,
        file: Path | None = None,
        initial: RevocationList | None = None,
    ):
        self.public_key = public_key
        self.file = file
        self._lock = threading.Lock()
        self._held = RevocationList(0, 0.0)
        self._ids: frozenset[str] = frozenset()
        self._peers: tuple[str, ...] = ()
        if initial is not None:  # the list as of its enrollment
            self.take(initial, persist=False)
        if file is not None and file.exists():
            self._load(file)

    def _load(self, file: Path) -> None:
        """What it took before it stopped; a file that does not read (or is not signed by this
        cluster) is ignored with a log line: the enrolled list and its peers still hold."""
        try:
            push = RevocationPush.from_json(json.loads(file.read_text()))
            self.take(push.revocations, push.peers, persist=False)
        except (OSError, ValueError, ProtocolError, Unauthenticated) as error:
            log.warning("ignored %s: %s", file, error)

    @property
    def version(self) -> int:
        return self._held.version

    @property
    def held(self) -> RevocationList:
        return self._held

    @property
    def peers(self) -> tuple[str, ...]:
        return self._peers

    def ids(self) -> frozenset[str]:
        return self._ids

    def take(
        self,
        revocations: RevocationList,
        peers: tuple[str, ...] | None = None,
        persist: bool = True,
    ) -> bool:
        """Hold ``revocations`` if it is the cluster's and newer than the one held (and
        ``peers``, when given); whether anything changed."""
        checked(revocations, self.public_key)
        if peers is not None and len(peers) > PEERS_MAX:
            raise ProtocolError(f"more than {PEERS_MAX} peers")
        with self._lock:
            newer = revocations.version > self._held.version
            moved = peers is not None and tuple(peers) != self._peers
            if not newer and not moved:
                return False
            if newer:
                self._held = revocations
                self._ids = revocations.ids()
            if moved:
                self._peers = tuple(peers or ())
            if persist and self.file is not None:
                _write(self.file, RevocationPush(self._held, self._peers))
        if newer:
            log.info("revocation list version %d: %d revoked", revocations.version, len(self._ids))
        return True


def _write(path: Path, push: RevocationPush) -> None:
    """Atomically: a reader sees the old list or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(descriptor, "w") as file:
        json.dump(push.to_json(), file)
    os.replace(temporary, path)


class Verifier:
    """What a server checks every call's token with: the cluster's public key, and the
    revocation list it holds (none: only signature and expiry).

    A coordinator sends the same token with every call, and checking its Ed25519 signature
    was a tenth of a device's CPU for a small request (with the parsing of its claims, about
    0.2 ms a call, every request and pulse). So the claims of a token whose signature checked
    are kept, by the token's exact text, for ``VERIFIED_KEPT_MAX`` tokens: a call with the
    same text is the same signed claims. Expiry and revocation are checked on every call,
    kept or not: a token refused at its first check is not kept, and a kept one that expires or
    is revoked is refused as any other."""

    VERIFIED_KEPT_MAX = 1024

    def __init__(self, public_key: Ed25519PublicKey, revocations: Revocations | None = None):
        self.public_key = public_key
        self.revocations = revocations
        self._verified: dict[str, Claims] = {}  # oldest first
        self._lock = threading.Lock()

    def check(self, token: str) -> Claims:
        revoked = self.revocations.ids() if self.revocations is not None else frozenset()
        with self._lock:
            kept = self._verified.get(token)
        if kept is not None:
            return still_good(kept, revoked)
        claims = verify(self.public_key, token, revoked)
        with self._lock:
            if len(self._verified) >= self.VERIFIED_KEPT_MAX:
                del self._verified[next(iter(self._verified))]
            self._verified[token] = claims
        return claims
