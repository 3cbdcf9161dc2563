"""Where a query's work runs: the pushdown modes, declared once for every room and the CLI.

    never   the host reads raw slices and does everything: the baseline
    server  drives read and hand every slice back raw; whatever fronts them completes it (a
            storage server's CPU, POLARDB's "CPU-based" pushdown; the host on a flat cluster)
    always  drives run all they can (POLARDB's "CSD-based")
    auto    the cost model picks where each fragment starts and the devices adapt at run time
            (docs/adaptive.md); a storage server does the same one level down
            (``server.costs``, ``server.work.host_cheaper``)

A ``StrEnum``: a member is its string, so the JSON of EXPLAIN, the CLI's options and callers
that pass ``"auto"`` see no change. A room that runs only some modes says which once, as a
frozenset of members beside its function, and turns what it is given into a member with
``Pushdown.parse`` at its edge, so a wrong mode fails there with the allowed ones named.

A leaf: it imports nothing of quarry but its errors, so every room imports it without a circle.
The mode does not travel on the wire: a device sees what it implies (the host's costs under
``auto``, forced raw ranges under ``server``, scans under ``never``).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from quarry.errors import InvalidOption


class InvalidPushdown(InvalidOption):
    """A pushdown mode that is not one, or that this room does not run: the message lists the
    modes it does."""

    code = "invalid_pushdown"


class Pushdown(StrEnum):
    NEVER = "never"
    SERVER = "server"
    ALWAYS = "always"
    AUTO = "auto"

    @classmethod
    def parse(
        cls, value: str, allowed: Iterable[Pushdown] | None = None, name: str = "pushdown"
    ) -> Pushdown:
        """``value`` (a member, or its string as a user passes it) as a member of ``allowed``
        (every mode by default); ``name`` is what the message calls it (``--pushdown``)."""
        modes = tuple(cls) if allowed is None else tuple(m for m in cls if m in set(allowed))
        if isinstance(value, str) and value in modes:
            return cls(value)
        listed = ", ".join(mode.value for mode in modes)
        shown = value.value if isinstance(value, Pushdown) else value
        raise InvalidPushdown(f"{name} must be one of {listed}, got {shown!r}")


EVERY_MODE: frozenset[Pushdown] = frozenset(Pushdown)
