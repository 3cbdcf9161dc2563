"""Slice values: one Arrow IPC stream per column, back to back, striped when too big.

A slice value is its columns' one-column IPC streams in schema order; the metadata slice keeps
each stream's length, so a device reads only the byte ranges of the columns a sub-plan touches
(Kinetic Pipe's column reads; `docs/protocol.md`, "Slice values"). Compression uses Arrow's own
IPC buffer compression (zstd, lz4 frame), so the device that scans a slice decompresses it on
its own CPU (POLARDB §3.2); a slice read raw for another to scan travels as stored
(``quarry.store.stored``) and its receiver decompresses it. A value stored whole (one stream
of every column, the first format) still reads.

A dataset may ask for blocks (the ingest hint ``BLOCK_BYTES_HINT``; ``encode_columns(...,
block_rows=N)``): each column's stream is then several record batches of N rows, and the
metadata slice keeps each message's length and checksum (``message_lengths``), so a device reads
the schema message and only the blocks that hold the rows it needs (``decode_blocks``), as a
Parquet reader uses a page index. A blocked stream is still one IPC stream: read whole, it
decodes as any other (its batches joined).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from quarry.errors import CorruptSlice, InvalidOption
from quarry.store import checks

COMPRESSIONS = ("none", "zstd", "lz4")
_ARROW_CODEC = {"none": None, "zstd": "zstd", "lz4": "lz4"}


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows. Not ``from_pylist([])``: converting Python values makes pyarrow
    import pandas (~37 MiB), which an idle device answering heartbeats has no use for."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def check_compression(name: str) -> str:
    if name not in COMPRESSIONS:
        raise InvalidOption(
            f"unknown compression {name!r}: choose one of {', '.join(COMPRESSIONS)}"
        )
    return name


def encode_slice(batch: pa.RecordBatch, compression: str = "none", block_rows: int = 0) -> bytes:
    """One IPC stream of ``batch``: one record batch, or blocks of ``block_rows`` rows."""
    assert block_rows >= 0, block_rows
    options = pa.ipc.IpcWriteOptions(compression=_ARROW_CODEC[check_compression(compression)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        if block_rows and batch.num_rows > block_rows:
            writer.write_table(pa.Table.from_batches([batch]), max_chunksize=block_rows)
        else:
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
    if schema is not None and not has_dictionary(schema):
        return _with_rows(_decode_known(value, schema, None), rows)
    try:
        reader = pa.ipc.open_stream(_unpadded(value))
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
    return _with_rows(batch, rows)


def _with_rows(batch: pa.RecordBatch, rows: int | None) -> pa.RecordBatch:
    """``batch``, if it holds the rows the metadata slice promised (None: not said)."""
    if rows is not None and batch.num_rows != rows:
        raise CorruptSlice(f"slice holds {batch.num_rows} rows, metadata says {rows}")
    return batch


def _decode_known(
    value: bytes | memoryview | pa.Buffer, schema: pa.Schema, head_bytes: bytes | None
) -> pa.RecordBatch:
    """A slice of a schema the metadata slice already holds: its one record batch message read
    with that schema, without building a stream reader per slice (a one-column decimal slice
    of 25,000 rows: 16 us a column before, 7 now; TPC-H Q14's devices spent a quarter of their
    CPU decoding). The stream must be exactly a schema message, that batch (or its blocks) and
    at most the end-of-stream marker. Its schema message must say ``schema``: the same bytes as
    ``head_bytes`` (the message ``schema`` encodes to), or, written another way, an equal
    schema. The batch is checked as any slice is."""
    try:
        reader = pa.BufferReader(_unpadded(value))
        head = pa.ipc.read_message(reader)
        body = pa.ipc.read_message(reader)
        if head.type != "schema" or body.type != "record batch":
            raise CorruptSlice(f"a slice holds a schema and one record batch, found {body.type}")
        if head.metadata.to_pybytes() != head_bytes and not pa.ipc.read_schema(head).equals(schema):
            raise CorruptSlice("slice schema differs from its partition's schema")
        batches = [_checked_batch(body, schema)]
        batches += _batches_after(reader, schema, ends_marked=True)
    except (pa.ArrowException, OSError, ValueError, MemoryError, EOFError) as error:
        raise CorruptSlice(f"slice does not decode: {error}") from None
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _checked_batch(message: pa.ipc.Message, schema: pa.Schema) -> pa.RecordBatch:
    batch = pa.ipc.read_record_batch(message, schema)
    checks.check(batch)
    return batch


def _batches_after(
    reader: pa.BufferReader, schema: pa.Schema, ends_marked: bool
) -> list[pa.RecordBatch]:
    """The record batch messages left in ``reader`` (the blocks of a blocked stream), each
    checked; a whole stream may end with the end-of-stream marker, a run of blocks read alone
    ends where its last block does."""
    batches = []
    while rest := reader.size() - reader.tell():
        if ends_marked and rest <= len(_END_OF_STREAM):
            if rest != len(_END_OF_STREAM) or reader.read() != _END_OF_STREAM:
                raise CorruptSlice(f"a slice's column ends with {rest} stray bytes")
            break
        if len(batches) >= BLOCKS_MAX:
            raise CorruptSlice(f"a slice's column holds more than {BLOCKS_MAX} blocks")
        message = pa.ipc.read_message(reader)
        if message.type != "record batch":
            raise CorruptSlice(f"a slice's column holds a {message.type} among its blocks")
        batches.append(_checked_batch(message, schema))
    return batches


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
BLOCKS_MAX = 1 << 16  # record batches in one column stream (a block per row at worst)
BLOCK_BYTES_HINT = "store.block_bytes"  # a dataset's hint: its slices' block size, in bytes


def message_lengths(stream: bytes | memoryview | pa.Buffer) -> list[int]:
    """A column stream cut at its IPC messages: [its head (alignment padding and the schema
    message), each record batch (block), the end-of-stream marker (0 if absent)]; they add up
    to the stream's length."""
    buffer = stream if isinstance(stream, pa.Buffer) else pa.py_buffer(stream)
    unpadded = _unpadded(buffer)
    reader = pa.BufferReader(unpadded)
    pa.ipc.read_message(reader)  # the schema
    lengths = [buffer.size - unpadded.size + reader.tell()]
    while (rest := reader.size() - reader.tell()) > len(_END_OF_STREAM):
        before = reader.tell()
        pa.ipc.read_message(reader)
        lengths.append(reader.tell() - before)
    lengths.append(rest)
    assert sum(lengths) == buffer.size, (lengths, buffer.size)
    return lengths


def decode_blocks(
    head: bytes | memoryview | pa.Buffer,
    blocks: bytes | memoryview | pa.Buffer,
    single: pa.Schema,
    head_bytes: bytes,
    rows: int,
) -> pa.Array:
    """One column's rows read as a run of its blocks: ``head`` (the stream's padding and schema
    message) and ``blocks`` (consecutive record batch messages), each checked as a whole
    column is; ``rows`` rows of the column ``single`` describes (``Columns.singles``)."""
    try:
        message = pa.ipc.read_message(pa.BufferReader(_unpadded(head)))
        if message.type != "schema":
            raise CorruptSlice(f"a column's head is a {message.type}, not its schema")
        same = message.metadata.to_pybytes() == head_bytes
        if not same and not pa.ipc.read_schema(message).equals(single):
            raise CorruptSlice("slice schema differs from its partition's schema")
        body = blocks if isinstance(blocks, pa.Buffer) else pa.py_buffer(blocks)
        batches = _batches_after(pa.BufferReader(body), single, ends_marked=False)
    except (pa.ArrowException, OSError, ValueError, MemoryError, EOFError) as error:
        raise CorruptSlice(f"blocks do not decode: {error}") from None
    if not batches:
        raise CorruptSlice("no block read")
    batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    return _with_rows(batch, rows).column(0)


def has_dictionary(schema: pa.Schema) -> bool:
    """Dictionaries travel in messages of their own: such slices take the stream reader."""
    return any(_field_has_dictionary(field.type) for field in schema)


def _field_has_dictionary(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return True
    return any(_field_has_dictionary(kind.field(i).type) for i in range(kind.num_fields))


def encode_columns(
    batch: pa.RecordBatch, compression: str = "none", block_rows: int = 0
) -> tuple[bytes, list[int]]:
    """A slice value of one IPC stream per column, and each stream's length (its padding in).
    ``block_rows`` > 0: each stream holds record batches of that many rows (blocks).

    Uncompressed, each stream is placed so that its largest buffer lies on a 16-byte boundary
    of the value, 8 zero bytes before it when needed (``ALIGNMENT``): a value in LMDB starts
    on one, so a device's engine gets its columns in place. Misaligned, the engine copies each
    decimal column it is handed (TPC-H Q14's lineitem at SF 1: a sixth of the devices' CPU).
    """
    value = bytearray()
    lengths = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        single = pa.record_batch([column], schema=pa.schema([field]))
        part = encode_slice(single, compression, block_rows)
        pad = 0 if compression != "none" else -(len(value) + _largest_buffer_at(part)) % ALIGNMENT
        value += _PAD[:pad] + part
        lengths.append(pad + len(part))
    return bytes(value), lengths


ALIGNMENT = 16  # the widest a buffer must be aligned to for the engine (decimal128's i128)
_PAD = bytes(ALIGNMENT)  # a stream never starts with zero bytes: the reader skips them


def _largest_buffer_at(stream: bytes) -> int:
    """Where the largest buffer of a one-column stream lies, from its start (IPC aligns every
    buffer to 8 bytes of the stream)."""
    data = pa.py_buffer(stream)
    (column,) = pa.ipc.open_stream(data).read_next_batch().columns
    buffers = [b for b in column.buffers() if b is not None and b.size]
    return max(buffers, key=lambda b: b.size).address - data.address if buffers else 0


def _unpadded(value: bytes | memoryview | pa.Buffer) -> pa.Buffer:
    """A column's stream without the zero bytes that align it (``encode_columns``)."""
    buffer = value if isinstance(value, pa.Buffer) else pa.py_buffer(value)
    skip = 0
    while skip < ALIGNMENT and buffer.size >= skip + 8 and buffer[skip : skip + 8] == _PAD[:8]:
        skip += 8
    return buffer[skip:] if skip else buffer


@dataclass(frozen=True)
class Columns:
    """What decoding some columns of a partition's slices needs of their fields, made once and
    reused for every slice: each column's one-field schema, whether it holds a dictionary (read
    through a stream reader), and the schema of the batch they make."""

    singles: tuple[pa.Schema, ...]
    dictionaries: tuple[bool, ...]
    heads: tuple[bytes, ...]  # each one-field schema's IPC message, as a slice starts with it
    schema: pa.Schema

    @classmethod
    def of(cls, fields: list[pa.Field], metadata: dict | None = None) -> Columns:
        singles = tuple(pa.schema([field]) for field in fields)
        return cls(
            singles,
            tuple(has_dictionary(single) for single in singles),
            tuple(pa.ipc.read_message(s.serialize()).metadata.to_pybytes() for s in singles),
            pa.schema(fields, metadata=metadata),
        )


def decode_columns(
    parts: list[bytes | memoryview | pa.Buffer], columns: Columns, rows: int
) -> pa.RecordBatch:
    """Columns read back from their byte ranges, each checked like a whole slice, into one
    batch of ``columns.schema``."""
    arrays = []
    each = zip(parts, columns.singles, columns.dictionaries, columns.heads, strict=True)
    for part, single, dictionary, head in each:
        try:
            if dictionary:
                batch = decode_slice(part, single, rows)
            else:
                batch = _with_rows(_decode_known(part, single, head), rows)
        except CorruptSlice as error:
            raise CorruptSlice(f"column {single.field(0).name}: {error}") from None
        arrays.append(batch.column(0))
    return pa.RecordBatch.from_arrays(arrays, schema=columns.schema)


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
