"""Accumulate's inner loops, compiled: one pass over a slice's stored values for every group.

Per gene (a row of the slice) the kernel sums each group's values, turns the sums into means,
then sums each group's squared deviations from its mean (two passes over the row, which sits
in cache: the m2 never suffers the cancellation of ``E[x^2] - E[x]^2``). A sparse row's implicit
zeros each deviate from their group's mean by ``-mean``; they are added in closed form.

Written with numpy's whole-array operations the same work took a dozen passes over memory (the
gene of every value, its group, a key, three weighted ``bincount``s, the deviations): about
20 ms for a 10%-dense slice of 45 genes x 100,000 cells, against under 2 ms here (one pass,
about the speed of reading the slice). numba compiles each kernel once per machine (cached
beside this file) and is imported only when a slice is first accumulated: a device that never
ranks genes does not carry it. The kernels release the GIL, so a device's slots accumulate in
parallel.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np


@cache
def _compiled() -> tuple[Any, Any]:
    import numba

    jit = numba.njit(cache=True, nogil=True)

    @jit
    def sparse_rows(indptr, indices, data, groups, cells_in_group, mean, m2):  # pragma: no cover
        group_count = len(cells_in_group)
        sums = np.zeros(group_count)
        stored = np.zeros(group_count)
        for row in range(len(indptr) - 1):
            sums[:] = 0.0
            stored[:] = 0.0
            for j in range(indptr[row], indptr[row + 1]):
                g = groups[indices[j]]
                if g >= 0:
                    sums[g] += data[j]
                    stored[g] += 1.0
            for g in range(group_count):
                if cells_in_group[g] > 0:
                    mean[row, g] = sums[g] / cells_in_group[g]
            for j in range(indptr[row], indptr[row + 1]):
                g = groups[indices[j]]
                if g >= 0:
                    deviation = data[j] - mean[row, g]
                    m2[row, g] += deviation * deviation
            for g in range(group_count):
                m2[row, g] += (cells_in_group[g] - stored[g]) * mean[row, g] * mean[row, g]

    @jit
    def dense_rows(block, groups, cells_in_group, mean, m2):  # pragma: no cover
        group_count = len(cells_in_group)
        sums = np.zeros(group_count)
        for row in range(block.shape[0]):
            sums[:] = 0.0
            for cell in range(block.shape[1]):
                g = groups[cell]
                if g >= 0:
                    sums[g] += block[row, cell]
            for g in range(group_count):
                if cells_in_group[g] > 0:
                    mean[row, g] = sums[g] / cells_in_group[g]
            for cell in range(block.shape[1]):
                g = groups[cell]
                if g >= 0:
                    deviation = block[row, cell] - mean[row, g]
                    m2[row, g] += deviation * deviation

    return sparse_rows, dense_rows


def sparse_statistics(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    groups: np.ndarray,
    cells_in_group: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per (row, group) mean and m2 of a CSR block whose columns are cells (``groups[cell]``:
    its group, or -1 to leave it out; ``cells_in_group``: cells of each group in the block)."""
    rows, group_count = len(indptr) - 1, len(cells_in_group)
    mean, m2 = np.zeros((rows, group_count)), np.zeros((rows, group_count))
    sparse_rows, _ = _compiled()
    sparse_rows(indptr, indices, data, groups, cells_in_group.astype(np.float64), mean, m2)
    return mean, m2


def dense_statistics(
    block: np.ndarray, groups: np.ndarray, cells_in_group: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per (row, group) mean and m2 of a dense rows x cells block."""
    rows, group_count = block.shape[0], len(cells_in_group)
    mean, m2 = np.zeros((rows, group_count)), np.zeros((rows, group_count))
    _, dense_rows = _compiled()
    dense_rows(np.ascontiguousarray(block), groups, cells_in_group.astype(np.float64), mean, m2)
    return mean, m2
