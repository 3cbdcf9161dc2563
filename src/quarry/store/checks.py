"""What a slice read off the store must satisfy before an engine sees it, checked at the cost of
a pass over its offsets rather than over every value.

Stored bytes are not trusted: an engine reads past a bad offset, and Rust strings assume valid
UTF-8. Arrow's full validation checks that and more, value by value: 0.8 GB/s for short strings
and 5.5 GB/s for decimals (a 30,000-row TPC-H lineitem slice: 0.73 ms for the seven columns Q1
reads, as much CPU over the table as DuckDB takes for the whole query). The checks here hold
the same guarantees for what an engine can trip over:

- every column's buffers are as long as its length says (``validate()``, constant time);
- strings and binaries: offsets start at or after 0, never decrease, end within the data;
- strings: data that is all ASCII is valid UTF-8 (one vectorised pass); anything else gets
  Arrow's full check;
- every other type but plain fixed-width ones (nested, dictionaries, views) gets the full check.

Decimals are fixed width: a value past its precision is a wrong number, not a read out of
bounds, which no check short of a checksum catches for the values that stay within it. Each
column stream's checksum (``store.checksum``) is checked before these checks run: a flipped
bit that leaves every offset and buffer plausible (a 1.0 turned into 2.0) is caught there.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

_OFFSETS = {
    pa.string(): np.int32,
    pa.binary(): np.int32,
    pa.large_string(): np.int64,
    pa.large_binary(): np.int64,
}
ASCII_MAX = 0x7F


def check(batch: pa.RecordBatch) -> None:
    """Raise ``pa.ArrowInvalid`` unless ``batch`` is safe to hand an engine."""
    batch.validate()
    for column in batch.columns:
        _check_column(column)


def _check_column(column: pa.Array) -> None:
    kind = column.type
    fixed = _FIXED_WIDTH.get(kind.id)
    if fixed is None:  # each type id once: these checks run for every column of every slice
        fixed = _FIXED_WIDTH[kind.id] = _fixed_width(kind)
    if fixed:
        return
    if kind in _OFFSETS:
        _check_offsets(column, _OFFSETS[kind], pt.is_string(kind) or pt.is_large_string(kind))
    else:
        column.validate(full=True)


_FIXED_WIDTH: dict[int, bool] = {}


def _fixed_width(kind: pa.DataType) -> bool:
    return (
        pt.is_integer(kind)
        or pt.is_floating(kind)
        or pt.is_boolean(kind)
        or pt.is_decimal(kind)
        or pt.is_temporal(kind)
        or pt.is_null(kind)
        or pt.is_fixed_size_binary(kind)
    )


def _check_offsets(column: pa.Array, offset_type: type, text: bool) -> None:
    if len(column) == 0:
        return
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)
    offsets = offsets[column.offset : column.offset + len(column) + 1]
    data_size = data_buffer.size if data_buffer is not None else 0
    first, last = int(offsets[0]), int(offsets[-1])
    if first < 0 or last > data_size or np.any(offsets[1:] < offsets[:-1]):
        raise pa.ArrowInvalid("offsets out of order or out of the data buffer")
    if text and last > first:
        data = np.frombuffer(data_buffer, dtype=np.uint8)[first:last]
        if data.max() > ASCII_MAX:
            column.validate(full=True)
