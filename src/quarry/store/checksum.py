"""Checksums of what a device stores (DESIGN §2a, "Integrity"; docs/integrity.md).

Every column stream of every slice value has an XXH3-64 checksum, kept in the partition's
metadata slice beside the stream's length: as ZFS keeps a block's checksum in the pointer to it
rather than beside the block, a value that is damaged, cut short, or stale (a write that never
landed leaves an old value that checks against itself) fails against what its parent says. A
device reads columns as byte ranges (``partition._column_values``), so a checksum per column
checks exactly the bytes a read takes, no more. The metadata slice is the root: its value is
sealed with a checksum of its own (``seal``), and so is the catalog entry made from it.

XXH3-64 rather than CRC-32C (both maintained, both take any buffer, so a slice read in place
through LMDB's map is checked without a copy): on this machine it hashes 53-57 GB/s in cache
and 25 GB/s out of it, the crc32c package 24-31 and 24, google-crc32c 16-17 and 1.4 (it
copies what it is given first). A 64-bit digest lets a random corruption through once in 2^64
checks, CRC-32C once in 2^32; CRC-32C's one edge, detecting every burst of up to 32 bits
whatever the length, matters for short network frames, not for values of megabytes read whole.
A read checks at memory speed, 86-100 ms per GB (``bench/checksum.py``, docs/integrity.md).

A value written before checksums has none (``None``): it reads as it always did, unverified,
and ``quarry status`` counts such partitions (docs/integrity.md says why they are not refused).
"""

from __future__ import annotations

import struct

import pyarrow as pa
import xxhash

from quarry.errors import CorruptSlice

ALGORITHM = "xxh3_64"
DIGEST_MAX = (1 << 64) - 1
# A sealed value: this tag, the body's checksum (8 bytes, big-endian), the body. A metadata
# slice written before checksums is bare JSON: it starts with "{", never with the tag.
SEAL_TAG = b"QSUM"
_DIGEST = struct.Struct(">Q")
SEAL_BYTES = len(SEAL_TAG) + _DIGEST.size

Bytes = bytes | bytearray | memoryview | pa.Buffer


def digest(data: Bytes) -> int:
    """The checksum of ``data``, read in place (any buffer: a memory-mapped Arrow buffer too)."""
    return xxhash.xxh3_64_intdigest(data)


def size(data: Bytes) -> int:
    return data.size if isinstance(data, pa.Buffer) else len(data)


def check(data: Bytes, length: int, expected: int | None, what: str) -> bool:
    """Whether ``data`` was verified: raise ``CorruptSlice`` naming ``what`` unless it is
    ``length`` bytes whose checksum is ``expected``; False when there is no checksum to check
    it against (a value written before checksums)."""
    got = size(data)
    if got != length:
        raise CorruptSlice(f"{what}: {got} bytes read where {length} were stored (cut short)")
    if expected is None:
        return False
    actual = digest(data)
    if actual != expected:
        raise CorruptSlice(
            f"{what}: checksum mismatch ({ALGORITHM} {actual:016x} read, {expected:016x} stored)"
        )
    return True


def of_columns(value: Bytes, lengths: list[int]) -> list[int]:
    """The checksum of each column stream of a slice value (``codec.encode_columns``)."""
    view = memoryview(value) if not isinstance(value, pa.Buffer) else value
    checksums, start = [], 0
    for length in lengths:
        checksums.append(digest(view[start : start + length]))
        start += length
    assert start == size(value), (start, size(value))
    return checksums


def seal(body: bytes) -> bytes:
    """``body`` with its checksum in front: a metadata slice or a catalog entry as stored."""
    return SEAL_TAG + _DIGEST.pack(digest(body)) + body


def is_sealed(value: Bytes) -> bool:
    return bytes(value[: len(SEAL_TAG)]) == SEAL_TAG


def unseal(value: bytes, what: str) -> tuple[bytes, bool]:
    """The body of a sealed value, checked, and True; a value written before checksums (bare
    JSON) as it is, and False. Anything else raises ``CorruptSlice`` naming ``what``."""
    if is_sealed(value):
        if len(value) < SEAL_BYTES:
            raise CorruptSlice(f"{what}: {len(value)} bytes, shorter than its checksum")
        (expected,) = _DIGEST.unpack_from(value, len(SEAL_TAG))
        body = value[SEAL_BYTES:]
        actual = digest(body)
        if actual != expected:
            raise CorruptSlice(
                f"{what}: checksum mismatch ({ALGORITHM} {actual:016x} read, "
                f"{expected:016x} stored)"
            )
        return body, True
    if value[:1] == b"{":
        return value, False
    raise CorruptSlice(f"{what}: neither a sealed value nor one written before checksums")
