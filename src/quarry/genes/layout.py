"""Physical layout of an expression matrix: slices of whole rows as Arrow record batches.

Orientation (Skytether §5.1): genes are rows and cells are columns, so a slice holds every cell
of a run of genes and Accumulate never needs another slice to finish a gene. The pivoted
orientation (cells as rows) is supported for datasets that are appended to cell by cell; then
partial statistics of one gene come from many slices and Combine merges them.

Each slice picks one of two encodings by its density (non-zero values / values):

- dense-wide: a row id column, then one float column per cell (per gene when pivoted), named
  by the cell id so a predicate on a cell is ordinary SQL (Exp 3's `SRR3052220 > 10`).
- sparse: a row id column and two list columns, `cells: list<int32>` (column indexes) and
  `values: list<float>`, one list entry per non-zero. An Arrow list array *is* CSR: its offsets
  are `indptr`, its child arrays are `indices` and `data`, so decoding is zero-copy, and it
  costs 4 + 4 bytes per non-zero (float32) where the long (gene, cell, value) format costs
  4 or 8 more for the repeated gene id. A slice is still one batch row per gene, so row counts,
  zone maps and "a run of whole rows" mean the same thing in both encodings.

`bench/gene_layout.py` measures both (bytes stored, Accumulate time) over densities; the
default threshold below comes from there (see docs/genes.md).

A dataset stored on a cluster has ONE Arrow schema for all its slices, and the devices, not this
module, decide where slices start and end. So the stored layout (`encode_rows`, layout `rows`)
chooses the encoding per *row*, inside one schema that holds both:

    gene int64, cells list<int32> (null: the row is dense), values list<float32>

A dense row lists every cell's value in `values` (4 bytes per cell); a sparse row lists its
non-zero cells in `cells` and their values in `values` (8 bytes per non-zero). A row is dense
when that is no larger: density >= itemsize / (4 + itemsize), 0.5 for float32. Whatever rows a
device then puts together in a slice, each is already stored at its smaller size, and
`decode_blocks` hands Accumulate at most two blocks per slice (dense rows, sparse rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import sparse

from quarry.genes.matrix import ExpressionMatrix

Orientation = Literal["genes", "cells"]
Encoding = Literal["auto", "dense", "sparse"]

# Schema metadata keys every slice carries, so a device can decode a slice it has never seen
# the dataset of.
LAYOUT_KEY = b"quarry.genes.layout"  # b"dense" | b"sparse" | b"rows" (stored, per row)
ORIENTATION_KEY = b"quarry.genes.orientation"  # b"genes" | b"cells"
COLUMN_COUNT_KEY = b"quarry.genes.column_count"  # cells (genes orientation) or genes (pivoted)
VERSION_KEY = b"quarry.genes.layout_version"
LAYOUT_VERSION = b"1"

ROW_ID_COLUMN = {"genes": "gene", "cells": "cell"}
SPARSE_INDEX_COLUMN = {"genes": "cells", "cells": "genes"}
SPARSE_VALUE_COLUMN = "values"

# Slices at or above this density are stored dense-wide. Measured in bench/gene_layout.py:
# see docs/genes.md for the numbers behind it.
DENSITY_THRESHOLD = 0.5

# One Kinetic key-value (DESIGN §5); the store stripes a larger slice over several.
SLICE_BYTES_TARGET = 1 << 20

# Arrow IPC spends a field node and two buffer descriptors (about 48 bytes, rounded to 64 with
# padding) per column of every batch: for dense-wide that is per cell, per slice.
DENSE_COLUMN_BYTES_OVERHEAD = 64
# A sparse batch row carries an int64 row id and two int32 list offsets.
SPARSE_ROW_BYTES_OVERHEAD = 8 + 4 + 4
SPARSE_INDEX_BYTES = 4

# A list<int32> slice can address at most 2**31 - 1 child values.
SPARSE_VALUES_MAX = 2**31 - 1


# Rows per batch that `encode_rows` yields: bounds the host's memory while it streams a matrix
# to the cluster, whatever the matrix's size.
ROWS_BATCH_BYTES_TARGET = 8 << 20


class DecodedSlice(NamedTuple):
    """A slice as a genes x cells block, whatever orientation it was stored in."""

    gene_ids: np.ndarray  # int64, the block's rows (gene row numbers in the dataset)
    cell_ids: np.ndarray  # int64, the block's columns (cell column numbers in the dataset)
    block: sparse.csr_matrix | np.ndarray  # len(gene_ids) x len(cell_ids)


def encode_slices(
    matrix: ExpressionMatrix,
    rows_per_slice: int | None = None,
    *,
    slice_bytes_target: int | None = None,
    orientation: Orientation = "genes",
    encoding: Encoding = "auto",
    density_threshold: float = DENSITY_THRESHOLD,
) -> list[pa.RecordBatch]:
    """Cut `matrix` into slices of whole rows, each a RecordBatch that records its layout.

    Give `rows_per_slice`, or `slice_bytes_target` (default `SLICE_BYTES_TARGET`): then slices
    are cut where the estimated encoded size reaches the target (a target, not a bound: a
    single row larger than the target is a slice of its own, which the store stripes).
    `encoding` forces one encoding for every slice; "auto" picks by `density_threshold`.
    """
    assert orientation in ROW_ID_COLUMN, orientation
    assert encoding in ("auto", "dense", "sparse"), encoding
    assert 0.0 <= density_threshold <= 1.0, density_threshold
    if rows_per_slice is not None and slice_bytes_target is not None:
        raise ValueError("pass rows_per_slice or slice_bytes_target, not both")

    rows = oriented_rows(matrix, orientation)
    row_count, column_count = rows.shape
    column_names = matrix.cell_ids if orientation == "genes" else matrix.gene_names
    value_type = pa.from_numpy_dtype(rows.dtype)
    row_nonzero = _row_nonzero_counts(rows)

    if rows_per_slice is not None:
        assert rows_per_slice >= 1, rows_per_slice
        starts = np.arange(0, row_count, rows_per_slice, dtype=np.int64)
    else:
        starts = _starts_for_bytes(
            row_nonzero,
            column_count,
            rows.dtype.itemsize,
            slice_bytes_target or SLICE_BYTES_TARGET,
            encoding,
            density_threshold,
        )
    stops = np.append(starts[1:], row_count).astype(np.int64)

    dense_schema = _dense_schema(orientation, column_names, value_type)
    sparse_schema = _sparse_schema(orientation, value_type)
    nonzero_before = np.concatenate(([0], np.cumsum(row_nonzero)))
    batches = []
    # One iteration per slice, not per gene: each body is vectorized over the slice.
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        nonzero = int(nonzero_before[stop] - nonzero_before[start])
        density = nonzero / ((stop - start) * column_count) if column_count else 0.0
        dense = encoding == "dense" or (encoding == "auto" and density >= density_threshold)
        metadata = {
            LAYOUT_KEY: b"dense" if dense else b"sparse",
            ORIENTATION_KEY: orientation.encode(),
            COLUMN_COUNT_KEY: str(column_count).encode(),
            VERSION_KEY: LAYOUT_VERSION,
        }
        row_ids = np.arange(start, stop, dtype=np.int64)
        if dense:
            batch = _dense_batch(rows[start:stop], row_ids, dense_schema.with_metadata(metadata))
        else:
            batch = _sparse_batch(rows[start:stop], row_ids, sparse_schema.with_metadata(metadata))
        assert batch.num_rows == stop - start
        batches.append(batch)
    assert sum(b.num_rows for b in batches) == row_count
    return batches


def stored_schema(
    orientation: Orientation, value_type: pa.DataType, column_count: int
) -> pa.Schema:
    """The one schema of a stored matrix: row id, cell (or gene) numbers, values; per-row encoding.

    The layout keys sit in the schema metadata, which the store keeps with the partition, so a
    device decodes any slice of the dataset without asking the host.
    """
    assert orientation in ROW_ID_COLUMN, orientation
    assert column_count >= 0, column_count
    return pa.schema(
        [
            pa.field(ROW_ID_COLUMN[orientation], pa.int64(), nullable=False),
            # Null for a dense row: its values list every column, so there is nothing to index.
            pa.field(SPARSE_INDEX_COLUMN[orientation], pa.list_(pa.int32()), nullable=True),
            pa.field(SPARSE_VALUE_COLUMN, pa.list_(value_type), nullable=False),
        ],
        metadata={
            LAYOUT_KEY: b"rows",
            ORIENTATION_KEY: orientation.encode(),
            COLUMN_COUNT_KEY: str(column_count).encode(),
            VERSION_KEY: LAYOUT_VERSION,
        },
    )


def row_density_threshold(value_dtype: np.dtype) -> float:
    """Density at which a dense row is no larger than a sparse one (0.5 for float32).

    dense: itemsize per column; sparse: (4-byte column number + itemsize) per non-zero.
    """
    itemsize = np.dtype(value_dtype).itemsize
    return itemsize / (SPARSE_INDEX_BYTES + itemsize)


def encode_rows(
    matrix: ExpressionMatrix,
    *,
    orientation: Orientation = "genes",
    density_threshold: float | None = None,
    batch_bytes_target: int = ROWS_BATCH_BYTES_TARGET,
) -> tuple[pa.Schema, list[tuple[int, int]], int]:
    """Plan the stored layout: (schema, row ranges of the batches, dense row count).

    `rows_batch(oriented_rows(matrix, orientation), schema, start, stop)` builds each batch,
    so a caller can stream a large matrix without holding its encoded copy.
    `density_threshold` None picks the byte-optimal rule of `row_density_threshold`.
    """
    assert orientation in ROW_ID_COLUMN, orientation
    rows = oriented_rows(matrix, orientation)
    schema = stored_schema(orientation, pa.from_numpy_dtype(rows.dtype), rows.shape[1])
    ranges, dense_count = plan_rows(
        rows, density_threshold=density_threshold, batch_bytes_target=batch_bytes_target
    )
    return schema, ranges, dense_count


def plan_rows(
    rows: sparse.csr_matrix | np.ndarray,
    *,
    density_threshold: float | None = None,
    batch_bytes_target: int = ROWS_BATCH_BYTES_TARGET,
) -> tuple[list[tuple[int, int]], int]:
    """Row ranges of about `batch_bytes_target` encoded bytes each, and the dense row count.

    Sized from each row's own encoding, so a batch of dense rows and one of sparse rows carry
    about the same bytes: the host's memory per batch is bounded whatever the density.
    """
    assert batch_bytes_target > 0, batch_bytes_target
    row_count, column_count = rows.shape
    threshold = (
        row_density_threshold(rows.dtype) if density_threshold is None else density_threshold
    )
    assert 0.0 <= threshold <= 1.0, threshold
    nonzero = _row_nonzero_counts(rows)
    dense = _dense_rows(nonzero, column_count, threshold)
    itemsize = rows.dtype.itemsize
    row_bytes = np.where(
        dense,
        8 + column_count * itemsize,
        SPARSE_ROW_BYTES_OVERHEAD + nonzero * (SPARSE_INDEX_BYTES + itemsize),
    )
    bytes_before = np.cumsum(row_bytes) - row_bytes
    starts = np.flatnonzero(np.diff(bytes_before // batch_bytes_target, prepend=-1))
    stops = np.append(starts[1:], row_count) if row_count else starts
    ranges = [(int(a), int(b)) for a, b in zip(starts, stops, strict=True)]
    return ranges, int(dense.sum())


def rows_batch(
    rows: sparse.csr_matrix | np.ndarray,
    schema: pa.Schema,
    start: int,
    stop: int,
    *,
    density_threshold: float | None = None,
    first_row: int = 0,
) -> pa.RecordBatch:
    """Rows [start, stop) in the stored layout, each row dense or sparse.

    rows: the matrix as stored rows (`oriented_rows(matrix, orientation)`), or one block of
    them whose first row is row `first_row` of the matrix (the stored row ids are the
    matrix's, so blocks stored one after the other make one matrix).
    """
    _, _, column_count = slice_layout_of_schema(schema)
    assert rows.shape[1] == column_count, (rows.shape, column_count)
    threshold = (
        row_density_threshold(rows.dtype) if density_threshold is None else density_threshold
    )
    chunk = rows[start:stop]
    nonzero = _row_nonzero_counts(chunk)
    dense = _dense_rows(nonzero, column_count, threshold)
    lengths = np.where(dense, column_count, nonzero)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    assert offsets[-1] <= SPARSE_VALUES_MAX, "a batch may hold at most 2**31 - 1 values"
    if dense.all() and not sparse.issparse(chunk):
        values = np.ascontiguousarray(chunk).ravel()  # the common dense case: no scatter
        indexes = np.zeros(0, dtype=np.int32)
    else:
        values = np.empty(int(offsets[-1]), dtype=rows.dtype)
        indexes = _scatter_sparse_rows(chunk, ~dense, offsets, values)
        if dense.any():
            dense_values = chunk[dense]
            dense_values = dense_values.toarray() if sparse.issparse(dense_values) else dense_values
            positions = offsets[:-1][dense][:, np.newaxis] + np.arange(column_count)
            values[positions.ravel()] = np.asarray(dense_values, dtype=rows.dtype).ravel()

    assert len(indexes) == int(nonzero[~dense].sum()), "sparse rows lost or gained values"
    index_offsets = np.concatenate(([0], np.cumsum(np.where(dense, 0, nonzero))))
    index_lists = pa.ListArray.from_arrays(
        pa.array(index_offsets.astype(np.int32)), pa.array(indexes), mask=pa.array(dense)
    )
    value_lists = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(values, type=schema.field(2).type.value_type)
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(first_row + start, first_row + stop, dtype=np.int64)),
            index_lists,
            value_lists,
        ],
        schema=schema,
    )
    assert batch.num_rows == stop - start
    return batch


def iter_rows_batches(
    matrix: ExpressionMatrix,
    *,
    orientation: Orientation = "genes",
    density_threshold: float | None = None,
    batch_bytes_target: int = ROWS_BATCH_BYTES_TARGET,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The matrix in the stored layout as a schema and a lazy stream of batches."""
    assert orientation in ROW_ID_COLUMN, orientation
    rows = oriented_rows(matrix, orientation)  # once: pivoting a large matrix is not free
    schema = stored_schema(orientation, pa.from_numpy_dtype(rows.dtype), rows.shape[1])
    batches = iter_block_batches(
        [rows],
        schema,
        density_threshold=density_threshold,
        batch_bytes_target=batch_bytes_target,
    )
    return schema, batches


def iter_block_batches(
    blocks: Iterable[sparse.csr_matrix | np.ndarray],
    schema: pa.Schema,
    *,
    density_threshold: float | None = None,
    batch_bytes_target: int = ROWS_BATCH_BYTES_TARGET,
) -> Iterator[pa.RecordBatch]:
    """Consecutive blocks of stored rows (each with every column) as batches of `schema`.

    Row ids continue from one block to the next, and each block is planned and encoded on its
    own: only one block and one batch are in memory at a time, so a matrix larger than memory
    streams from a reader that yields it block by block.
    """
    _, _, column_count = slice_layout_of_schema(schema)
    value_type = schema.field(2).type.value_type
    first_row = 0
    for block in blocks:
        assert block.shape[1] == column_count, (block.shape, column_count)
        assert pa.from_numpy_dtype(block.dtype) == value_type, (block.dtype, value_type)
        ranges, _ = plan_rows(
            block, density_threshold=density_threshold, batch_bytes_target=batch_bytes_target
        )
        for start, stop in ranges:
            yield rows_batch(
                block,
                schema,
                start,
                stop,
                density_threshold=density_threshold,
                first_row=first_row,
            )
        first_row += block.shape[0]
        del block  # before the next block is read: one block in memory at a time


def row_blocks(batch: pa.RecordBatch) -> list[tuple[np.ndarray, sparse.csr_matrix | np.ndarray]]:
    """A slice of the stored layout as (row ids, rows x columns block) per encoding present,
    in the stored orientation (genes x cells, or cells x genes when pivoted): no transpose."""
    layout, _, column_count = slice_layout(batch)
    assert layout == "rows", layout
    index_lists = batch.column(1)
    dense_count = index_lists.null_count
    if dense_count == 0:
        parts = [(False, batch)]
    elif dense_count == batch.num_rows:
        parts = [(True, batch)]
    else:
        is_dense = index_lists.is_null()
        parts = [(True, batch.filter(is_dense)), (False, batch.filter(pc.invert(is_dense)))]
    return [
        (
            part.column(0).to_numpy(),
            _dense_block(part, column_count) if dense else _sparse_block(part, column_count),
        )
        for dense, part in parts
    ]


def decode_blocks(batch: pa.RecordBatch) -> list[DecodedSlice]:
    """A slice as one block per encoding present (at most two for the stored layout)."""
    layout, orientation, column_count = slice_layout(batch)
    if layout != "rows":
        return [decode_slice(batch)]
    blocks = []
    for row_ids, block in row_blocks(batch):
        all_columns = np.arange(column_count, dtype=np.int64)
        if orientation == "genes":
            blocks.append(DecodedSlice(row_ids, all_columns, block))
        else:
            transposed = block.T.tocsr() if sparse.issparse(block) else block.T
            blocks.append(DecodedSlice(all_columns, row_ids, transposed))
    return blocks


def _scatter_sparse_rows(
    chunk: sparse.csr_matrix | np.ndarray,
    sparse_rows: np.ndarray,
    offsets: np.ndarray,
    values: np.ndarray,
) -> np.ndarray:
    """Write the non-zeros of the sparse rows into `values`; return their column numbers."""
    if not sparse_rows.any():
        return np.zeros(0, dtype=np.int32)
    # A copy: eliminate_zeros and sort_indices work in place and must not touch the input.
    block = sparse.csr_matrix(chunk[sparse_rows], copy=True)
    block.eliminate_zeros()
    block.sort_indices()
    per_row = np.diff(block.indptr)
    # Each non-zero goes to its row's first value slot plus its rank within the row.
    row_of_value = np.repeat(np.arange(len(per_row)), per_row)
    rank_in_row = np.arange(block.nnz) - block.indptr[row_of_value]
    values[offsets[:-1][sparse_rows][row_of_value] + rank_in_row] = block.data
    return block.indices.astype(np.int32, copy=False)


def _dense_rows(nonzero: np.ndarray, column_count: int, threshold: float) -> np.ndarray:
    if column_count == 0:
        return np.zeros(len(nonzero), dtype=bool)
    return nonzero / column_count >= threshold


def _dense_block(part: pa.RecordBatch, column_count: int) -> np.ndarray:
    value_lists = part.column(2)
    lengths = np.diff(value_lists.offsets.to_numpy())
    assert (lengths == column_count).all(), "a dense row must list a value for every column"
    flat = value_lists.flatten().to_numpy()
    return flat.reshape(part.num_rows, column_count)


def _sparse_block(part: pa.RecordBatch, column_count: int) -> sparse.csr_matrix:
    index_lists, value_lists = part.column(1), part.column(2)
    offsets = value_lists.offsets.to_numpy()
    index_offsets = index_lists.offsets.to_numpy()
    assert np.array_equal(np.diff(offsets), np.diff(index_offsets)), "list lengths differ"
    indptr = offsets - offsets[0]
    return sparse.csr_matrix(
        (value_lists.flatten().to_numpy(), index_lists.flatten().to_numpy(), indptr),
        shape=(part.num_rows, column_count),
    )


def slice_layout_of_schema(schema: pa.Schema) -> tuple[str, str, int]:
    """(encoding, orientation, column count) from a schema's metadata, checked."""
    metadata = schema.metadata or {}
    if metadata.get(VERSION_KEY) != LAYOUT_VERSION:
        raise ValueError(
            f"not a quarry.genes slice of layout version {LAYOUT_VERSION.decode()} "
            f"(schema metadata: {sorted(metadata)})"
        )
    layout = metadata[LAYOUT_KEY].decode()
    orientation = metadata[ORIENTATION_KEY].decode()
    assert layout in ("dense", "sparse", "rows"), layout
    assert orientation in ROW_ID_COLUMN, orientation
    assert schema.names[0] == ROW_ID_COLUMN[orientation], schema.names[0]
    return layout, orientation, int(metadata[COLUMN_COUNT_KEY])


def decode_slice(batch: pa.RecordBatch) -> DecodedSlice:
    """The genes x cells block of one slice, with the gene and cell numbers it covers."""
    layout, orientation, column_count = slice_layout(batch)
    if layout == "rows":
        blocks = decode_blocks(batch)
        if len(blocks) == 1:
            return blocks[0]
        # Mixed rows: one CSR block (dense rows become full CSR rows), rows in slice order.
        return _merge_blocks(blocks, orientation, batch.column(0).to_numpy())
    row_ids = batch.column(0).to_numpy()
    assert row_ids.dtype == np.int64
    if layout == "dense":
        assert batch.num_columns == column_count + 1, (batch.num_columns, column_count)
        if batch.num_rows == 0 or column_count == 0:
            block: sparse.csr_matrix | np.ndarray = np.zeros(
                (batch.num_rows, column_count), dtype=_value_dtype(batch)
            )
        else:
            # to_tensor gathers every column in one C++ call: no per-cell Python work.
            block = batch.drop_columns([batch.schema.names[0]]).to_tensor(row_major=True).to_numpy()
    else:
        indexes, values = batch.column(1), batch.column(2)
        offsets = indexes.offsets.to_numpy()
        assert np.array_equal(offsets, values.offsets.to_numpy()), "list offsets differ"
        # int32 like the cell indexes, so scipy keeps both arrays without copying them.
        indptr = offsets - offsets[0]
        block = sparse.csr_matrix(
            (values.flatten().to_numpy(), indexes.flatten().to_numpy(), indptr),
            shape=(batch.num_rows, column_count),
        )
    all_columns = np.arange(column_count, dtype=np.int64)
    if orientation == "genes":
        return DecodedSlice(row_ids, all_columns, block)
    transposed = block.T.tocsr() if sparse.issparse(block) else block.T
    return DecodedSlice(all_columns, row_ids, transposed)


def slice_layout(batch: pa.RecordBatch) -> tuple[str, str, int]:
    """(encoding, orientation, column count) from a slice's schema metadata, checked."""
    return slice_layout_of_schema(batch.schema)


def _merge_blocks(
    blocks: list[DecodedSlice], orientation: str, row_ids: np.ndarray
) -> DecodedSlice:
    """Two blocks of one slice as one CSR block whose rows follow `row_ids` (slice order)."""
    if orientation == "genes":
        stacked = sparse.vstack([sparse.csr_matrix(b.block) for b in blocks], format="csr")
        stacked_ids = np.concatenate([b.gene_ids for b in blocks])
        order = np.argsort(stacked_ids, kind="stable")
        position = np.searchsorted(stacked_ids[order], row_ids)
        return DecodedSlice(row_ids, blocks[0].cell_ids, stacked[order[position]])
    stacked = sparse.hstack([sparse.csc_matrix(b.block) for b in blocks], format="csc")
    stacked_ids = np.concatenate([b.cell_ids for b in blocks])
    order = np.argsort(stacked_ids, kind="stable")
    position = np.searchsorted(stacked_ids[order], row_ids)
    return DecodedSlice(blocks[0].gene_ids, row_ids, stacked[:, order[position]].tocsr())


def oriented_rows(
    matrix: ExpressionMatrix, orientation: Orientation
) -> sparse.csr_matrix | np.ndarray:
    values = matrix.values
    if orientation == "genes":
        return values
    return values.T.tocsr() if sparse.issparse(values) else values.T


def _row_nonzero_counts(rows: sparse.csr_matrix | np.ndarray) -> np.ndarray:
    if sparse.issparse(rows):
        # Count stored values that are not zero: explicit zeros must not inflate the density.
        before = np.concatenate(([0], np.cumsum(rows.data != 0, dtype=np.int64)))
        return before[rows.indptr[1:]] - before[rows.indptr[:-1]]
    return np.count_nonzero(rows, axis=1).astype(np.int64)


def _starts_for_bytes(
    row_nonzero: np.ndarray,
    column_count: int,
    itemsize: int,
    target_bytes: int,
    encoding: Encoding,
    density_threshold: float,
) -> np.ndarray:
    """First row of each slice, so that each slice's estimated bytes stay near the target."""
    assert target_bytes > 0, target_bytes
    if len(row_nonzero) == 0:
        return np.zeros(0, dtype=np.int64)
    dense_row = 8 + column_count * itemsize
    sparse_row = SPARSE_ROW_BYTES_OVERHEAD + row_nonzero * (SPARSE_INDEX_BYTES + itemsize)
    if encoding == "dense":
        row_bytes = np.full(len(row_nonzero), dense_row, dtype=np.int64)
    elif encoding == "sparse":
        row_bytes = sparse_row
    else:
        row_density = row_nonzero / column_count if column_count else np.zeros(len(row_nonzero))
        row_bytes = np.where(row_density >= density_threshold, dense_row, sparse_row)
    # The per-column metadata of a dense batch is paid once per slice: keep room for it.
    if encoding != "sparse":
        target_bytes = max(target_bytes - column_count * DENSE_COLUMN_BYTES_OVERHEAD, 1)
    bytes_before = np.cumsum(row_bytes) - row_bytes
    slice_number = bytes_before // target_bytes
    return np.flatnonzero(np.diff(slice_number, prepend=-1)).astype(np.int64)


def _dense_schema(
    orientation: Orientation, column_names: np.ndarray, value_type: pa.DataType
) -> pa.Schema:
    # Built once per dataset; every dense slice shares it (only metadata differs).
    fields = [pa.field(ROW_ID_COLUMN[orientation], pa.int64(), nullable=False)]
    fields += [pa.field(str(name), value_type, nullable=False) for name in column_names]
    return pa.schema(fields)


def _sparse_schema(orientation: Orientation, value_type: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            pa.field(ROW_ID_COLUMN[orientation], pa.int64(), nullable=False),
            pa.field(SPARSE_INDEX_COLUMN[orientation], pa.list_(pa.int32()), nullable=False),
            pa.field(SPARSE_VALUE_COLUMN, pa.list_(value_type), nullable=False),
        ]
    )


def _dense_batch(
    rows: sparse.csr_matrix | np.ndarray, row_ids: np.ndarray, schema: pa.Schema
) -> pa.RecordBatch:
    block = rows.toarray() if sparse.issparse(rows) else np.asarray(rows)
    row_count, column_count = block.shape
    # Column-major copy: column j becomes one contiguous run that Arrow wraps without copying.
    by_column = np.ascontiguousarray(block.T)
    buffer = pa.py_buffer(by_column)
    value_type = schema.field(1).type if column_count else pa.float32()
    columns = [pa.array(row_ids, type=pa.int64())]
    # One Arrow array object per column is inherent to dense-wide; no values are touched here.
    columns += [
        pa.Array.from_buffers(value_type, row_count, [None, buffer], offset=j * row_count)
        for j in range(column_count)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _sparse_batch(
    rows: sparse.csr_matrix | np.ndarray, row_ids: np.ndarray, schema: pa.Schema
) -> pa.RecordBatch:
    # A copy: eliminate_zeros and sort_indices work in place and must not touch the input.
    block = sparse.csr_matrix(rows, copy=True)
    block.eliminate_zeros()
    block.sort_indices()
    assert block.nnz <= SPARSE_VALUES_MAX, block.nnz
    offsets = pa.array(block.indptr.astype(np.int32))
    indexes = pa.ListArray.from_arrays(offsets, pa.array(block.indices.astype(np.int32)))
    values = pa.ListArray.from_arrays(
        offsets, pa.array(block.data, type=schema.field(2).type.value_type)
    )
    return pa.RecordBatch.from_arrays(
        [pa.array(row_ids, type=pa.int64()), indexes, values], schema=schema
    )


def _value_dtype(batch: pa.RecordBatch) -> np.dtype:
    if batch.num_columns > 1:
        return np.dtype(batch.schema.field(1).type.to_pandas_dtype())
    return np.dtype(np.float32)
