"""The layout a cluster stores: one schema, each row dense or sparse, any cut of rows a slice."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import sparse

from quarry.genes import ExpressionMatrix, accumulate, combine, encode_slices
from quarry.genes.layout import (
    decode_blocks,
    decode_slice,
    iter_rows_batches,
    oriented_rows,
    row_density_threshold,
    rows_batch,
    stored_schema,
)


def mixed(seed: int = 0, genes: int = 70, cells: int = 50, dtype=np.float32) -> ExpressionMatrix:
    rng = np.random.default_rng(seed)
    density = rng.uniform(0.0, 1.0, genes)
    values = np.where(
        rng.random((genes, cells)) < density[:, np.newaxis], rng.lognormal(0, 1, (genes, cells)), 0
    ).astype(dtype)
    csr = sparse.csr_matrix(values)
    csr.data[::7] = 0  # explicit zeros: stored, but not expression
    return ExpressionMatrix(
        csr,
        pa.table({"gene": [f"g{i}" for i in range(genes)]}),
        pa.table({"cell": [f"c{i}" for i in range(cells)]}),
    )


def whole(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


@pytest.mark.parametrize("orientation", ["genes", "cells"])
def test_rows_decode_to_the_matrix(orientation):
    matrix = mixed()
    schema, batches = iter_rows_batches(matrix, orientation=orientation, batch_bytes_target=900)
    batches = list(batches)
    assert len(batches) > 3 and all(b.schema.equals(schema) for b in batches)
    decoded = decode_slice(whole(batches))
    block = decoded.block.toarray() if sparse.issparse(decoded.block) else decoded.block
    expected = matrix.values.toarray()[decoded.gene_ids][:, decoded.cell_ids]
    np.testing.assert_array_equal(block, expected)


def test_each_row_takes_the_smaller_encoding():
    matrix = mixed(seed=1)
    schema = stored_schema("genes", pa.float32(), matrix.cell_count)
    batch = rows_batch(matrix.values, schema, 0, matrix.gene_count)
    nonzero = (matrix.values.toarray() != 0).sum(axis=1)
    dense = batch.column("cells").is_null().to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(dense, nonzero / matrix.cell_count >= 0.5)
    # Dense exactly where 4 bytes per cell are no more than 8 bytes per non-zero.
    np.testing.assert_array_equal(dense, 4 * matrix.cell_count <= 8 * nonzero)
    assert row_density_threshold(np.float32) == 0.5
    assert row_density_threshold(np.float64) == pytest.approx(2 / 3)


def test_a_slice_with_both_kinds_of_rows_is_two_blocks():
    matrix = mixed(seed=2)
    schema = stored_schema("genes", pa.float32(), matrix.cell_count)
    batch = rows_batch(matrix.values, schema, 0, matrix.gene_count)
    blocks = decode_blocks(batch)
    assert [sparse.issparse(b.block) for b in blocks] == [False, True]
    assert sorted(np.concatenate([b.gene_ids for b in blocks])) == list(range(matrix.gene_count))


@pytest.mark.parametrize("orientation", ["genes", "cells"])
def test_accumulate_does_not_depend_on_where_slices_are_cut(orientation):
    """A device may cut the stored rows anywhere; ipc round trips and offsets included."""
    matrix = mixed(seed=3)
    rng = np.random.default_rng(3)
    groups = rng.integers(-1, 4, matrix.cell_count).astype(np.int32)
    schema, batches = iter_rows_batches(matrix, orientation=orientation)
    full = whole(list(batches))
    reference = combine([accumulate(full, groups, 4)])
    cuts = [0, 5, 6, 31, full.num_rows]
    pieces = [_ipc_round_trip(full.slice(a, b - a)) for a, b in zip(cuts, cuts[1:], strict=False)]
    pieced = combine([accumulate(piece, groups, 4) for piece in pieces])
    if orientation == "genes":
        assert pieced.equals(reference)  # a gene's statistics come from its row alone
    else:
        for column in ("n", "mean", "m2"):
            np.testing.assert_allclose(
                pieced.column(column).to_numpy(),
                reference.column(column).to_numpy(),
                rtol=1e-12,
                atol=1e-12,
            )
    in_memory = combine([accumulate(b, groups, 4) for b in encode_slices(matrix, rows_per_slice=9)])
    for column in ("n", "mean", "m2"):
        np.testing.assert_allclose(
            pieced.column(column).to_numpy(),
            in_memory.column(column).to_numpy(),
            rtol=1e-12,
            atol=1e-12,
        )
    assert oriented_rows(matrix, orientation).shape[0] == full.num_rows


def _ipc_round_trip(batch: pa.RecordBatch) -> pa.RecordBatch:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()
