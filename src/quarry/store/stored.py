"""Slices shipped as stored: each column's IPC stream as it lies in the store, decoded by the
receiver (POLARDB §3.2: a drive acting as a plain SSD ships compressed blocks, and whoever scans
them, a storage server's CPU or the host's, pays their decompression).

A raw range of a compressed dataset travels this way: one row per slice, a ``binary`` column per
table column holding that column's stream, ``__rows``, and ``__checksums``, each stream's
checksum as the metadata slice keeps it (null for a slice written before checksums); the
stream's schema metadata carries the table columns' own schema. The device checks the streams
before it ships them and ``decode`` checks them again where they arrive (the bytes travel as
stored, so what protects them on the disk protects them on the wire), then gives back the
slice as ``read_slice`` would, with the same checks of untrusted bytes.
"""

from __future__ import annotations

import pyarrow as pa

from quarry.errors import CorruptSlice, ProtocolError
from quarry.store import checksum, codec

SCHEMA_KEY = b"quarry.stored_schema"
ROWS = "__rows"
CHECKSUMS = "__checksums"
_TRAILING = 2  # columns after the table's: ROWS, CHECKSUMS


def schema(fields: pa.Schema) -> pa.Schema:
    """The stream schema of ``fields`` shipped as stored."""
    columns = [pa.field(name, pa.binary(), nullable=False) for name in fields.names]
    columns.append(pa.field(ROWS, pa.int64(), nullable=False))
    columns.append(pa.field(CHECKSUMS, pa.list_(pa.uint64())))
    return pa.schema(columns, metadata={SCHEMA_KEY: fields.serialize().to_pybytes()})


def batch(
    parts: list[bytes | memoryview],
    rows: int,
    stream: pa.Schema,
    checksums: list[int] | None = None,
) -> pa.RecordBatch:
    """One slice: its columns' streams, in ``stream``'s order, and their checksums (None:
    it has none)."""
    assert checksums is None or len(checksums) == len(parts)
    arrays = [pa.array([part], pa.binary()) for part in parts]
    arrays.append(pa.array([rows], pa.int64()))
    arrays.append(pa.array([checksums], pa.list_(pa.uint64())))
    return pa.RecordBatch.from_arrays(arrays, schema=stream)


def verified(shipped: pa.RecordBatch) -> int:
    """How many slices of a batch shipped as stored carry checksums (``decode`` checks them)."""
    return shipped.num_rows - shipped.column(CHECKSUMS).null_count


def is_stored(stream: pa.Schema) -> bool:
    return stream.metadata is not None and SCHEMA_KEY in stream.metadata


def decode(shipped: pa.RecordBatch) -> list[pa.RecordBatch]:
    """The slices of a batch shipped as stored, decoded and checked."""
    try:
        fields = pa.ipc.read_schema(pa.py_buffer((shipped.schema.metadata or {})[SCHEMA_KEY]))
    except (pa.ArrowException, KeyError) as error:
        raise ProtocolError(f"a stored-slice stream without its schema: {error}") from None
    if shipped.schema.names[:-_TRAILING] != fields.names:
        raise ProtocolError("a stored-slice stream's columns differ from its schema")
    rows = shipped.column(ROWS).to_pylist()
    sums = shipped.column(CHECKSUMS).to_pylist()
    columns = [shipped.column(i) for i in range(len(fields))]
    decoding = codec.Columns.of(list(fields), fields.metadata)
    out = []
    for row, count in enumerate(rows):
        parts = [column[row].as_py() for column in columns]
        try:
            _check(parts, sums[row], fields)
            out.append(codec.decode_columns(parts, decoding, count))
        except CorruptSlice as error:
            raise CorruptSlice(f"a slice shipped as stored: {error}") from None
    return out


def _check(parts: list[bytes], sums: list[int] | None, fields: pa.Schema) -> None:
    """The streams as they arrived against the checksums the device sent with them."""
    if sums is None:
        return
    if len(sums) != len(parts):
        raise CorruptSlice(f"{len(sums)} checksums for {len(parts)} columns")
    for part, expected, name in zip(parts, sums, fields.names, strict=True):
        checksum.check(part, len(part), expected, f"column {name}")
