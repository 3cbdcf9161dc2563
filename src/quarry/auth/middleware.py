"""Every call to a device carries a token; the device checks it before anything runs.

A Flight server middleware reads the ``authorization: Bearer <token>`` header of each call and
checks the token's signature, expiry and revocation (``revocation.Verifier``, with the
cluster's public key); a call without a valid one is refused there,
before its body is even decoded. Each request kind needs a role (``REQUIRED``); the device
checks the caller's role against it (``authorize``) before it does the work, so a refused call
changes nothing.
"""

from __future__ import annotations

from pyarrow import flight

from quarry.auth.revocation import Verifier
from quarry.auth.tokens import Claims, Role
from quarry.errors import Forbidden, QuarryError, Unauthenticated
from quarry.protocol import frame
from quarry.protocol.frame import Action, Get, Put

HEADER = "authorization"
NAME = "quarry-auth"

# What each kind of call needs; work (an exchange) needs what its unit of work says.
REQUIRED: dict[str, Role] = {
    Action.HELLO: Role.READER,
    Action.INVENTORY: Role.READER,
    Action.DESCRIBE: Role.READER,
    Action.STATS: Role.READER,
    Action.STATUS_LOAD: Role.READER,
    Action.PULSE: Role.READER,
    Action.COMMIT: Role.WRITER,
    Action.ABORT: Role.WRITER,
    Action.DROP: Role.WRITER,
    Action.RENEW: Role.WRITER,
    Action.OUTCOME: Role.DEVICE,
    Action.REVOCATIONS: Role.DEVICE,
    Action.REVOKE: Role.ADMIN,
    Action.KV_GET: Role.ADMIN,
    Action.KV_PUT: Role.ADMIN,
    Action.KV_DELETE: Role.ADMIN,
    Action.KV_LIST: Role.ADMIN,
    Action.LOAD: Role.ADMIN,
    Action.CALIBRATE: Role.ADMIN,
    Action.INTEGRITY: Role.READER,
    Action.SCRUB: Role.ADMIN,  # it rewrites zone maps and catalog entries that disagree
    Action.SCRUBBED: Role.ADMIN,
    Action.REPAIR_META: Role.WRITER,
    Put.PARTITION: Role.WRITER,
    Put.UPDATE_SLICE: Role.WRITER,
    Put.REPAIR_SLICE: Role.WRITER,
    Get.SCAN: Role.READER,
    Get.SLICES: Role.READER,
    Get.CALIBRATION: Role.ADMIN,
    Get.HEARTBEAT: Role.READER,  # any caller may prove its link; it learns nothing by it
}


# A device's own published figures (its calibration) are read by every query's cost model.
PUBLIC_KEY_PREFIX = "~sys/"


def needed(kind: str, header: dict) -> Role:
    """The role a call needs, from its kind (and, for a key-value read, its key)."""
    if kind == Action.KV_GET and str(header.get("key", "")).startswith(PUBLIC_KEY_PREFIX):
        return Role.READER
    return REQUIRED.get(kind, Role.ADMIN)


def bearer(token: str) -> list[tuple[bytes, bytes]]:
    """The header a client sends with every call."""
    return [(HEADER.encode(), f"Bearer {token}".encode())]


class Authenticated(flight.ServerMiddleware):
    def __init__(self, claims: Claims):
        self.claims = claims


class TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call without a valid token of this cluster."""

    def __init__(self, verifier: Verifier):
        self.verifier = verifier

    def start_call(self, info: flight.CallInfo, headers: dict) -> Authenticated:
        values = headers.get(HEADER) or []
        if not values or not values[0].startswith("Bearer "):
            _refuse(Unauthenticated("this call carries no token: connect with the cluster file"))
        try:
            return Authenticated(self.verifier.check(values[0][len("Bearer ") :]))
        except Unauthenticated as error:
            _refuse(error)


def _refuse(error: QuarryError) -> None:
    raise flight.FlightUnauthenticatedError(frame.encode_error(error))


def authorize(context: flight.ServerCallContext, kind: str, needed: Role | None = None) -> None:
    """Raise ``Forbidden`` unless the caller's role allows this kind of call. A server started
    without credentials (``--insecure``) has no middleware and checks nothing."""
    middleware = context.get_middleware(NAME)
    if middleware is None:
        return
    needed = needed or REQUIRED.get(kind, Role.ADMIN)
    role = middleware.claims.role
    if not role.allows(needed):
        raise Forbidden(f"a {role} token may not {kind}: it needs the {needed} role")
