"""Ranks from value counts (a collection's Wilcoxon) equal one matrix's rank sums, whichever
way its cells are split into members and whichever kernel counted them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import sparse

from quarry.genes import kernels
from quarry.genes.layout import rows_batch, stored_schema
from quarry.genes.value_counts import COUNTS_SCHEMA, ranks_from_counts, value_counts


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_counts_of_split_cells_rank_as_the_whole(dtype):
    rng = np.random.default_rng(4)
    genes, cells, group_count = 30, 2_000, 5
    block = sparse.random(genes, cells, density=0.3, format="csr", random_state=rng)
    block.data = np.round(rng.normal(0.5, 2.0, block.nnz), 1)
    block = block.astype(dtype)
    groups = rng.integers(-1, group_count, cells).astype(np.int32)
    cells_in_group = np.bincount(groups[groups >= 0], minlength=group_count)
    whole = kernels.sparse_rank_sums(
        block.indptr, block.indices, block.data.astype(np.float64), groups, cells_in_group
    )
    tables = []
    for first, end in ((0, 700), (700, 1_500), (1_500, cells)):  # three members' cells
        part = block[:, first:end].tocsr()
        schema = stored_schema("genes", pa.from_numpy_dtype(dtype), end - first)
        batch = rows_batch(part, schema, 0, genes)
        tables.append(pa.Table.from_batches([value_counts(batch, groups[first:end], group_count)]))
    ranks = ranks_from_counts(pa.concat_tables(tables).cast(COUNTS_SCHEMA), genes, cells_in_group)
    got = ranks.to_pandas()
    np.testing.assert_array_equal(got["rank_sum"].to_numpy().reshape(genes, -1), whole[0])
    np.testing.assert_array_equal(got["expressed"].to_numpy().reshape(genes, -1), whole[1])
    np.testing.assert_array_equal(got["ties"].to_numpy().reshape(genes, -1)[:, 0], whole[2])
