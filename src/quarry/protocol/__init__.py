"""Every message between the coordinator and the devices, in one package (docs/protocol.md).

- ``frame``: the bytes on the wire (magic, length, JSON header, payload), the version check and
  errors as ``QUARRY|<code>|<message>|END``;
- ``message``: the base of every typed message: one encode, one decode that checks types and
  bounds and names the message and field that were wrong (``ProtocolError``);
- ``stage``: the three stages of a unit of work (raw, filter, full) and what a device may skip;
- ``control``, ``ingest``, ``work``: the messages themselves, by job;
- ``counters``: the work counters, declared once (``WorkCounters``).
"""

from quarry.protocol.frame import (
    MAGIC,
    PROTOCOL_VERSION,
    Action,
    Exchange,
    Get,
    Put,
    decode,
    decode_error,
    encode,
    encode_error,
)

__all__ = [
    "MAGIC",
    "PROTOCOL_VERSION",
    "Action",
    "Exchange",
    "Get",
    "Put",
    "decode",
    "decode_error",
    "encode",
    "encode_error",
]
