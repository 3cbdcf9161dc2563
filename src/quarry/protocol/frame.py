"""The bytes on the wire: frames, protocol version, and errors (docs/protocol.md).

Transport is Arrow Flight. Control messages are Flight actions; data moves as Flight streams.
Every request body (action body, put descriptor, ticket, exchange descriptor) is one frame:
``MAGIC`` + u32 length + JSON header + binary payload. The JSON header always carries
``protocol`` and ``kind``; a device answers a different version with a clear error. The typed
messages that fill the header live in ``control``, ``ingest`` and ``work``.

Errors travel as ``QUARRY|<code>|<message>|END`` inside the Flight error, and the client rebuilds
the typed ``quarry.errors`` exception.
"""

from __future__ import annotations

import json
import re
import struct
from enum import StrEnum
from typing import Any

from quarry.errors import ProtocolError, ProtocolMismatch, QuarryError, error_class

# 2: every message typed; one work exchange for every kind of work (was query and program)
# 3: a partition's work counters travel as one message (WorkMetrics.counters: WorkCounters)
# 4: slices shipped as stored carry their checksums; scrub and the mending of one copy
# 5: a SliceDescription describes a blocked slice's blocks (block_rows, blocks, block_checksums)
PROTOCOL_VERSION = 5
MAGIC = b"QRY"
HEADER_BYTES_MAX = 16 << 20  # a JSON header above this is a bug, not a request
_LENGTH = struct.Struct(">I")


class Action(StrEnum):
    HELLO = "hello"
    INVENTORY = "inventory"
    DESCRIBE = "describe"
    COMMIT = "commit"
    ABORT = "abort"
    DROP = "drop"
    STATS = "stats"
    KV_GET = "kv_get"
    KV_PUT = "kv_put"
    KV_DELETE = "kv_delete"
    KV_LIST = "kv_list"
    LOAD = "load"  # emulated background load on the drive, bounded in time
    STATUS_LOAD = "load_status"  # the drive's CPU busy, run queue, background load
    CALIBRATE = "calibrate"  # time the compute kernel and internal reads on the device
    RENEW = "renew"  # the coordinator of an ingest is alive: keep its pending partitions
    OUTCOME = "outcome"  # asked of an ingest's decider: was it committed?
    PULSE = "pulse"  # before a query: has what the device holds changed, and its load
    REVOKE = "revoke"  # the admin hands a device the cluster's signed revocation list
    REVOCATIONS = "revocations"  # a device asks another for a newer revocation list
    SCRUB = "scrub"  # read and check a range of slices of a partition, mend what it can itself
    INTEGRITY = "integrity"  # the damaged copies a device found and its last whole scrub
    SCRUBBED = "scrubbed"  # a whole scrub of the device is over: keep its summary
    REPAIR_META = "repair_meta"  # a damaged metadata slice replaced by a good copy's
    RETIRE = "retire"  # a partition moved elsewhere leaves this device
    HOLDERS = "holders"  # which devices hold a partition now (after a move)
    QUARANTINE_CLEAR = "quarantine_clear"  # lift every sub-plan shape a device quarantined


class Put(StrEnum):
    PARTITION = "put_partition"
    UPDATE_SLICE = "update_slice"
    REPAIR_SLICE = "repair_slice"  # a damaged slice rewritten from a good copy's rows


class Get(StrEnum):
    SCAN = "scan"
    SLICES = "slices"  # pushed-back slice ranges, raw or after the filter stage
    CALIBRATION = "calibration"  # a stream of N bytes through the external link
    # an empty batch every period while the caller holds it open: the caller's keepalive pings
    # are never taken for abuse, and its link to the device stays proven (device_client.py)
    HEARTBEAT = "heartbeat"


class Exchange(StrEnum):
    WORK = "work"  # a unit of work over partitions: SQL stage, device program, ...


def encode(kind: str, header: dict[str, Any] | None = None, payload: bytes = b"") -> bytes:
    body = {"protocol": PROTOCOL_VERSION, "kind": str(kind), **(header or {})}
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) <= HEADER_BYTES_MAX, "request header too large"
    return MAGIC + _LENGTH.pack(len(raw)) + raw + payload


def decode(frame: bytes) -> tuple[str, dict[str, Any], bytes]:
    """Split a frame into (kind, header, payload); refuse other protocol versions clearly."""
    frame = bytes(frame)
    if not frame.startswith(MAGIC) or len(frame) < len(MAGIC) + _LENGTH.size:
        raise ProtocolMismatch(
            "not a quarry request (bad frame): is this client a quarry coordinator of a "
            f"compatible version? This device speaks protocol {PROTOCOL_VERSION}."
        )
    start = len(MAGIC) + _LENGTH.size
    (length,) = _LENGTH.unpack(frame[len(MAGIC) : start])
    if length > HEADER_BYTES_MAX or start + length > len(frame):
        raise ProtocolMismatch("truncated quarry request frame")
    try:
        header = json.loads(frame[start : start + length])
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"quarry request frame: the header is not JSON ({error})") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
        raise ProtocolError("quarry request frame: the header must be an object with a kind")
    version = header.get("protocol")
    if version != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"protocol version mismatch: the client speaks quarry protocol {version}, this device "
            f"speaks {PROTOCOL_VERSION}. Run the same quarry version on coordinator and devices."
        )
    return header.pop("kind"), header, frame[start + length :]


def encode_error(error: BaseException) -> str:
    code = error.code if isinstance(error, QuarryError) else "error"
    message = str(error).replace("|", "/")
    return f"QUARRY|{code}|{message}|END"


_ERROR = re.compile(r"QUARRY\|([a-z_]+)\|(.*?)\|END", re.DOTALL)


def decode_error(text: str) -> QuarryError | None:
    """Rebuild the typed error a device raised, from a Flight error's text."""
    match = _ERROR.search(text)
    if match is None:
        return None
    cls = error_class(match.group(1))
    return cls(match.group(2))
