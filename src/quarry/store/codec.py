"""Slice values: one Arrow IPC stream per column, back to back, striped when too big.

A slice value is its columns' one-column IPC streams in schema order; the metadata slice keeps
each stream's length, so a device reads only the byte ranges of the columns a sub-plan touches
(Kinetic Pipe's column reads; `docs/protocol.md`, "Slice values"). Compression uses Arrow's own
IPC buffer compression (zstd, lz4 frame), so the device that scans a slice decompresses it on
its own CPU (POLARDB §3.2); a slice read raw for another to scan travels as stored
(``quarry.store.stored``) and its receiver decompresses it. A value stored whole (one stream
of every column, the first format) still reads.
"""

from __future__ import annotations

import pyarrow as pa

from quarry.errors import CorruptSlice, InvalidOption
from quarry.store import checks

COMPRESSIONS = ("none", "zstd", "lz4")
_ARROW_CODEC = {"none": None, "zstd": "zstd", "lz4": "lz4"}


def check_compression(name: str) -> str:
    if name not in COMPRESSIONS:
        raise InvalidOption(
            f"unknown compression {name!r}: choose one of {', '.join(COMPRESSIONS)}"
        )
    return name


def encode_slice(batch: pa.RecordBatch, compression: str = "none") -> bytes:
    options = pa.ipc.IpcWriteOptions(compression=_ARROW_CODEC[check_compression(compression)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_slice(
    value: bytes | memoryview | pa.Buffer, schema: pa.Schema | None = None, rows: int | None = None
) -> pa.RecordBatch:
    """Decode one slice, and check it against what the metadata slice says it holds.

    Stored bytes are not trusted: a damaged value raises ``CorruptSlice`` instead of reaching
    the engine, and the batch is checked for what an engine can trip over (``checks``: offsets,
    UTF-8, buffer sizes) because an engine may read past a bad offset.
    """
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(value) if isinstance(value, bytes) else value)
        batches = list(reader)
        if len(batches) == 1:
            checks.check(batches[0])
    except (pa.ArrowException, OSError, ValueError, MemoryError) as error:
        raise CorruptSlice(f"slice does not decode: {error}") from None
    if len(batches) != 1:
        raise CorruptSlice(f"a slice holds one record batch, found {len(batches)}")
    batch = batches[0]
    if schema is not None and not batch.schema.equals(schema):
        raise CorruptSlice("slice schema differs from its partition's schema")
    if rows is not None and batch.num_rows != rows:
        raise CorruptSlice(f"slice holds {batch.num_rows} rows, metadata says {rows}")
    return batch


def encode_columns(batch: pa.RecordBatch, compression: str = "none") -> tuple[bytes, list[int]]:
    """A slice value of one IPC stream per column, and each stream's length."""
    parts = [
        encode_slice(pa.record_batch([column], schema=pa.schema([field])), compression)
        for field, column in zip(batch.schema, batch.columns, strict=True)
    ]
    return b"".join(parts), [len(p) for p in parts]


def decode_columns(
    parts: list[bytes | memoryview | pa.Buffer],
    fields: list[pa.Field],
    rows: int,
    metadata: dict | None = None,
) -> pa.RecordBatch:
    """Columns read back from their byte ranges, each checked like a whole slice, into one
    batch of ``fields``."""
    columns = []
    for part, field in zip(parts, fields, strict=True):
        try:
            columns.append(decode_slice(part, pa.schema([field]), rows).column(0))
        except CorruptSlice as error:
            raise CorruptSlice(f"column {field.name}: {error}") from None
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields, metadata=metadata))


def stripe(value: bytes, kv_bytes_max: int) -> list[bytes]:
    """Cut an encoded slice into key-value sized stripes (one stripe when it fits)."""
    assert kv_bytes_max > 0
    if len(value) <= kv_bytes_max:
        return [value]
    view = memoryview(value)
    return [bytes(view[i : i + kv_bytes_max]) for i in range(0, len(value), kv_bytes_max)]


def unstripe(values: list[bytes]) -> bytes:
    return values[0] if len(values) == 1 else b"".join(values)


def batch_bytes(batch: pa.RecordBatch | pa.Table) -> int:
    """Bytes of Arrow buffers a batch references (its in-memory size)."""
    return batch.nbytes


def rows_per_slice(schema_bytes_per_row: float, kv_bytes_max: int, fill: float = 0.9) -> int:
    """Whole rows that fill one key-value: slices sized from the value limit (Skytether §5.1)."""
    assert kv_bytes_max > 0 and 0 < fill <= 1
    return max(1, int(kv_bytes_max * fill / max(schema_bytes_per_row, 1.0)))
