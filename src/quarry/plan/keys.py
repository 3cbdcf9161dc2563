"""Key sets: the values of a join's build column, sent to the devices of its probe fragment.

A key set travels as a one-column Arrow IPC stream after the sub-plan's stages in the work
payload (``SubstraitArgs.key_filters`` says where), and is checked like a slice read off the
store. ``KeyCut`` keeps the rows of a fragment's output whose column is among the keys: for
integers a table over the keys' range (a byte or a bit per value, built once per request, one
gather per batch), a binary search over them sorted when they span a wider range; Arrow's
``is_in`` otherwise. NULL is never among the keys: a join's ``=`` never matches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from quarry.lazy import cached_property
from quarry.store import checks
from quarry.store.zonemap import IntegerBounds, integer_bounds

# distinct keys a build may send; more, and the probe goes uncut. TPC-H SF 10 Q3's 1.4
# million orders cut its lineitem fragment from 1.3 GB shipped to 63 MB (3.6 s to 2.1); 2
# million 64-bit keys are the most a key set's bytes (``KEY_SET_BYTES_MAX``, 16 MiB) hold.
KEYS_MAX = 2_000_000
KEY_SET_BYTES_MAX = 16 << 20  # a key set on the wire: wider keys (text) may reach it first
# integer keys spanning at most this many values get a table of a bit each (64 MiB at most;
# TPC-H SF 10's 60 million order keys: 7.5 MB), at most this many a byte each (16 MiB at most;
# a gather of bytes costs about half a gather of bits)
LOOKUP_RANGE_MAX = 1 << 29
BYTE_RANGE_MAX = 1 << 24
# keys a zone map is judged against: sorting them costs each request (TPC-H Q21's 1.5 million
# order keys: 0.1 s a partition, Q21 0.49 to 1.64 s), and so many keys leave few slices out
PRUNING_KEYS_MAX = 1 << 16
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# a chunk's cuts are ordered by what each keeps of a sample: this many rows of each of this
# many of its slices (a sample's mask costs a few microseconds; a wrong order, half the cuts')
SAMPLED_ROWS = 256
SAMPLED_PIECES = 8
# a cut judges a chunk's column piece by piece up to this many pieces, joined beyond
PIECES_JUDGED_MAX = 8


def distinct(values: pa.ChunkedArray) -> pa.Array:
    """The distinct non-null values, in no particular order. Integers go through pandas' hash
    table: Arrow's ``unique`` took 166 ms over TPC-H SF 10 Q3's 1.46 million order keys, the
    host's whole work between the orders and the lineitem waves, where pandas takes 55."""
    import pandas as pd  # here: only the coordinator collects keys, and devices start faster

    present = values.drop_null()
    if not _fits_int64(present.type) or not len(present):
        return pc.unique(present) if len(present) else pa.array([], present.type)
    numbers = present.to_numpy()  # no nulls: the integers as they are
    return pa.array(pd.unique(numbers), present.type)


def encode(keys: pa.Array) -> bytes:
    """One batch of one column; 64-bit integers that fit in 32 bits go as 32 (half the bytes
    to every probe device; the cut compares values, not types)."""
    batch = pa.record_batch([_narrowed(keys)], names=["key"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _narrowed(keys: pa.Array) -> pa.Array:
    if keys.type != pa.int64() or not len(keys):
        return keys
    bounds = pc.min_max(keys)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or low < -(1 << 31) or high >= 1 << 31:
        return keys
    return keys.cast(pa.int32())


def decode(data: bytes) -> pa.Array:
    """Raises ``ValueError`` for anything but one column of at most ``KEYS_MAX`` keys."""
    if len(data) > KEY_SET_BYTES_MAX:
        raise ValueError(f"a key set takes {len(data)} bytes, at most {KEY_SET_BYTES_MAX}")
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
        if self.by_numbers(values.type):
            return _mask(values, self.found(_integers(values)))
        return self._is_in(values)

    def keeps(self, values: pa.Array) -> np.ndarray:
        """``mask`` as numpy booleans, one a value (false for a null)."""
        if not self.by_numbers(values.type):
            return self._is_in(values).to_numpy(zero_copy_only=False)
        found = self.found(_integers(values))
        if values.null_count:
            found &= _valid(values)
        return found

    def by_numbers(self, kind: pa.DataType) -> bool:
        """Whether values of this type are judged as numbers (``found``)."""
        return _fits_int64(kind) and _fits_int64(self.keys.type) and len(self.keys) > 0

    def found(self, numbers: np.ndarray) -> np.ndarray:
        """Whether each of these integers is among the keys (a null's slot: the caller's)."""
        if self._span is not None:
            return _within(numbers, *self._span)
        if self._table is not None:
            return _looked_up(numbers, *self._table)
        return _searched(numbers, self._sorted)

    def _is_in(self, values: pa.Array) -> pa.Array:
        keys = self.keys
        if values.type != keys.type:
            try:
                keys = keys.cast(values.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # no cut rather than a wrong one
                return pa.array(np.ones(len(values), dtype=np.bool_))
        return pc.is_in(values, value_set=keys)

    def may_hold(self, stats: Mapping[str, Any] | None) -> bool:
        """Whether a slice whose zone map of the cut column is ``stats`` may hold a row the cut
        keeps: false only for integer keys none of which lies in [min, max], or a column all
        null there. Unsure (no statistics, other types, more than ``PRUNING_KEYS_MAX`` keys):
        true. One slice's ``may_hold_each``."""
        return bool(self.may_hold_each(integer_bounds([stats]))[0])

    def may_hold_each(self, bounds: IntegerBounds) -> np.ndarray:
        """``may_hold`` for every slice at once, from its zone maps as arrays: one binary
        search over the keys for all of them (a device judges a partition's slices so)."""
        holds = ~(bounds.mapped & bounds.empty)
        if not _fits_int64(self.keys.type) or len(self.keys) > PRUNING_KEYS_MAX:
            return holds
        keys = self._sorted
        if not len(keys):
            return holds & ~(bounds.mapped & bounds.known)
        at = np.searchsorted(keys, bounds.low)
        inside = (at < len(keys)) & (keys[np.minimum(at, len(keys) - 1)] <= bounds.high)
        return holds & (inside | ~(bounds.mapped & bounds.known))

    @cached_property
    def _span(self) -> tuple[int, int] | None:
        """(lowest, highest) when the keys are every integer between: a join's dates (a
        month, a quarter, a year) most often are, and two comparisons cost half a lookup."""
        if self._table is None:
            return None
        low, table, bits = self._table
        entries = len(self.keys) + 2  # an empty entry at either end
        if bits or len(table) != entries or not table[1:-1].all():
            return None
        return low + 1, low + entries - 2

    @cached_property
    def _table(self) -> tuple[int, np.ndarray, bool] | None:
        """The keys as a table over their range: a byte per value up to ``BYTE_RANGE_MAX``
        values, a bit per value beyond, so a batch is cut by one vectorised gather however
        many keys there are (``is_in`` builds its hash of the keys again for every batch: 41
        ms a slice of 21,700 rows for 450,000 keys; 0.06 through the bytes, 0.09 the bits).
        Entry 0 and the last are empty: values outside the range are clipped onto them.
        Returns (the value of entry 0, the table, whether it holds bits)."""
        numbers = self.keys.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        low, high = int(numbers.min()) - 1, int(numbers.max()) + 1
        if high - low >= LOOKUP_RANGE_MAX or low < INT64_MIN or high > INT64_MAX:
            return None
        table = np.zeros(high - low + 1, dtype=np.bool_)
        table[numbers - low] = True
        if high - low < BYTE_RANGE_MAX:
            return low, table, False
        return low, np.packbits(table, bitorder="little"), True

    @cached_property
    def _sorted(self) -> np.ndarray:
        """The keys sorted, for integers spanning too wide a range for a table: a binary
        search over them, built once (``is_in`` builds its hash again for every batch); and
        for judging zone maps, read off a table of a byte a value where there is one (sorting
        TPC-DS Q7's 27,000 customer profiles took each partition's request 2 ms)."""
        if len(self.keys) and self._table is not None and not self._table[2]:
            low, table, _ = self._table
            return np.flatnonzero(table) + low
        return np.unique(self.keys.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))


def _fits_int64(kind: pa.DataType) -> bool:
    return pt.is_signed_integer(kind) or kind in (pa.uint8(), pa.uint16(), pa.uint32())


def _looked_up(numbers: np.ndarray, low: int, table: np.ndarray, bits: bool) -> np.ndarray:
    # a value past either end wraps or clips onto an empty end entry, never inside
    # (clipped in place, then taken: numpy's own ``mode="clip"`` is three times slower)
    at = np.subtract(numbers, low, dtype=np.int64)
    if bits:
        np.clip(at, 0, len(table) * 8 - 1, out=at)
        return ((table[at >> 3] >> (at & 7).astype(np.uint8)) & 1).view(np.bool_)
    np.clip(at, 0, len(table) - 1, out=at)
    return np.take(table, at)


def _within(numbers: np.ndarray, low: int, high: int) -> np.ndarray:
    """Compared in the column's own type (against 64-bit bounds numpy widens every value
    first: twice the time over a 32-bit column), the bounds held to what it can hold."""
    held = np.iinfo(numbers.dtype)
    if low > held.max or high < held.min:
        return np.zeros(len(numbers), dtype=np.bool_)
    kind = numbers.dtype.type
    low, high = kind(max(low, held.min)), kind(min(high, held.max))
    return (numbers >= low) & (numbers <= high)


def _searched(numbers: np.ndarray, keys_sorted: np.ndarray) -> np.ndarray:
    wanted = numbers.astype(np.int64, copy=False)
    at = np.minimum(np.searchsorted(keys_sorted, wanted), len(keys_sorted) - 1)
    return keys_sorted[at] == wanted


def _integers(values: pa.Array) -> np.ndarray:
    """The values' data buffer as numbers, in place: a null's slot holds whatever it holds
    (``_mask`` drops it). Filling nulls first and converting took three times the lookup's
    own time (TPC-DS's sale dates are 4% null)."""
    kind = np.dtype(values.type.to_pandas_dtype())
    data = values.buffers()[1]
    if data is None or not len(values):  # no rows, or every one null with no data kept
        return np.zeros(len(values), kind)
    return np.frombuffer(data, kind, count=len(values), offset=values.offset * kind.itemsize)


def _valid(values: pa.Array) -> np.ndarray:
    """Whether each value is not null, as numpy booleans."""
    bits = np.frombuffer(values.buffers()[0], np.uint8)
    every = np.unpackbits(bits, count=values.offset + len(values), bitorder="little")
    return every[values.offset :].view(np.bool_)


def _mask(values: pa.Array, found: np.ndarray) -> pa.Array:
    """``found`` as a mask, false where the value is null (its slot held anything)."""
    packed = np.packbits(found, bitorder="little")
    if values.null_count:
        if values.offset:
            packed &= np.packbits(
                values.is_valid().to_numpy(zero_copy_only=False), bitorder="little"
            )
        else:  # the values' validity bitmap, byte for byte over the same rows
            packed &= np.frombuffer(values.buffers()[0], np.uint8, count=len(packed))
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(packed)])


def keep(batch: pa.RecordBatch, cuts: Sequence[KeyCut]) -> pa.RecordBatch:
    """``batch`` without the rows some cut drops."""
    if not cuts or not batch.num_rows:
        return batch
    mask = cuts[0].mask(batch.column(cuts[0].column))
    for cut in cuts[1:]:
        mask = pc.and_(mask, cut.mask(batch.column(cut.column)))
    return batch.filter(mask)


def keep_named(batch: pa.RecordBatch, cuts: Sequence[tuple[str, KeyCut]]) -> pa.RecordBatch:
    """``batch`` without the rows some cut drops, each cut on the column of its name
    (``keep_in`` over one batch)."""
    if not cuts or not batch.num_rows:
        return batch
    kept = keep_in([batch], cuts).to_batches()  # one chunk already
    return kept[0] if kept else batch.slice(0, 0)


def keep_in(batches: Sequence[pa.RecordBatch], cuts: Sequence[tuple[str, KeyCut]]) -> pa.Table:
    """Rows of a chunk's slices (batches of one schema) that every cut keeps, as one table:
    each cut looks at its column across them all at once (a slice at a time, the calls cost
    more than the work: 220 slices of 13,000 rows for TPC-DS Q42), the cut that keeps fewest
    first (``_fewest_first``), each after it only at the rows those before it kept (a join's
    keys usually keep few: Q42's 30 dates of 1,800); then each batch is taken once at the rows
    kept in it. Filtering the whole table after each cut went over every column once a cut,
    and over a chunk of many slices once a slice: a device's CPU in this over 15 TPC-DS SF 1
    queries, 1,347 -> 936 ms with the cache's runs as pieces (``ColumnCache.get_runs``)."""
    table = pa.Table.from_batches(batches)
    if not cuts or not table.num_rows:
        return table
    rows: np.ndarray | None = None  # positions kept so far; None: every row
    for name, cut in _fewest_first(table, cuts):
        chunks = table.column(name).chunks
        if rows is None:
            rows = np.flatnonzero(_keeps(cut, chunks))
        else:
            rows = rows[_keeps(cut, _taken(chunks, rows))]
        if not len(rows):
            break
    assert rows is not None
    if len(rows) == table.num_rows:
        return table  # ascending positions, as many as rows: every one, in order
    return pa.Table.from_batches(_taken(batches, rows), table.schema)


def _taken(pieces: Sequence[Any], rows: np.ndarray) -> list[Any]:
    """Arrays or batches, end to end, at ``rows`` (ascending positions across them all): each
    taken at its own rows (Arrow's take over many chunks joins them all first)."""
    ends = np.cumsum([len(piece) for piece in pieces])
    stops = np.searchsorted(rows, ends, side="left")
    taken, first = [], 0
    for piece, end, stop in zip(pieces, ends, stops, strict=True):
        if stop > first:
            taken.append(piece.take(pa.array(rows[first:stop] - (end - len(piece)))))
        first = int(stop)
    return taken


def _keeps(cut: KeyCut, pieces: Sequence[pa.Array]) -> np.ndarray:
    """Whether the cut keeps each value of these arrays, end to end: judged a piece at a time
    (joining the pieces first copied the column: 2.4 ms a call on TPC-DS's sales), or joined
    when they are many (a chunk read slice by slice: each piece costs a few numpy calls)."""
    if len(pieces) > PIECES_JUDGED_MAX:
        pieces = [pa.concat_arrays(pieces)]
    found = [cut.keeps(piece) for piece in pieces if len(piece)]
    if len(found) == 1:
        return found[0]
    return np.concatenate(found) if found else np.zeros(0, np.bool_)


def _fewest_first(
    table: pa.Table, cuts: Sequence[tuple[str, KeyCut]]
) -> Sequence[tuple[str, KeyCut]]:
    """The cuts ordered by the share of rows each keeps of a sample (a few hundred rows at
    each of ``SAMPLED_PIECES`` places spread over the chunk): every cut after the first looks
    only at what the ones before kept, so the first should keep least. TPC-DS Q96's store
    sales, cut by a store (a twelfth), household profiles (a tenth) and half an hour of the
    day (a fiftieth): 15.9 ms a partition's chunk in that order, 8.6 fewest first."""
    if len(cuts) < 2 or not table.num_rows:
        return cuts
    rows = table.num_rows  # pieces spread over the rows, however they are chunked
    starts = range(0, rows, max(1, rows // SAMPLED_PIECES))

    def kept(cut: tuple[str, KeyCut]) -> int:
        column = table.column(cut[0])
        pieces = [column.slice(at, SAMPLED_ROWS) for at in starts]
        sample = pa.concat_arrays([c for piece in pieces for c in piece.chunks])
        return pc.sum(cut[1].mask(sample)).as_py() or 0

    return sorted(cuts, key=kept)
