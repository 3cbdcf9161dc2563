"""Key sets: the values of a join's build column, sent to the devices of its probe fragment.

A key set travels as a one-column Arrow IPC stream after the sub-plan's stages in the work
payload (``SubstraitArgs.key_filters`` says where), and is checked like a slice read off the
store. ``KeyCut`` keeps the rows of a fragment's output whose column is among the keys: a
lookup table over the keys' range for integers (built once per request, one vectorised pass
per batch), Arrow's ``is_in`` otherwise. NULL is never among the keys: a join's ``=`` never
matches it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from quarry.store import checks

KEYS_MAX = 500_000  # distinct keys a build may send; more, and the probe goes uncut
LOOKUP_RANGE_MAX = 1 << 24  # integer keys spanning at most this many values get a table


def encode(keys: pa.Array) -> bytes:
    batch = pa.record_batch([keys], names=["key"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode(data: bytes) -> pa.Array:
    """Raises ``ValueError`` for anything but one column of at most ``KEYS_MAX`` keys."""
    try:
        batches = list(pa.ipc.open_stream(pa.py_buffer(data)))
        for batch in batches:
            checks.check(batch)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"a key set does not decode: {error}") from None
    if len(batches) != 1 or batches[0].num_columns != 1:
        raise ValueError("a key set is one batch of one column")
    keys = batches[0].column(0)
    if len(keys) > KEYS_MAX:
        raise ValueError(f"a key set holds {len(keys)} keys, at most {KEYS_MAX}")
    return keys


class KeyCut:
    """The rows whose ``column`` (an output position) holds one of ``keys``."""

    def __init__(self, column: int, keys: pa.Array):
        self.column = column
        self.keys = keys.drop_null()

    def mask(self, values: pa.Array) -> pa.Array:
        if values.type != self.keys.type:
            try:
                keys = self.keys.cast(values.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # no cut rather than a wrong one
                return pa.array(np.ones(len(values), dtype=np.bool_))
        else:
            keys = self.keys
        integers = _fits_int64(values.type) and _fits_int64(self.keys.type)
        table = self._table if integers and len(keys) else None
        if table is None:
            return pc.is_in(values, value_set=keys)
        low, present = table
        return _looked_up(values, low, present)

    @functools.cached_property
    def _table(self) -> tuple[int, np.ndarray] | None:
        numbers = self.keys.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        low, high = int(numbers.min()), int(numbers.max())
        if high - low >= LOOKUP_RANGE_MAX:
            return None
        present = np.zeros(high - low + 1, dtype=np.bool_)
        present[numbers - low] = True
        return low, present


def _fits_int64(kind: pa.DataType) -> bool:
    return pt.is_signed_integer(kind) or kind in (pa.uint8(), pa.uint16(), pa.uint32())


def _looked_up(values: pa.Array, low: int, present: np.ndarray) -> pa.Array:
    numbers = values.fill_null(0) if values.null_count else values
    shifted = numbers.to_numpy(zero_copy_only=False).astype(np.int64, copy=False) - low
    inside = (shifted >= 0) & (shifted < len(present))
    found = np.zeros(len(shifted), dtype=np.bool_)
    found[inside] = present[shifted[inside]]
    if values.null_count:
        found &= ~values.is_null().to_numpy(zero_copy_only=False)
    return pa.array(found, pa.bool_())


def keep(batch: pa.RecordBatch, cuts: Sequence[KeyCut]) -> pa.RecordBatch:
    """``batch`` without the rows some cut drops."""
    if not cuts or not batch.num_rows:
        return batch
    mask = cuts[0].mask(batch.column(cuts[0].column))
    for cut in cuts[1:]:
        mask = pc.and_(mask, cut.mask(batch.column(cut.column)))
    return batch.filter(mask)


def keep_named(batch: pa.RecordBatch, cuts: Sequence[tuple[str, KeyCut]]) -> pa.RecordBatch:
    """``batch`` without the rows some cut drops, each cut on the column of its name."""
    if not cuts or not batch.num_rows:
        return batch
    mask = None
    for name, cut in cuts:
        found = cut.mask(batch.column(name))
        mask = found if mask is None else pc.and_(mask, found)
    return batch.filter(mask)
