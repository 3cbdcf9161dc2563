"""Slices: whole rows, an encoding chosen by density, and a schema that says how to read them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import sparse

from quarry.genes import ExpressionMatrix, accumulate, decode_slice, encode_slices
from quarry.genes.layout import (
    COLUMN_COUNT_KEY,
    DENSITY_THRESHOLD,
    LAYOUT_KEY,
    ORIENTATION_KEY,
    slice_layout,
)


def make_matrix(values, dataset: str = "synthetic") -> ExpressionMatrix:
    gene_count, cell_count = values.shape
    genes = pa.table({"gene": [f"g{i}" for i in range(gene_count)]})
    cells = pa.table({"cell": [f"c{i}" for i in range(cell_count)]})
    return ExpressionMatrix(values, genes, cells, dataset=dataset)


def mixed_density_values() -> np.ndarray:
    """10 dense genes, then 10 genes with 2 non-zeros each."""
    rng = np.random.default_rng(0)
    values = rng.uniform(1, 2, (20, 50)).astype(np.float32)
    values[10:] = 0
    values[10:, :2] = 3.0
    return values


def ipc_roundtrip(batch: pa.RecordBatch) -> pa.RecordBatch:
    """What a device reads back from its key-value store."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


@pytest.mark.parametrize("encoding", ["dense", "sparse"])
@pytest.mark.parametrize("orientation", ["genes", "cells"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_slices_decode_to_the_matrix(encoding, orientation, dtype):
    values = mixed_density_values().astype(dtype)
    matrix = make_matrix(sparse.csr_matrix(values) if encoding == "sparse" else values)
    slices = encode_slices(matrix, rows_per_slice=6, encoding=encoding, orientation=orientation)
    rebuilt = np.zeros_like(values)
    for batch in slices:
        decoded = decode_slice(ipc_roundtrip(batch))
        block = decoded.block.toarray() if sparse.issparse(decoded.block) else decoded.block
        assert block.dtype == dtype
        rebuilt[np.ix_(decoded.gene_ids, decoded.cell_ids)] = block
    np.testing.assert_array_equal(rebuilt, values)
    expected_rows = values.shape[0] if orientation == "genes" else values.shape[1]
    assert sum(batch.num_rows for batch in slices) == expected_rows
    assert [slice_layout(batch)[0] for batch in slices] == [encoding] * len(slices)


def test_each_slice_chooses_its_encoding_by_density():
    slices = encode_slices(make_matrix(mixed_density_values()), rows_per_slice=10)
    metadata = [batch.schema.metadata for batch in slices]
    assert [m[LAYOUT_KEY] for m in metadata] == [b"dense", b"sparse"]
    assert all(m[ORIENTATION_KEY] == b"genes" and m[COLUMN_COUNT_KEY] == b"50" for m in metadata)
    assert 2 / 50 < DENSITY_THRESHOLD <= 1.0


def test_dense_slices_name_one_column_per_cell():
    batch = encode_slices(make_matrix(mixed_density_values()), rows_per_slice=5)[0]
    assert batch.schema.names == ["gene"] + [f"c{i}" for i in range(50)]
    assert batch.column("c3").type == pa.float32()
    assert batch.column("gene").to_pylist() == [0, 1, 2, 3, 4]


def test_sparse_slices_are_one_list_row_per_gene():
    values = mixed_density_values()[10:]
    batch = encode_slices(make_matrix(values), rows_per_slice=10)[0]
    assert batch.schema.names == ["gene", "cells", "values"]
    assert batch.column("cells").to_pylist() == [[0, 1]] * 10
    assert batch.column("values").to_pylist() == [[3.0, 3.0]] * 10


def ipc_body_bytes(batch: pa.RecordBatch) -> int:
    def stream_bytes(batches):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            for item in batches:
                writer.write_batch(item)
        return sink.getvalue().size

    return stream_bytes([batch]) - stream_bytes([])


@pytest.mark.parametrize("density", [0.05, 0.9])
def test_bytes_target_keeps_slices_near_the_target(density):
    rng = np.random.default_rng(1)
    values = sparse.random(400, 300, density=density, format="csr", dtype=np.float32, rng=rng)
    target = 64 << 10
    slices = encode_slices(make_matrix(values), slice_bytes_target=target)
    assert len(slices) > 1
    row_bytes_max = 300 * 4 + 8
    assert all(ipc_body_bytes(batch) <= target + row_bytes_max for batch in slices)
    # Slices are runs of whole rows, in order, covering every gene once.
    gene_ids = np.concatenate([batch.column("gene").to_numpy() for batch in slices])
    np.testing.assert_array_equal(gene_ids, np.arange(400))


def test_a_row_larger_than_the_target_is_a_slice_of_its_own():
    slices = encode_slices(make_matrix(np.ones((3, 100), np.float32)), slice_bytes_target=10)
    assert [batch.num_rows for batch in slices] == [1, 1, 1]


def test_accumulate_reads_a_stored_slice():
    values = mixed_density_values()
    group_of_cell = (np.arange(50) % 3).astype(np.int32)
    for batch in encode_slices(make_matrix(values), rows_per_slice=10):
        stored = ipc_roundtrip(batch)
        assert accumulate(stored, group_of_cell, 3).equals(accumulate(batch, group_of_cell, 3))


@pytest.mark.parametrize("encoding", ["dense", "sparse"])
def test_a_slice_of_a_slice_decodes_to_its_rows(encoding):
    """A device may cut a batch (a range of genes); offsets must follow the cut."""
    values = mixed_density_values()
    batch = encode_slices(make_matrix(values), rows_per_slice=20, encoding=encoding)[0]
    decoded = decode_slice(batch.slice(8, 5))
    block = decoded.block.toarray() if sparse.issparse(decoded.block) else decoded.block
    np.testing.assert_array_equal(decoded.gene_ids, np.arange(8, 13))
    np.testing.assert_array_equal(block, values[8:13])


def test_decode_refuses_a_batch_that_is_not_a_slice():
    with pytest.raises(ValueError, match="not a quarry.genes slice"):
        decode_slice(pa.record_batch({"gene": [1, 2]}))


def test_rows_per_slice_and_bytes_target_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        encode_slices(make_matrix(np.ones((2, 2))), rows_per_slice=1, slice_bytes_target=10)
