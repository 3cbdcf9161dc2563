"""Every message between the coordinator and the devices, in one place (see docs/protocol.md).

Transport is Arrow Flight. Control messages are Flight actions; data moves as Flight streams:

    action   hello           -> device identity, profile, protocol version
    action   inventory       -> every committed partition the device holds (no zone maps)
    action   describe        -> one partition's metadata slice, zone maps included
    action   commit / abort  -> second phase of an ingest: pending partitions visible / dropped
    action   drop            -> delete a dataset's partitions from this device
    action   stats           -> key count, file bytes, pending partitions
    action   kv_get / kv_put / kv_delete / kv_list   -> the raw key-value namespace (Kinetic-style)
    action   load / load_status -> start emulated background load; read the drive's load
    action   calibrate       -> compute-kernel time and internal read bandwidth on the device
    do_get   calibration     -> N bytes through the external link, for the host to time
    do_exchange program      -> run a built-in device program by name; stream its batches, then
                                a JSON summary (bytes read and shipped, device CPU seconds)
    do_put   put_partition   -> stream one partition's rows; the device slices, stores, pends
    do_put   update_slice    -> replace one slice, compare-and-swap on its version
    do_get   scan            -> a partition's slices raw (optionally a slice range and columns)
    do_get   slices          -> slice ranges a device pushed back: raw columns or after the filter
    do_exchange query        -> run a Substrait sub-plan over a partition; stream results, then
                                the annotated sub-plan (decisions per slice range) and metrics

Every request body is one frame: ``MAGIC`` + u32 length + JSON header + binary payload. The JSON
header always carries ``protocol``; a device answers a different version with a clear error.
Errors travel as ``QUARRY|<code>|<message>`` inside the Flight error, and the client rebuilds the
typed ``quarry.errors`` exception.
"""

from __future__ import annotations

import json
import re
import struct
from enum import StrEnum
from typing import Any

from quarry.errors import ProtocolMismatch, QuarryError, error_class

PROTOCOL_VERSION = 1
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


class Put(StrEnum):
    PARTITION = "put_partition"
    UPDATE_SLICE = "update_slice"


class Get(StrEnum):
    SCAN = "scan"
    SLICES = "slices"  # pushed-back slice ranges, raw or after the filter stage
    CALIBRATION = "calibration"  # a stream of N bytes through the external link


class Exchange(StrEnum):
    QUERY = "query"
    PROGRAM = "program"  # a built-in device program, by name (Kinetic exec)


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
    header = json.loads(frame[start : start + length])
    version = header.get("protocol")
    if version != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"protocol version mismatch: the client speaks quarry protocol {version}, this device "
            f"speaks {PROTOCOL_VERSION}. Run the same quarry version on coordinator and devices."
        )
    return header.pop("kind"), header, frame[start + length :]


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def decode_json(raw: bytes | memoryview) -> Any:
    return json.loads(bytes(raw))


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
