"""Differential expression as the plan of Skytether Figure 1: Accumulate -> Combine -> TStat.

- `accumulate` runs where a slice lives (a device): per gene and per cell group it reduces the
  slice to (n, mean, m2), m2 being the sum of squared deviations from the mean. A slice of
  thousands of cells becomes a few numbers per group; that is the data movement saved.
- `combine` merges partial statistics of the same (gene, group) from any number of slices or
  devices (Chan, Golub & LeVeque's parallel update), and is the algebraic aggregate of
  DESIGN §3.3: associative and independent of arrival order.
- `tstat` runs on the host over two sets of statistics: Student's or Welch's t, two-sided
  p-values, log2 fold change as scanpy defines it, and Benjamini-Hochberg adjusted p-values.

Everything is float64; no Python loop touches a gene or a cell (Accumulate's loops are
compiled: ``genes.kernels``). Accumulate is two-pass within each gene's row (mean first, then
squared deviations from it), so its m2 never suffers the cancellation of the one-pass
`E[x^2] - E[x]^2` (see docs/genes.md: that is why scanpy reports t = 0 where a group's
expression is constant).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
from scipy import sparse, special

from quarry.genes import kernels
from quarry.genes.layout import DecodedSlice, decode_blocks, slice_layout

Method = Literal["welch", "student"]

# A group id for cells that belong to no group of interest: Accumulate skips them.
NO_GROUP = -1

# The fold-change pseudo count scanpy adds to both means, so log2 never sees 0.
FOLD_CHANGE_PSEUDO_COUNT = 1e-9

PARTIAL_SCHEMA = pa.schema(
    [
        pa.field("gene", pa.int64(), nullable=False),
        pa.field("group", pa.int32(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("mean", pa.float64(), nullable=False),
        pa.field("m2", pa.float64(), nullable=False),
    ]
)


def accumulate(
    slice_batch: pa.RecordBatch, group_of_cell: np.ndarray, group_count: int
) -> pa.RecordBatch:
    """Per (gene, group) count, mean and m2 of one slice.

    slice_batch:   a slice from `layout.encode_slices` (any encoding or orientation).
    group_of_cell: int array over all cells of the dataset (cell column number -> group id in
                   [0, group_count), or NO_GROUP to leave the cell out).
    group_count:   number of groups; the result has one row per gene of the slice and group,
                   gene-major, with n = 0, mean = 0, m2 = 0 for a group with no cell here.
    """
    group_of_cell = np.asarray(group_of_cell)
    assert group_of_cell.ndim == 1 and group_of_cell.dtype.kind in "iu", group_of_cell.dtype
    assert group_count >= 0, group_count
    _, orientation, column_count = slice_layout(slice_batch)
    if orientation == "genes" and len(group_of_cell) != column_count:
        raise ValueError(
            f"group_of_cell covers {len(group_of_cell)} cells but the slice's dataset has "
            f"{column_count}; pass one group id per cell of the dataset"
        )
    blocks = decode_blocks(slice_batch)
    partials = [
        _accumulate_block(block, group_of_cell, group_count)
        for block in blocks
        if len(block.gene_ids) or len(blocks) == 1
    ]
    if len(partials) == 1:
        return partials[0]
    # A slice of the stored layout with dense and sparse rows: merge the two blocks' partials
    # (disjoint genes when genes are rows, the same genes over other cells when pivoted).
    return combine(partials)


def _accumulate_block(
    decoded: DecodedSlice, group_of_cell: np.ndarray, group_count: int
) -> pa.RecordBatch:
    gene_ids, cell_ids, block = decoded
    if len(cell_ids) and cell_ids.max() >= len(group_of_cell):
        raise ValueError(
            f"group_of_cell covers {len(group_of_cell)} cells but the slice has cell number "
            f"{int(cell_ids.max())}; pass one group id per cell of the dataset"
        )
    groups = group_of_cell[cell_ids].astype(np.int64)
    assert groups.size == 0 or (groups.min() >= NO_GROUP and groups.max() < group_count), (
        "group ids must be in [-1, group_count)"
    )
    if sparse.issparse(block):
        count, mean, m2 = _accumulate_sparse(block, groups, group_count)
    else:
        count, mean, m2 = _accumulate_dense(block, groups, group_count)
    gene_count = len(gene_ids)
    assert count.shape == (gene_count, group_count)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.repeat(gene_ids, group_count), type=pa.int64()),
            pa.array(np.tile(np.arange(group_count, dtype=np.int32), gene_count)),
            pa.array(count.ravel(), type=pa.int64()),
            pa.array(mean.ravel(), type=pa.float64()),
            pa.array(m2.ravel(), type=pa.float64()),
        ],
        schema=PARTIAL_SCHEMA,
    )


def _accumulate_dense(
    block: np.ndarray, groups: np.ndarray, group_count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cells_in_group = np.bincount(groups[groups >= 0], minlength=group_count)
    # float64 sums: the sums of thousands of float32 values need the precision
    mean, m2 = kernels.dense_statistics(block, groups.astype(np.int32), cells_in_group)
    return np.broadcast_to(cells_in_group, mean.shape), mean, m2


def _accumulate_sparse(
    block: sparse.csr_matrix, groups: np.ndarray, group_count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cells_in_group = np.bincount(groups[groups >= 0], minlength=group_count)
    mean, m2 = kernels.sparse_statistics(
        block.indptr, block.indices, block.data, groups.astype(np.int32), cells_in_group
    )
    return np.broadcast_to(cells_in_group, mean.shape), mean, m2


def combine(partials: Iterable[pa.RecordBatch | pa.Table]) -> pa.RecordBatch:
    """Merge partial statistics of the same (gene, group); the result is sorted by both.

    n = sum n_i, mean = sum n_i mean_i / n, m2 = sum m2_i + sum n_i (mean_i - mean)^2, the
    k-way form of Chan et al.'s pairwise update m2 = m2_a + m2_b + d^2 n_a n_b / n. Every term
    of m2 is non-negative, so nothing cancels. Rows are put in a canonical order before the
    sums, so the result is bit-for-bit the same whatever order the partials arrive in.
    """
    tables = [pa.Table.from_batches([p]) if isinstance(p, pa.RecordBatch) else p for p in partials]
    for table in tables:
        _check_partial_schema(table.schema)
    if not tables:
        return pa.RecordBatch.from_pylist([], schema=PARTIAL_SCHEMA)
    table = pa.concat_tables(tables).combine_chunks()
    gene = table.column("gene").to_numpy()
    group = table.column("group").to_numpy().astype(np.int64)
    count = table.column("n").to_numpy()
    mean = table.column("mean").to_numpy()
    m2 = table.column("m2").to_numpy()
    assert (count >= 0).all() and (m2 >= 0).all(), "partials with negative n or m2"

    order, starts, longest = _runs_by_key(gene, group)
    total, merged_mean, merged_m2 = kernels.combine_runs(order, starts, longest, count, mean, m2)
    first = order[starts]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(gene[first], type=pa.int64()),
            pa.array(group[first].astype(np.int32)),
            pa.array(total, type=pa.int64()),
            pa.array(merged_mean, type=pa.float64()),
            pa.array(merged_m2, type=pa.float64()),
        ],
        schema=PARTIAL_SCHEMA,
    )


def _runs_by_key(gene: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows in (gene, group) order, where each key's run starts, and the longest run.
    Keys are dense (genes x groups): a counting sort places every row in two passes, where
    sorting five keys over every row took most of a Combine's time."""
    if not len(gene):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    span = int(group.max()) - int(group.min()) + 1
    key_count = (int(gene.max()) - int(gene.min()) + 1) * span
    if key_count <= 4 * len(gene) + 1024:
        return kernels.runs_by_key((gene - gene.min()) * span + (group - group.min()))
    order = np.lexsort((group, gene))  # ids far apart: a comparison sort
    gene, group = gene[order], group[order]
    new_key = np.ones(len(order), dtype=bool)
    new_key[1:] = (gene[1:] != gene[:-1]) | (group[1:] != group[:-1])
    starts = np.flatnonzero(new_key)
    return order, starts, int(np.diff(np.append(starts, len(order))).max())


def select_groups(
    stats: pa.RecordBatch | pa.Table, groups: Sequence[int], as_group: int = 0
) -> pa.RecordBatch:
    """Statistics of the union of `groups`, per gene, labelled `as_group`.

    The union of disjoint cell groups is a Combine of their statistics: no slice is read again.
    """
    table = stats if isinstance(stats, pa.Table) else pa.Table.from_batches([stats])
    _check_partial_schema(table.schema)
    wanted = np.isin(table.column("group").to_numpy(), np.asarray(groups, dtype=np.int64))
    chosen = table.filter(pa.array(wanted))
    relabelled = chosen.set_column(
        1,
        PARTIAL_SCHEMA.field("group"),
        pa.array(np.full(chosen.num_rows, as_group, dtype=np.int32)),
    )
    return combine([relabelled])


def select_sides(
    stats: pa.RecordBatch | pa.Table, sides: Sequence[Sequence[int]]
) -> list[pa.RecordBatch]:
    """Statistics of each side (a union of groups), labelled by its place in ``sides``.

    A side of one group is its rows relabelled: what ``select_groups`` gives, the same bits
    (a Combine passes single partials through), in one pass for every such side, so asking for
    every group of a grouping at once (``rank_genes_groups``) costs one filter, not one per
    group."""
    singles = [i for i, side in enumerate(sides) if len(side) == 1]
    batches = [select_groups(stats, side, as_group=i) for i, side in enumerate(sides)
               if len(side) != 1]  # fmt: skip
    if not singles:
        return batches
    table = stats if isinstance(stats, pa.Table) else pa.Table.from_batches([stats])
    _check_partial_schema(table.schema)
    group = table.column("group").to_numpy()
    side_of = np.full(max(int(group.max(initial=0)), *(sides[i][0] for i in singles)) + 1, -1)
    side_of[[sides[i][0] for i in singles]] = singles
    label = side_of[group]
    kept = np.flatnonzero(label >= 0)
    order = kept[np.lexsort((label[kept], table.column("gene").to_numpy()[kept]))]
    chosen = table.take(pa.array(order)).combine_chunks()
    relabelled = chosen.set_column(
        1, PARTIAL_SCHEMA.field("group"), pa.array(label[order].astype(np.int32))
    )
    return [*relabelled.to_batches(), *batches]


@dataclass(frozen=True)
class GroupArrays:
    """Statistics of every group as genes x groups arrays: one group's union with any others
    costs a few vectorized passes (``union``), not a Combine of the rows."""

    genes: np.ndarray
    n: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, stats: pa.RecordBatch | pa.Table, group_count: int) -> GroupArrays:
        table = stats if isinstance(stats, pa.Table) else pa.Table.from_batches([stats])
        _check_partial_schema(table.schema)
        gene = table.column("gene").to_numpy()
        genes, row = np.unique(gene, return_inverse=True)
        group = table.column("group").to_numpy()
        shape = (len(genes), group_count)
        n, mean, m2 = np.zeros(shape, dtype=np.int64), np.zeros(shape), np.zeros(shape)
        n[row, group] = table.column("n").to_numpy()
        mean[row, group] = table.column("mean").to_numpy()
        m2[row, group] = table.column("m2").to_numpy()
        return cls(genes, n, mean, m2)

    def union(self, groups: Sequence[int], as_group: int) -> pa.RecordBatch:
        """The statistics of the union of ``groups``, per gene (Chan et al.'s k-way update,
        as ``combine``; one group passes through)."""
        index = np.asarray(groups, dtype=np.int64)
        n, mean, m2 = self.n[:, index], self.mean[:, index], self.m2[:, index]
        if len(index) == 1:
            total, merged_mean, merged_m2 = n[:, 0], mean[:, 0], m2[:, 0]
        else:
            total = n.sum(axis=1)
            merged_mean = _safe_divide((n * mean).sum(axis=1), total)
            merged_m2 = (m2 + n * (mean - merged_mean[:, np.newaxis]) ** 2).sum(axis=1)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.genes, type=pa.int64()),
                pa.array(np.full(len(self.genes), as_group, dtype=np.int32)),
                pa.array(total, type=pa.int64()),
                pa.array(merged_mean, type=pa.float64()),
                pa.array(merged_m2, type=pa.float64()),
            ],
            schema=PARTIAL_SCHEMA,
        )


def rest(stats: pa.RecordBatch | pa.Table, group: int, group_count: int) -> pa.RecordBatch:
    """Statistics of every cell outside `group`: the Combine of all other groups.

    Cells not in any labelled group belong to the rest too; callers give them a group id of
    their own (e.g. `group_count - 1` for unlabelled cells) so that Accumulate counts them.
    """
    assert 0 <= group < group_count, (group, group_count)
    others = [g for g in range(group_count) if g != group]
    return select_groups(stats, others, as_group=NO_GROUP)


def tstat(
    stats_a: pa.RecordBatch | pa.Table,
    stats_b: pa.RecordBatch | pa.Table,
    method: Method = "welch",
    *,
    log1p_base: float | None = None,
) -> pa.Table:
    """Compare group a with group b gene by gene: t, p, BH-adjusted p, log2 fold change.

    Each input holds one group's statistics (columns gene, n, mean, m2; gene unique). Genes are
    matched by the `gene` column (numbers, or names when comparing datasets); genes in only one
    input are left out. Where t is undefined (both groups constant with equal means) score and
    p-value are NaN, as scipy reports them; BH then counts that gene as p = 1, as scanpy does.

    log2 fold change is scanpy's: log2((expm1(mean_a) + 1e-9) / (expm1(mean_b) + 1e-9)),
    for log1p data (with `log1p_base` when the data was log-transformed in another base).
    """
    assert method in ("welch", "student"), method
    table_a = _single_group(stats_a, "stats_a")
    table_b = _single_group(stats_b, "stats_b")
    genes_a = table_a.column("gene").to_numpy(zero_copy_only=False)
    genes_b = table_b.column("gene").to_numpy(zero_copy_only=False)
    _, index_a, index_b = np.intersect1d(genes_a, genes_b, assume_unique=True, return_indices=True)
    # Keep the order of the first input, so results read like the dataset.
    keep_order = np.argsort(index_a, kind="stable")
    index_a, index_b = index_a[keep_order], index_b[keep_order]

    n_a = table_a.column("n").to_numpy()[index_a].astype(np.float64)
    n_b = table_b.column("n").to_numpy()[index_b].astype(np.float64)
    if len(n_a) and (n_a.min() < 2 or n_b.min() < 2):
        raise ValueError("each group needs at least 2 cells for a t-test")
    mean_a = table_a.column("mean").to_numpy()[index_a]
    mean_b = table_b.column("mean").to_numpy()[index_b]
    m2_a = table_a.column("m2").to_numpy()[index_a]
    m2_b = table_b.column("m2").to_numpy()[index_b]
    var_a = m2_a / (n_a - 1)
    var_b = m2_b / (n_b - 1)

    with np.errstate(divide="ignore", invalid="ignore"):
        if method == "welch":
            share_a, share_b = var_a / n_a, var_b / n_b
            df = (share_a + share_b) ** 2 / (share_a**2 / (n_a - 1) + share_b**2 / (n_b - 1))
            # Both variances zero: df is 0/0 but t is ±inf or NaN anyway; scipy uses 1.
            df = np.where(np.isnan(df), 1.0, df)
            denominator = np.sqrt(share_a + share_b)
        else:
            df = n_a + n_b - 2.0
            pooled = (m2_a + m2_b) / df
            denominator = np.sqrt(pooled * (1.0 / n_a + 1.0 / n_b))
        score = (mean_a - mean_b) / denominator
    # scipy's own t distribution tail, as scipy.stats.ttest_ind computes it.
    pval = 2.0 * special.stdtr(df, -np.abs(score))
    pval_adj = benjamini_hochberg(np.where(np.isnan(pval), 1.0, pval))
    pval_adj = np.where(np.isnan(pval), np.nan, pval_adj)
    logfoldchange = log2_fold_change(mean_a, mean_b, log1p_base=log1p_base)

    return pa.table(
        {
            "gene": table_a.column("gene").take(pa.array(index_a)),
            "score": score,
            "pval": pval,
            "pval_adj": pval_adj,
            "logfoldchange": logfoldchange,
            "df": np.broadcast_to(df, score.shape).astype(np.float64),
            "n_a": n_a.astype(np.int64),
            "n_b": n_b.astype(np.int64),
            "mean_a": mean_a,
            "mean_b": mean_b,
            "var_a": var_a,
            "var_b": var_b,
        }
    )


def log2_fold_change(
    mean_a: np.ndarray, mean_b: np.ndarray, *, log1p_base: float | None = None
) -> np.ndarray:
    """scanpy's log2 fold change of group means of log1p data (rank_genes_groups)."""
    if log1p_base is None:
        expm1_a, expm1_b = np.expm1(mean_a), np.expm1(mean_b)
    else:
        scale = np.log(log1p_base)
        expm1_a, expm1_b = np.expm1(mean_a * scale), np.expm1(mean_b * scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log2((expm1_a + FOLD_CHANGE_PSEUDO_COUNT) / (expm1_b + FOLD_CHANGE_PSEUDO_COUNT))


def benjamini_hochberg(pvals: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values, as statsmodels' multipletests(method="fdr_bh")."""
    pvals = np.asarray(pvals, dtype=np.float64)
    assert not np.isnan(pvals).any(), "replace NaN p-values before adjusting"
    count = len(pvals)
    if count == 0:
        return pvals.copy()
    order = np.argsort(pvals)
    # p / (rank / count), in statsmodels' order of operations so that even subnormal p-values
    # round the same way.
    ranked = pvals[order] / (np.arange(1, count + 1) / float(count))
    monotone = np.minimum.accumulate(ranked[::-1])[::-1]
    adjusted = np.empty(count)
    adjusted[order] = np.minimum(monotone, 1.0)
    return adjusted


def _single_group(stats: pa.RecordBatch | pa.Table, label: str) -> pa.Table:
    table = stats if isinstance(stats, pa.Table) else pa.Table.from_batches([stats])
    for name in ("gene", "n", "mean", "m2"):
        if name not in table.column_names:
            raise ValueError(f"{label} has no {name!r} column (columns: {table.column_names})")
    if "group" in table.column_names and len(table.column("group").unique()) > 1:
        raise ValueError(f"{label} holds several groups; select one (select_groups, rest)")
    if len(table.column("gene").unique()) != table.num_rows:
        raise ValueError(f"{label} lists a gene more than once; combine partials first")
    return table


def _check_partial_schema(schema: pa.Schema) -> None:
    # Names and types, not nullability: Arrow compute results come back nullable.
    if schema.names != PARTIAL_SCHEMA.names or schema.types != PARTIAL_SCHEMA.types:
        raise ValueError(
            f"not partial statistics: expected columns {PARTIAL_SCHEMA.names} "
            f"({PARTIAL_SCHEMA.types}), got {schema.names} ({schema.types})"
        )


def _safe_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (a group with no cells)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.maximum(denominator, 1), 0.0)
