"""A server asks its peers for a newer revocation list: at its start, then every period.

So a device that was down, cut off or not yet started when the admin revoked a token learns
it without the admin: at most ``QUARRY_REVOCATION_SYNC_S`` (plus one call's timeout) after it
can reach one peer that holds the list. The peers are those the admin's last push named (kept
with the list in the data folder); a list is taken only if the cluster's key verifies it and it
is newer (``Revocations.take``). Peers are asked at most ``ASKED_AT_ONCE`` at a time, each
call bounded by ``ASK_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from quarry import settings
from quarry.auth.revocation import Revocations
from quarry.device.peers import ASK_TIMEOUT_S, PeerCredentials, ask_revocations
from quarry.errors import ProtocolError, Unauthenticated

log = logging.getLogger("quarry.device")
ASKED_AT_ONCE = 8


class RevocationSync:
    def __init__(self, revocations: Revocations, peer: PeerCredentials, name: str):
        self.revocations = revocations
        self.peer = peer
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"quarry-revocations-{name}", daemon=True
        )

    def start(self) -> RevocationSync:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period_s = settings.REVOCATION_SYNC_S.get()
        while not self._stop.is_set():
            try:
                self.round()
            except Exception:  # a bug here must not stop the checks for good: log, go on
                log.exception("%s: asking peers for revocations", self.name)
            self._stop.wait(period_s)

    def round(self) -> int:
        """Ask every peer once; the version held afterwards."""
        peers = self.revocations.peers
        if not peers:
            return self.revocations.version

        def ask(address: str) -> None:
            reply = ask_revocations(address, self.revocations.version, self.peer, ASK_TIMEOUT_S)
            if reply is None or reply.revocations is None:
                return
            try:
                if self.revocations.take(reply.revocations):
                    log.info("%s: revocation list %d from %s", self.name, reply.version, address)
            except (Unauthenticated, ProtocolError) as error:
                log.warning("%s: refused a revocation list from %s: %s", self.name, address, error)

        width = min(ASKED_AT_ONCE, len(peers))
        with ThreadPoolExecutor(width, f"quarry-revocations-{self.name}") as pool:
            list(pool.map(ask, peers))  # the round ends when every peer answered or timed out
        return self.revocations.version
