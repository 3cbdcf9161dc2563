"""A device's own calls to another device: an ingest's outcome, and a newer revocation list.

Devices keep no list of each other for data: an ingest's record names its decider and where
every participant listens, so a device that missed an ingest's outcome can ask (the coordinator
may be gone); the peers it asks for revocation lists are those the admin's last push named.
Every call carries the device's own credential (a token of role ``device`` naming it) and,
under TLS, shows the device's own certificate and checks the peer's against the cluster's CA
and the address it called: mutual TLS, each side with a certificate of its own. Bounded in
time: a peer that does not answer is asked again later.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyarrow import flight

from quarry.auth.middleware import bearer
from quarry.errors import ProtocolError
from quarry.protocol.control import RevocationsAsk, RevocationsReply
from quarry.protocol.ingest import Outcome, OutcomeReply, OutcomeRequest
from quarry.protocol.message import Message

ASK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class PeerCredentials:
    """What a device shows the devices it asks: its credential (None under ``--insecure``)
    and, under TLS, the CA it checks them with and its own certificate and key."""

    token: str | None = None
    root_ca: bytes | None = None
    identity: tuple[bytes, bytes] | None = None  # certificate, key (PEM)


def _ask(address: str, request: Message, peer: PeerCredentials, timeout_s: float) -> bytes | None:
    """One action's answer, or None when the peer does not answer (or refuses)."""
    headers = bearer(peer.token) if peer.token else []
    options = flight.FlightCallOptions(timeout=timeout_s, headers=headers)
    tls: dict = {}
    if peer.root_ca is not None:
        tls["tls_root_certs"] = peer.root_ca
        if peer.identity is not None:
            tls["cert_chain"], tls["private_key"] = peer.identity
    try:
        with flight.FlightClient(address, **tls) as client:
            (result,) = list(
                client.do_action(flight.Action(request.KIND, request.encode()), options)
            )
    except (flight.FlightError, OSError, ValueError):
        return None
    return result.body.to_pybytes()


def ask_outcome(
    address: str,
    ingest_id: str,
    peer: PeerCredentials = PeerCredentials(),
    timeout_s: float = ASK_TIMEOUT_S,
) -> Outcome | None:
    """The decider's word on an ingest, or None when it does not answer."""
    answer = _ask(address, OutcomeRequest(ingest_id), peer, timeout_s)
    return None if answer is None else OutcomeReply.from_bytes(answer).outcome


def ask_revocations(
    address: str, version: int, peer: PeerCredentials, timeout_s: float = ASK_TIMEOUT_S
) -> RevocationsReply | None:
    """A peer's revocation list if newer than ``version`` (else only its version), or None
    when it does not answer."""
    answer = _ask(address, RevocationsAsk(version), peer, timeout_s)
    if answer is None:
        return None
    try:
        return RevocationsReply.from_bytes(answer)
    except ProtocolError:
        return None
