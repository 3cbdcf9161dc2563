"""Slices shipped as stored: each column's IPC stream as it lies in the store, decoded by the
receiver (POLARDB §3.2: a drive acting as a plain SSD ships compressed blocks, and whoever scans
them, a storage server's CPU or the host's, pays their decompression).

A raw range of a compressed dataset travels this way: one row per slice, a ``binary`` column per
table column holding that column's stream, and ``__rows``; the stream's schema metadata carries
the table columns' own schema. ``decode`` gives back the slice as ``read_slice`` would, with the
same checks of untrusted bytes.
"""

from __future__ import annotations

import pyarrow as pa

from quarry.errors import CorruptSlice, ProtocolError
from quarry.store import codec

SCHEMA_KEY = b"quarry.stored_schema"
ROWS = "__rows"


def schema(fields: pa.Schema) -> pa.Schema:
    """The stream schema of ``fields`` shipped as stored."""
    columns = [pa.field(name, pa.binary(), nullable=False) for name in fields.names]
    columns.append(pa.field(ROWS, pa.int64(), nullable=False))
    return pa.schema(columns, metadata={SCHEMA_KEY: fields.serialize().to_pybytes()})


def batch(parts: list[bytes | memoryview], rows: int, stream: pa.Schema) -> pa.RecordBatch:
    """One slice: its columns' streams, in ``stream``'s order."""
    arrays = [pa.array([part], pa.binary()) for part in parts]
    arrays.append(pa.array([rows], pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=stream)


def is_stored(stream: pa.Schema) -> bool:
    return stream.metadata is not None and SCHEMA_KEY in stream.metadata


def decode(shipped: pa.RecordBatch) -> list[pa.RecordBatch]:
    """The slices of a batch shipped as stored, decoded and checked."""
    try:
        fields = pa.ipc.read_schema(pa.py_buffer((shipped.schema.metadata or {})[SCHEMA_KEY]))
    except (pa.ArrowException, KeyError) as error:
        raise ProtocolError(f"a stored-slice stream without its schema: {error}") from None
    if shipped.schema.names[:-1] != fields.names:
        raise ProtocolError("a stored-slice stream's columns differ from its schema")
    rows = shipped.column(ROWS).to_pylist()
    columns = [shipped.column(i) for i in range(len(fields))]
    decoding = codec.Columns.of(list(fields), fields.metadata)
    out = []
    for row, count in enumerate(rows):
        parts = [column[row].as_py() for column in columns]
        try:
            out.append(codec.decode_columns(parts, decoding, count))
        except CorruptSlice as error:
            raise CorruptSlice(f"a slice shipped as stored: {error}") from None
    return out
