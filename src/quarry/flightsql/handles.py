"""The handles the endpoint gives out: a result to fetch, a prepared statement to run.

A handle names server-side state by a random id and says which kind it is; it carries no SQL and
no token, so a handle that leaks grants nothing: the state it names answers only to the token
that made it (``statements.Statements`` checks the owner).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from enum import StrEnum

from quarry.protocol.message import Message, bounded

_ID = re.compile(r"[0-9a-f]{32}")


class Kind(StrEnum):
    RESULT = "result"  # a planned query waiting for its DoGet (inside a ticket)
    PREPARED = "prepared"  # a prepared statement


@dataclass(frozen=True)
class Handle(Message):
    kind: Kind
    id: str = bounded(chars_max=32)

    def __post_init__(self) -> None:
        assert _ID.fullmatch(self.id), f"id {self.id!r} is not 32 hexadecimal digits"

    @classmethod
    def new(cls, kind: Kind) -> Handle:
        return cls(kind, uuid.uuid4().hex)
