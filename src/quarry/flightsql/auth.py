"""Who calls the endpoint: a quarry token on every call, as a bearer or as a basic password.

Flight SQL clients authenticate in one of two ways, and both carry the same quarry token
(``quarry token create``):

- ``Authorization: Bearer <token>`` on every call (ADBC's ``adbc.flight.sql.authorization_
  header``, JDBC's ``token=``);
- a username and password (ADBC's ``username``/``password``, DBeaver's login fields): the client
  sends ``Authorization: Basic base64(user:password)`` in a Flight ``Handshake`` and keeps the
  bearer header the server answers with. The password is the token; the username is not
  checked (call it ``token``), since a token already says who it is and what it may do.

With the cluster's public key (a cluster file of the admin's names its authority) a token's
signature and expiry are checked here, and the revocation list as the endpoint started, before
the call is decoded; either way every query then runs with that token against the devices
(``sessions``), which check it again, against the list they hold, and enforce its role.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from pyarrow import flight

from quarry.auth.revocation import Verifier
from quarry.auth.tokens import TOKEN_CHARS_MAX, Role
from quarry.errors import Unauthenticated

HEADER = "authorization"
NAME = "quarry-flight-sql-caller"
NEEDED = Role.READER  # every call of a read-only endpoint reads
HOW = (
    "send 'Authorization: Bearer <token>' (a token from `quarry token create --role reader`), "
    "or log in with the token as the password"
)


class Caller(flight.ServerMiddleware):
    """The token a call carries. A handshake answers with it as a bearer header, which is how
    a client that logged in with a password learns what to send next."""

    def __init__(self, token: str, answer_bearer: bool):
        self.token = token
        self.owner = hashlib.sha256(token.encode()).hexdigest()[:32]  # names it in logs, keys
        self._answer_bearer = answer_bearer

    def sending_headers(self) -> dict[str, str]:
        return {HEADER: f"Bearer {self.token}"} if self._answer_bearer else {}


class TokenGate(flight.ServerMiddlewareFactory):
    """Refuses a call without a token (or, given the cluster's public key, with a token of
    another cluster, expired, revoked, or of a role that may not read) before the call's body
    is decoded."""

    def __init__(self, verifier: Verifier | None):
        self.verifier = verifier

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> Caller:
        values = headers.get(HEADER) or []
        if not values:
            raise flight.FlightUnauthenticatedError(f"this call carries no token: {HOW}")
        token = token_of(values[0])
        if self.verifier is not None:
            try:
                role = self.verifier.check(token).role
            except Unauthenticated as error:
                raise flight.FlightUnauthenticatedError(str(error)) from None
            if not role.allows(NEEDED):
                raise flight.FlightUnauthorizedError(
                    f"a {role} token may not query: it needs the {NEEDED} role"
                )
        return Caller(token, info.method == flight.FlightMethod.HANDSHAKE)


def token_of(header: str) -> str:
    """The token of an ``Authorization`` header, bearer or basic (the password)."""
    scheme, _, credentials = header.strip().partition(" ")
    credentials = credentials.strip()
    if not credentials or len(credentials) > 2 * TOKEN_CHARS_MAX:
        raise flight.FlightUnauthenticatedError(f"the authorization header is empty: {HOW}")
    if scheme.lower() == "bearer":
        return credentials
    if scheme.lower() == "basic":
        try:  # some clients leave out base64's padding
            text = base64.b64decode(credentials + "=" * (-len(credentials) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise flight.FlightUnauthenticatedError("the basic credentials do not decode") from None
        _user, colon, password = text.partition(":")
        if not colon or not password:
            raise flight.FlightUnauthenticatedError(f"no password in the basic credentials: {HOW}")
        return password
    raise flight.FlightUnauthenticatedError(f"unknown authorization scheme {scheme!r}: {HOW}")


class HeaderHandshake(flight.ServerAuthHandler):
    """Answers a ``Handshake`` (a client logging in with a password) so that the middleware can
    hand back the bearer header; the check itself is the middleware's, on every call."""

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader):
        return None  # the credentials came in the call's header, which the gate has checked

    def is_valid(self, token: bytes) -> bytes:
        return b""  # Flight's own token is unused: the bearer header is checked by the gate


def caller(context: flight.ServerCallContext) -> Caller:
    found = context.get_middleware(NAME)
    assert found is not None, "every call passes the token gate"
    return found
