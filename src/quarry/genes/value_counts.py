"""Wilcoxon over a collection: each gene's distinct values counted per group on the devices
(unit `genes.value_counts`), ranked exactly on the host.

A rank sum needs every cell of a gene in one ranking. One stored matrix holds that on one
device (``ranks``); a collection's members each hold only their own cells. But a rank depends
only on how many values are smaller and how many are equal, so each device ships, per gene of
its slices, its distinct non-zero values with how many cells of each group hold them, and the
host merges the members' counts: per gene the runs of equal values across every member get
their average rank, the zeros of all members one run between the negatives and the positives.
The result is the rank sums, cells expressing and tie terms of the concatenated matrix, to the
bit (sums of halves are exact in float64), in ``ranks.RANK_SCHEMA``.

What ships is a few rows per gene for counts (log1p of whole counts takes a few dozen distinct
values); a matrix of continuous values ships up to its non-zeros, as shipping it would. Counts
of (gene, value, group) from different slices add up, so a matrix stored by cells works too,
and a chunk keeps no state (``RESUMABLE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.device.unit import Chunk, Unit, register
from quarry.genes import kernels
from quarry.genes.errors import GenesInputError, check_same_ingest
from quarry.genes.groups import Grouping
from quarry.genes.layout import decode_blocks, slice_layout
from quarry.genes.ranks import RANK_SCHEMA
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Stage
from quarry.store.partition import PartitionMeta

if TYPE_CHECKING:
    from quarry.genes.datasets import StoredMatrix
    from quarry.genes.dispatch import Report
    from quarry.pushdown import Pushdown

PROGRAM = "genes.value_counts"
CELLS_MAX = 1 << 31
GROUPS_MAX = 1 << 16

COUNTS_SCHEMA = pa.schema(
    [
        pa.field("gene", pa.int64(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("group", pa.int32(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class ValueCountsArgs(Message):
    ingest_ids: tuple[str, ...] = bounded(items_max=100_000)
    cell_count: int = bounded(low=0, high=CELLS_MAX)
    group_count: int = bounded(low=1, high=GROUPS_MAX)


def value_counts(
    batch: pa.RecordBatch, group_of_cell: np.ndarray, group_count: int
) -> pa.RecordBatch:
    """Per (gene, distinct non-zero value, group) of one slice: how many cells of the group
    (ranked: group >= 0) hold that value."""
    genes, values, groups, counts = [], [], [], []
    for block in decode_blocks(batch):
        matrix = sparse.csr_matrix(block.block)  # genes x cells, whichever the orientation
        if _packable(matrix, block.cell_ids, group_of_cell, group_count):
            found = _packed_counts(matrix, group_of_cell)
            if found is not None:
                rows, value, group, count = found
                genes.append(block.gene_ids[rows])
                values.append(value)
                groups.append(group)
                counts.append(count)
            continue
        cell_of_value = block.cell_ids[matrix.indices]
        group = group_of_cell[cell_of_value]
        gene_of_value = np.repeat(block.gene_ids, np.diff(matrix.indptr))
        kept = (group >= 0) & (matrix.data != 0)
        gene_of_value, value, group = gene_of_value[kept], matrix.data[kept], group[kept]
        order = np.lexsort((group, value, gene_of_value))
        gene_of_value, value, group = gene_of_value[order], value[order], group[order]
        if not len(order):
            continue
        new = np.ones(len(order), dtype=bool)
        new[1:] = (
            (gene_of_value[1:] != gene_of_value[:-1])
            | (value[1:] != value[:-1])
            | (group[1:] != group[:-1])
        )
        starts = np.flatnonzero(new)
        genes.append(gene_of_value[starts])
        values.append(value[starts].astype(np.float64))
        groups.append(group[starts])
        counts.append(np.diff(np.append(starts, len(order))))
    if not genes:
        return _empty()
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.concatenate(genes), type=pa.int64()),
            pa.array(np.concatenate(values), type=pa.float64()),
            pa.array(np.concatenate(groups).astype(np.int32)),
            pa.array(np.concatenate(counts), type=pa.int64()),
        ],
        schema=COUNTS_SCHEMA,
    )


def _packable(
    matrix: sparse.csr_matrix, cell_ids: np.ndarray, group_of_cell: np.ndarray, group_count: int
) -> bool:
    """Whether the one-sort kernel's keys hold this block: float32 values of every cell (a
    slice stored by genes), rows and groups that fit their bits."""
    return (
        matrix.dtype == np.float32
        and len(cell_ids) == len(group_of_cell)
        and matrix.shape[0] <= kernels.PACKED_ROWS_MAX
        and group_count <= kernels.PACKED_GROUPS_MAX
    )


def _packed_counts(
    matrix: sparse.csr_matrix, group_of_cell: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(row, value, group, count) of each distinct key, from one sort of packed keys."""
    keys = kernels.packed_keys(matrix.indptr, matrix.indices, matrix.data, group_of_cell)
    if not len(keys):
        return None
    new = np.ones(len(keys), dtype=bool)
    new[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(new)
    distinct = keys[starts]
    ordered = ((distinct >> kernels.VALUE_SHIFT) & 0xFFFFFFFF).astype(np.uint32)
    bits = np.where(ordered >> 31, ordered ^ np.uint32(0x80000000), ~ordered)
    value = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return (
        (distinct >> kernels.ROW_SHIFT).astype(np.int64),
        value,
        (distinct & 0xFFFF).astype(np.int32),
        np.diff(np.append(starts, len(keys))),
    )


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=COUNTS_SCHEMA)


@register
class ValueCounts(Unit):
    NAME = PROGRAM
    STAGES = frozenset({Stage.FULL, Stage.RAW})
    RESUMABLE = True
    CHUNKS_AT_ONCE = True

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = ValueCountsArgs.from_json(request.args)
        groups = np.frombuffer(payload, dtype="<i4").astype(np.int32)
        if len(groups) != self.args.cell_count:
            raise GenesInputError(
                f"{PROGRAM}: the grouping covers {len(groups)} cells, the request says "
                f"{self.args.cell_count}"
            )
        if len(groups) and groups.max() >= self.args.group_count:
            raise GenesInputError(f"{PROGRAM}: group ids beyond {self.args.group_count}")
        self.groups = groups

    @property
    def output_schema(self) -> pa.Schema:
        return COUNTS_SCHEMA

    @classmethod
    def calibration_work(cls, batch: pa.RecordBatch, rng: np.random.Generator):
        _, _, cells = slice_layout(batch)
        groups = rng.integers(0, 10, cells).astype(np.int32)
        return lambda: value_counts(batch, groups, 10)

    def plan(self, meta: PartitionMeta, not_here: frozenset[int]) -> list:
        check_same_ingest(meta, self.request, self.args.ingest_ids)
        return []

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        batches = list(chunk.batches())
        return self.context.compute(lambda: self._counted(batches))

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from self.context.compute(lambda b=batch: self._counted([b]))

    def _counted(self, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        out = []
        for batch in batches:
            if batch.num_rows:
                counted = value_counts(batch, self.groups, self.args.group_count)
                if counted.num_rows:
                    out.append(counted)
        return out


def ranks_from_counts(
    counts: pa.Table, gene_count: int, cells_in_group: np.ndarray
) -> pa.RecordBatch:
    """Rank sums, cells expressing and tie terms per (gene, group) of the cells counted
    (``cells_in_group``: ranked cells of each group, zeros included), as ``RankSums`` gives
    them for one matrix holding them all."""
    group_count = len(cells_in_group)
    ranked = int(cells_in_group.sum())
    gene = counts.column("gene").to_numpy()
    value = counts.column("value").to_numpy()
    group = counts.column("group").to_numpy().astype(np.int64)
    count = counts.column("count").to_numpy()
    order = np.lexsort((value, gene))
    gene, value, group, count = gene[order], value[order], group[order], count[order]
    new = np.ones(len(gene), dtype=bool)
    new[1:] = (gene[1:] != gene[:-1]) | (value[1:] != value[:-1])
    run = np.cumsum(new) - 1  # the (gene, value) run of each row
    run_total = np.bincount(run, count).astype(np.int64) if len(run) else np.zeros(0, np.int64)
    run_gene, run_value = gene[new], value[new]
    nonzero = np.bincount(run_gene, run_total, minlength=gene_count).astype(np.int64)
    zeros = ranked - nonzero
    negatives = np.bincount(
        run_gene, np.where(run_value < 0, run_total, 0), minlength=gene_count
    ).astype(np.int64)
    # cells before each run within its gene: the runs before it, and the zeros if positive
    before_all = np.cumsum(run_total) - run_total
    gene_start = np.cumsum(nonzero) - nonzero
    before = before_all - gene_start[run_gene] + np.where(run_value > 0, zeros[run_gene], 0)
    average = before + (run_total + 1) / 2.0
    key = gene * group_count + group
    rank_sum = np.bincount(key, count * average[run], minlength=gene_count * group_count)
    expressed = np.bincount(key, count, minlength=gene_count * group_count).astype(np.int64)
    rank_sum = rank_sum.reshape(gene_count, group_count)
    expressed = expressed.reshape(gene_count, group_count)
    zero_average = negatives + (zeros + 1) / 2.0
    rank_sum += (cells_in_group[np.newaxis, :] - expressed) * zero_average[:, np.newaxis]
    sums = np.bincount(key, count * value, minlength=gene_count * group_count)
    run_ties = run_total.astype(np.float64) ** 3 - run_total
    ties = np.bincount(run_gene, run_ties, minlength=gene_count)
    ties += zeros.astype(np.float64) ** 3 - zeros
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.repeat(np.arange(gene_count), group_count), type=pa.int64()),
            pa.array(np.tile(np.arange(group_count, dtype=np.int32), gene_count)),
            pa.array(rank_sum.ravel(), type=pa.float64()),
            pa.array(expressed.ravel(), type=pa.int64()),
            pa.array(np.repeat(ties, group_count), type=pa.float64()),
            pa.array(sums, type=pa.float64()),
        ],
        schema=RANK_SCHEMA,
    )


def collection_ranks(
    members: list[StoredMatrix], grouping: Grouping, pushdown: Pushdown
) -> tuple[pa.RecordBatch, list[Report]]:
    """Rank statistics of ``grouping`` (over the members' cells one after the other) as one
    ranking of every member's cells: value counts from every device, ranked on the host."""
    from quarry.genes.dispatch import RESULT_BATCHES_MAX, Dispatch, matrix_tasks, report_of

    tables, reports, first = [], [], 0
    for matrix in members:
        codes = grouping.group_of_cell[first : first + matrix.cell_count]
        first += matrix.cell_count
        args = ValueCountsArgs(
            ingest_ids=tuple(sorted(i.id for i in matrix.entry.ingests)),
            cell_count=matrix.cell_count,
            group_count=grouping.group_count,
        )
        payload = np.ascontiguousarray(codes, dtype="<i4").tobytes()
        dispatch = Dispatch()
        tasks = matrix_tasks(matrix, ValueCounts, args.to_json(), payload, pushdown, {}, None)
        batches = list(dispatch.run(tasks, len(tasks), RESULT_BATCHES_MAX, "quarry-genes-ranks"))
        tables.append(pa.Table.from_batches(batches, schema=COUNTS_SCHEMA))
        reports.append(report_of(matrix.dataset, pushdown, dispatch))
    assert first == len(grouping.group_of_cell), "the grouping is of other cells"
    counts = pa.concat_tables(tables)
    return ranks_from_counts(counts, members[0].gene_count, grouping.cell_counts()), reports
