"""A device's own calls to another device: only to ask an ingest's decider for its outcome.

Devices keep no list of each other; an ingest's record names its decider and where every
participant listens, so a device that missed an ingest's outcome can ask (the coordinator may be
gone). Bounded in time: an unreachable decider is asked again later.
"""

from __future__ import annotations

from pyarrow import flight

from quarry.auth.middleware import bearer
from quarry.protocol.ingest import Outcome, OutcomeReply, OutcomeRequest

ASK_TIMEOUT_S = 5.0


def ask_outcome(
    address: str,
    ingest_id: str,
    token: str | None = None,
    root_ca: bytes | None = None,
    timeout_s: float = ASK_TIMEOUT_S,
) -> Outcome | None:
    """The decider's word on an ingest, or None when it does not answer. ``token``: the
    device's own (role ``device``); ``root_ca``: the cluster's CA, over TLS."""
    request = OutcomeRequest(ingest_id)
    headers = bearer(token) if token else []
    options = flight.FlightCallOptions(timeout=timeout_s, headers=headers)
    try:
        with flight.FlightClient(address, tls_root_certs=root_ca) as client:
            (result,) = list(
                client.do_action(flight.Action(request.KIND, request.encode()), options)
            )
    except (flight.FlightError, OSError, ValueError):
        return None
    return OutcomeReply.from_bytes(result.body.to_pybytes()).outcome
