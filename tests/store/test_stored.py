"""Slices shipped as stored: the receiver decodes exactly what the store holds."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry.errors import CorruptSlice, ProtocolError
from quarry.store import codec, stored


def _slice() -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(1000), pa.int64()),
            "name": pa.array([f"n{i % 7}" if i % 5 else None for i in range(1000)]),
            "x": pa.array([i * 0.5 for i in range(1000)]),
        }
    )


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_a_slice_shipped_as_stored_decodes_to_the_same_rows(compression: str) -> None:
    batch = _slice()
    value, lengths = codec.encode_columns(batch, compression)
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    parts = [value[offsets[i] : offsets[i + 1]] for i in range(len(lengths))]
    wanted = [2, 0]  # some columns, in the order asked
    fields = pa.schema([batch.schema.field(i) for i in wanted])
    stream = stored.schema(fields)
    assert stored.is_stored(stream)
    shipped = stored.batch([parts[i] for i in wanted], batch.num_rows, stream)
    (back,) = stored.decode(shipped)
    assert back.equals(batch.select(fields.names))
    if compression != "none":  # what crosses the link is the compressed bytes
        assert pa.ipc.get_record_batch_size(shipped) < batch.select(fields.names).nbytes


def test_damaged_or_unlabelled_stored_slices_are_refused() -> None:
    batch = _slice()
    fields = batch.schema
    parts = [codec.encode_columns(batch.select([n]), "lz4")[0] for n in fields.names]
    stream = stored.schema(fields)
    damaged = stored.batch([parts[0][:-7], *parts[1:]], batch.num_rows, stream)
    with pytest.raises(CorruptSlice, match="shipped as stored"):
        stored.decode(damaged)
    wrong_rows = stored.batch(parts, batch.num_rows + 1, stream)
    with pytest.raises(CorruptSlice):
        stored.decode(wrong_rows)
    bare = pa.RecordBatch.from_arrays(
        damaged.columns,
        schema=pa.schema(list(stream)),  # no metadata: not a stored stream
    )
    assert not stored.is_stored(bare.schema)
    with pytest.raises(ProtocolError):
        stored.decode(bare)
