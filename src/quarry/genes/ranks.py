"""Rank sums per gene and group: the device half of the Wilcoxon rank-sum test.

A slice stored by genes holds whole genes across every cell, so each gene's ranks (over the
cells of the request's grouping: those with a group) are local to the slice that holds it: a
device ranks its genes, sums the ranks per group and ships one row per (gene, group), never a
value. Per row it also counts the cells expressing the gene (non-zero; scanpy's ``pts``) and
scipy's tie term ``sum(t^3 - t)`` over the gene's runs of equal values (the zeros of a sparse
row are one run). The host turns rank sums into z-scores (``wilcoxon``).

A sparse float32 slice is ranked with one sort for all its genes (``kernels.
packed_sparse_rank_sums``: a 64-bit key per value, numpy's vectorized sort, one scan), several
times faster than a compiled argsort per gene and the same bits (rank sums are sums of halves).

Rank sums of a union of groups add up; the tie term belongs to the gene. A gene is never split
across slices, so partials of the same (gene, group) never need merging: ``combine_ranks``
refuses them rather than add ranks of two different rankings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
from scipy import sparse, special

from quarry.genes import kernels
from quarry.genes.layout import decode_blocks, slice_layout

RANK_SCHEMA = pa.schema(
    [
        pa.field("gene", pa.int64(), nullable=False),
        pa.field("group", pa.int32(), nullable=False),
        pa.field("rank_sum", pa.float64(), nullable=False),
        pa.field("expressed", pa.int64(), nullable=False),
        pa.field("ties", pa.float64(), nullable=False),
        # the group's values summed in the order Accumulate sums them: its mean, to the bit
        pa.field("sum", pa.float64(), nullable=False),
    ]
)


class NotRankable(ValueError):
    """A slice whose genes are cut across slices (stored by cells): its ranks are not local."""


def rank_sums(
    slice_batch: pa.RecordBatch, group_of_cell: np.ndarray, group_count: int
) -> pa.RecordBatch:
    """Per (gene of the slice, group): the sum of the gene's average ranks over the cells in
    the group, and the cells expressing it; per gene the tie term. Cells of no group (-1) take
    no part in the ranking."""
    _, orientation, _ = slice_layout(slice_batch)
    if orientation != "genes":
        raise NotRankable("ranks need every cell of a gene in one slice: store the matrix by genes")
    groups = np.asarray(group_of_cell, dtype=np.int32)
    cells_in_group = np.bincount(groups[groups >= 0], minlength=group_count)
    batches = []
    for block in decode_blocks(slice_batch):
        if not len(block.gene_ids) and batches:
            continue
        values = block.block
        if sparse.issparse(values) and _packable(values, group_count):
            rank_sum, expressed, ties, sums = kernels.packed_sparse_rank_sums(
                values.indptr, values.indices, values.data, groups, cells_in_group
            )
        elif sparse.issparse(values):
            rank_sum, expressed, ties = kernels.sparse_rank_sums(
                values.indptr, values.indices, values.data, groups, cells_in_group
            )
            sums = _group_sums(values, groups, group_count)
        else:
            rank_sum, expressed, ties = kernels.dense_rank_sums(values, groups, cells_in_group)
            sums = _group_sums(values, groups, group_count)
        batches.append(_rows(block.gene_ids, rank_sum, expressed, ties, sums))
    return combine_ranks(batches)


def _packable(values: sparse.csr_matrix, group_count: int) -> bool:
    """Whether a block's keys fit the one-sort kernel (float32 values, rows and groups that
    fit their bits); the per-gene kernel gives the same bits otherwise."""
    return (
        values.data.dtype == np.float32
        and values.shape[0] <= kernels.PACKED_ROWS_MAX
        and group_count <= kernels.PACKED_GROUPS_MAX
    )


def _group_sums(values: sparse.csr_matrix | np.ndarray, groups: np.ndarray, group_count: int):
    """Per (row, group) the sum of the row's values over the group's cells, each key's values
    added in the order Accumulate's kernels add them (a row's stored values, or its cells, in
    order; ``bincount`` adds its input in order): the mean it gives is Accumulate's to the bit,
    so a Wilcoxon request needs no moments request for its fold changes."""
    rows = values.shape[0]
    if sparse.issparse(values):
        group = groups[values.indices]
        row = np.repeat(np.arange(rows, dtype=np.int64), np.diff(values.indptr))
        kept = group >= 0
        key = row[kept] * group_count + group[kept]
        weights = values.data[kept].astype(np.float64)
    else:
        kept = np.flatnonzero(groups >= 0)
        key = (np.arange(rows, dtype=np.int64)[:, np.newaxis] * group_count + groups[kept]).ravel()
        weights = np.asarray(values[:, kept], dtype=np.float64).ravel()
    sums = np.bincount(key, weights, minlength=rows * group_count)
    return sums.reshape(rows, group_count)


def _rows(
    genes: np.ndarray,
    rank_sum: np.ndarray,
    expressed: np.ndarray,
    ties: np.ndarray,
    sums: np.ndarray,
) -> pa.RecordBatch:
    group_count = rank_sum.shape[1]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.repeat(genes, group_count), type=pa.int64()),
            pa.array(np.tile(np.arange(group_count, dtype=np.int32), len(genes))),
            pa.array(rank_sum.ravel(), type=pa.float64()),
            pa.array(expressed.ravel(), type=pa.int64()),
            pa.array(np.repeat(ties, group_count), type=pa.float64()),
            pa.array(sums.ravel(), type=pa.float64()),
        ],
        schema=RANK_SCHEMA,
    )


def combine_ranks(partials: Iterable[pa.RecordBatch | pa.Table]) -> pa.RecordBatch:
    """Partials of disjoint genes as one batch, sorted by gene and group."""
    tables = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in partials]
    table = pa.concat_tables(tables) if tables else RANK_SCHEMA.empty_table()
    gene, group = table.column("gene").to_numpy(), table.column("group").to_numpy()
    order = np.lexsort((group, gene))
    gene, group = gene[order], group[order]
    if len(gene) > 1 and ((gene[1:] == gene[:-1]) & (group[1:] == group[:-1])).any():
        raise NotRankable("a gene's ranks came from two slices: ranks of one gene are not local")
    columns = [column.combine_chunks() for column in table.take(pa.array(order)).columns]
    return pa.RecordBatch.from_arrays(columns, schema=RANK_SCHEMA)


def select_rank_sides(
    ranks: pa.RecordBatch | pa.Table, sides: Sequence[Sequence[int]]
) -> list[pa.RecordBatch]:
    """Per side (a union of groups, labelled by its place in ``sides``): rank sums and cells
    expressing add up over its groups; the tie term is the gene's."""
    table = ranks if isinstance(ranks, pa.Table) else pa.Table.from_batches([ranks])
    gene = table.column("gene").to_numpy()
    group = table.column("group").to_numpy()
    genes, row = np.unique(gene, return_inverse=True)
    out = []
    for label, side in enumerate(sides):
        wanted = np.isin(group, np.asarray(side, dtype=np.int64))
        rank_sum = np.bincount(row[wanted], table.column("rank_sum").to_numpy()[wanted],
                               minlength=len(genes))  # fmt: skip
        expressed = np.bincount(row[wanted], table.column("expressed").to_numpy()[wanted],
                                minlength=len(genes))  # fmt: skip
        ties = np.zeros(len(genes))
        ties[row] = table.column("ties").to_numpy()
        sums = np.bincount(row[wanted], table.column("sum").to_numpy()[wanted],
                           minlength=len(genes))  # fmt: skip
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(genes, type=pa.int64()),
                    pa.array(np.full(len(genes), label, dtype=np.int32)),
                    pa.array(rank_sum, type=pa.float64()),
                    pa.array(np.rint(expressed).astype(np.int64)),
                    pa.array(ties, type=pa.float64()),
                    pa.array(sums, type=pa.float64()),
                ],
                schema=RANK_SCHEMA,
            )
        )
    return out


def wilcoxon(
    rank_sum: np.ndarray,
    group_cells: int,
    ranked_cells: int,
    ties: np.ndarray,
    tie_correct: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """z-scores and two-sided normal p-values of the rank-sum test of a group of
    ``group_cells`` against the other ``ranked_cells - group_cells``, as scanpy computes them:
    ``(R - n (N + 1) / 2) / sqrt(n m (N + 1) / 12)``, the deviation scaled by
    ``sqrt(1 - ties / (N^3 - N))`` when ``tie_correct``; 0 where that is 0/0."""
    n, total = float(group_cells), float(ranked_cells)
    m = total - n
    std = np.sqrt(n * m * (total + 1) / 12.0) * np.ones_like(rank_sum)
    if tie_correct:
        std = std * np.sqrt(1.0 - ties / (total**3 - total))
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (rank_sum - n * (total + 1) / 2.0) / std
    scores[np.isnan(scores)] = 0.0  # a gene constant over the ranked cells: no evidence
    pvals = 2.0 * special.ndtr(-np.abs(scores))
    return scores, pvals
