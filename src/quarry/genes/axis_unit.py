"""The device half of an axis query: unit of work `genes.axis_query` (cells and genes by filter).

A stored matrix's slices are runs of whole rows (genes, or cells when pivoted), and each slice's
zone map keeps the smallest and largest row id it holds. An axis query selects rows of the
stored axis and columns of the other; the unit
1. prunes every slice whose row ids hold no selected row (its zone map: nothing is read);
2. reads the others, keeps the selected rows, and of each row only the selected columns' values
   (renumbered to the result's columns), always as sparse rows: the result is a sparse X;
3. ships those rows: `row` (the stored row id), `columns` (result column numbers), `values`.

Pushed-back slices ship raw and the host runs the same `select_rows` on them, so an answer is
the same bits wherever a slice was filtered. The unit keeps no state across chunks: a drive's
cores run chunks at once, and a host resumes a device's rest on a replica (``RESUMABLE``).

Arguments (``AxisQueryArgs``) name the dataset version and ingests the host saw, the stored
column count and value type, and how many rows and columns are selected (-1: all). The payload
is the selected row ids (int64, sorted) then the selected column numbers (int32, sorted).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.device.unit import Chunk, Skipped, Unit, register
from quarry.genes.errors import GenesInputError, check_same_ingest
from quarry.genes.layout import ROW_ID_COLUMN, row_blocks, slice_layout
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import ranges_of
from quarry.store.partition import PartitionMeta

PROGRAM = "genes.axis_query"
ALL = -1  # every row (column) is selected: nothing in the payload for it
ROWS_MAX = 1 << 40
COLUMNS_MAX = 1 << 31
VALUE_TYPES = {"float": pa.float32(), "double": pa.float64()}


@dataclass(frozen=True)
class AxisQueryArgs(Message):
    version: str = bounded(chars_max=64)
    ingest_ids: tuple[str, ...] = bounded(items_max=100_000)
    column_count: int = bounded(low=0, high=COLUMNS_MAX)  # stored columns (cells, or genes)
    value_type: str = bounded(chars_max=16)  # "float" or "double", as Arrow names them
    rows_selected: int = bounded(low=ALL, high=ROWS_MAX)
    columns_selected: int = bounded(low=ALL, high=COLUMNS_MAX)

    def __post_init__(self) -> None:
        if self.value_type not in VALUE_TYPES:
            raise GenesInputError(f"{PROGRAM}: value type {self.value_type!r} is not stored")
        if self.columns_selected > self.column_count:
            raise GenesInputError(
                f"{PROGRAM}: {self.columns_selected} columns selected of {self.column_count}"
            )


def output_schema(value_type: pa.DataType) -> pa.Schema:
    """What the unit ships: each selected row with its selected values, sparse."""
    return pa.schema(
        [
            pa.field("row", pa.int64(), nullable=False),
            pa.field("columns", pa.list_(pa.int32()), nullable=False),
            pa.field("values", pa.list_(value_type), nullable=False),
        ]
    )


@dataclass(frozen=True)
class Selection:
    """Which stored rows and columns a query keeps. ``rows``: sorted row ids (None: all);
    ``columns``: sorted column numbers (None: all); ``column_map[c]``: the result column of
    stored column c, or -1."""

    rows: np.ndarray | None
    columns: np.ndarray | None
    column_map: np.ndarray | None

    @classmethod
    def of(cls, rows: np.ndarray | None, columns: np.ndarray | None, column_count: int):
        column_map = None
        if columns is not None:
            column_map = np.full(column_count, -1, dtype=np.int32)
            column_map[columns] = np.arange(len(columns), dtype=np.int32)
        return cls(rows, columns, column_map)

    def encode(self) -> bytes:
        rows = b"" if self.rows is None else np.asarray(self.rows, "<i8").tobytes()
        columns = b"" if self.columns is None else np.asarray(self.columns, "<i4").tobytes()
        return rows + columns

    @classmethod
    def decode(cls, args: AxisQueryArgs, payload: bytes) -> Selection:
        row_bytes = 0 if args.rows_selected == ALL else 8 * args.rows_selected
        column_bytes = 0 if args.columns_selected == ALL else 4 * args.columns_selected
        if len(payload) != row_bytes + column_bytes:
            raise GenesInputError(
                f"{PROGRAM}: the selection is {len(payload)} bytes, the request says "
                f"{row_bytes + column_bytes}"
            )
        rows = None
        if args.rows_selected != ALL:
            rows = np.frombuffer(payload[:row_bytes], dtype="<i8").astype(np.int64)
        columns = None
        if args.columns_selected != ALL:
            columns = np.frombuffer(payload[row_bytes:], dtype="<i4").astype(np.int64)
            if len(columns) and (columns.min() < 0 or columns.max() >= args.column_count):
                raise GenesInputError(f"{PROGRAM}: selected columns outside the matrix")
        for name, chosen in (("rows", rows), ("columns", columns)):
            if chosen is not None and len(chosen) > 1 and (np.diff(chosen) <= 0).any():
                raise GenesInputError(f"{PROGRAM}: selected {name} must be sorted and distinct")
        return cls.of(rows, columns, args.column_count)

    def holds_any(self, low: int, high: int) -> bool:
        """Whether a selected row id lies in [low, high] (a slice's zone map)."""
        if self.rows is None:
            return True
        first = int(np.searchsorted(self.rows, low, side="left"))
        return first < len(self.rows) and int(self.rows[first]) <= high


def select_rows(
    batch: pa.RecordBatch, selection: Selection, schema: pa.Schema
) -> pa.RecordBatch | None:
    """The selected rows of one stored slice, each with its selected columns' non-zero values
    (result column numbers); None when no row of the slice is selected."""
    row_ids = batch.column(0).to_numpy()
    if selection.rows is not None:
        position = np.searchsorted(selection.rows, row_ids)
        position = np.minimum(position, max(len(selection.rows) - 1, 0))
        keep = (
            selection.rows[position] == row_ids
            if len(selection.rows)
            else np.zeros(len(row_ids), bool)
        )
        if not keep.any():
            return None
        if not keep.all():
            batch = batch.filter(pa.array(keep))
    parts = [_select_columns(ids, block, selection) for ids, block in row_blocks(batch)]
    ids = np.concatenate([p[0] for p in parts])
    rows = sparse.vstack([p[1] for p in parts], format="csr") if len(parts) > 1 else parts[0][1]
    if len(parts) > 1:  # dense and sparse rows come apart: put them back in stored order
        order = np.argsort(ids, kind="stable")
        ids, rows = ids[order], rows[order]
    indptr = rows.indptr.astype(np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids, type=pa.int64()),
            pa.ListArray.from_arrays(pa.array(indptr), pa.array(rows.indices.astype(np.int32))),
            pa.ListArray.from_arrays(
                pa.array(indptr), pa.array(rows.data, type=schema.field(2).type.value_type)
            ),
        ],
        schema=schema,
    )


def _select_columns(
    ids: np.ndarray, block: sparse.csr_matrix | np.ndarray, selection: Selection
) -> tuple[np.ndarray, sparse.csr_matrix]:
    """The block's selected columns as a CSR block of result columns, without zeros."""
    if not sparse.issparse(block):
        kept = block if selection.columns is None else block[:, selection.columns]
        return ids, sparse.csr_matrix(kept)  # drops the zeros of dense rows
    if selection.column_map is None:
        return ids, block
    mapped = selection.column_map[block.indices]
    keep = mapped >= 0
    before = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
    indptr = before[block.indptr]
    width = len(selection.columns) if selection.columns is not None else block.shape[1]
    return ids, sparse.csr_matrix(
        (block.data[keep], mapped[keep], indptr), shape=(block.shape[0], width)
    )


@register
class AxisQuery(Unit):
    NAME = PROGRAM
    STAGES = frozenset({Stage.FULL, Stage.RAW})
    RESUMABLE = True  # each chunk's rows are whole once shipped
    CHUNKS_AT_ONCE = True  # no state across chunks
    CHUNK_SLICES_MAX = 4

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = AxisQueryArgs.from_json(request.args)
        self.selection = Selection.decode(self.args, payload)
        self.schema = output_schema(VALUE_TYPES[self.args.value_type])

    @property
    def output_schema(self) -> pa.Schema:
        return self.schema

    @classmethod
    def calibration_work(cls, batch: pa.RecordBatch, rng: np.random.Generator):
        """The host's own work on a calibration slice: every row, a tenth of its columns."""
        _, _, column_count = slice_layout(batch)
        columns = np.sort(rng.choice(column_count, column_count // 10, replace=False))
        selection = Selection.of(None, columns, column_count)
        schema = output_schema(batch.schema.field(2).type.value_type)
        return lambda: select_rows(batch, selection, schema)

    def plan(self, meta: PartitionMeta, not_here: frozenset[int]) -> list[Skipped]:
        check_same_ingest(meta, self.request, self.args.ingest_ids)
        row_column = self.row_column(meta)
        pruned = []
        for number, info in enumerate(meta.slices):
            zone = info.zone_map.get(row_column, {})
            if "min" in zone and not self.selection.holds_any(zone["min"], zone["max"]):
                pruned.append(number)
        reason = "zone map: no selected row in the slice"
        return [Skipped(r, Skip.PRUNED, reason) for r in ranges_of(pruned)]

    def slice_rows(self, meta: PartitionMeta, number: int) -> tuple[int, int] | None:
        """The slice's rows from its first selected row to its last: a slice of a stored matrix
        is a run of consecutive row ids (``rows_batch``, ``contiguous_slices``), so its zone
        map places each id. A blocked slice is then read in the blocks holding them alone."""
        info = meta.slices[number]
        zone = info.zone_map.get(self.row_column(meta), {})
        if self.selection.rows is None or "min" not in zone:
            return None
        low, high = int(zone["min"]), int(zone["max"])
        if high - low + 1 != info.rows:
            return None  # not one run of ids: position and id do not match
        rows = self.selection.rows
        first, end = np.searchsorted(rows, low), np.searchsorted(rows, high, side="right")
        if first == end:
            return None
        return int(rows[first]) - low, int(rows[end - 1]) - low + 1

    @staticmethod
    def row_column(meta: PartitionMeta) -> str:
        orientation = (meta.schema.metadata or {}).get(b"quarry.genes.orientation", b"genes")
        return ROW_ID_COLUMN[orientation.decode()]

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        batches = list(chunk.batches())
        return self.context.compute(lambda: self._selected(batches))

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:  # a raw push back: the same rows and values as on the device
            yield from self.context.compute(lambda b=batch: self._selected([b]))

    def _selected(self, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        out = []
        for batch in batches:
            if not batch.num_rows:
                continue
            slice_layout(batch)  # a slice of the layout this unit reads, checked
            selected = select_rows(batch, self.selection, self.schema)
            if selected is not None and selected.num_rows:
                out.append(selected)
        return out
