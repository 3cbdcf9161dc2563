"""The one-sort rank kernel gives the per-gene kernel's rank sums, counts and tie terms, to
the bit: negative values, stored zeros, cells of no group, empty and full rows."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from quarry.genes import kernels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_rank_sums_equal_the_per_gene_kernels(seed):
    rng = np.random.default_rng(seed)
    cells, groups_count = 3_000, 7
    block = sparse.random(40, cells, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    block.data = np.round(rng.normal(1.0, 2.0, block.nnz), 1).astype(np.float32)  # ties, signs
    block.data[::11] = 0.0  # stored zeros join the zeros
    block.data[::13] = -0.0
    block = block.tolil()
    block[3, :] = 0.0  # an empty row
    block[5, :] = rng.integers(1, 4, cells).astype(np.float32)  # a row without zeros
    block = block.tocsr()
    groups = rng.integers(-1, groups_count, cells).astype(np.int32)  # -1: not ranked
    cells_in_group = np.bincount(groups[groups >= 0], minlength=groups_count)
    args = (block.indptr, block.indices, block.data, groups, cells_in_group)
    expected = kernels.sparse_rank_sums(*args)
    *found, sums = kernels.packed_sparse_rank_sums(*args)
    for name, want, got in zip(("rank_sum", "expressed", "ties"), expected, found, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)
    # each group's sum in Accumulate's order: its mean is Accumulate's to the bit
    mean, _ = kernels.sparse_statistics(*args)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(np.where(cells_in_group > 0, sums / cells_in_group, 0), mean)
