"""The device halves of out-of-core gene statistics: units `genes.accumulate_expm1` and
`genes.clipped_sums` (highly variable genes, scanpy's `seurat` and `seurat_v3` flavours).

- `genes.accumulate_expm1` is Accumulate (n, mean, m2 per gene and group, cached per grouping)
  over ``expm1(x * ln(base))``: scanpy's `seurat` flavour measures the dispersion of the counts
  a log1p matrix came from. expm1(0) is 0, so a sparse row stays sparse and the kernels are the
  moments' own.
- `genes.clipped_sums`: per gene the sum and the sum of squares of ``min(x, clip[gene])``, the
  second pass of `seurat_v3` (the clip values come from the host's loess fit of the first
  pass's variances against the means). Sums of disjoint cells add up, so each chunk's rows ship
  as they are and the host adds them by gene; a chunk keeps no state (``RESUMABLE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.device.unit import Chunk, Unit, register
from quarry.genes.device import Accumulate
from quarry.genes.errors import GenesInputError, check_same_ingest
from quarry.genes.layout import decode_blocks, slice_layout
from quarry.genes.stats import accumulate
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Stage
from quarry.store.partition import PartitionMeta

GENES_MAX = 1 << 31

SUMS_SCHEMA = pa.schema(
    [
        pa.field("gene", pa.int64(), nullable=False),
        pa.field("sum", pa.float64(), nullable=False),
        pa.field("sum_squares", pa.float64(), nullable=False),
    ]
)


def expm1_batch(batch: pa.RecordBatch, scale: float) -> pa.RecordBatch:
    """A stored slice with each value ``v`` replaced by ``expm1(v * scale)`` (same schema, the
    matrix's value type: scanpy computes it in the matrix's type too)."""
    values = batch.column(2)
    flat = values.values.to_numpy(zero_copy_only=False)
    if scale != 1.0:
        flat = flat * flat.dtype.type(scale)
    changed = pa.ListArray.from_arrays(
        values.offsets, pa.array(np.expm1(flat), type=values.type.value_type)
    )
    return pa.RecordBatch.from_arrays(
        [batch.column(0), batch.column(1), changed], schema=batch.schema
    )


def accumulate_expm1(
    slice_batch: pa.RecordBatch, group_of_cell: np.ndarray, group_count: int, scale: float = 1.0
) -> pa.RecordBatch:
    return accumulate(expm1_batch(slice_batch, scale), group_of_cell, group_count)


@register
class Expm1Accumulate(Accumulate):
    """Accumulate over expm1 of the stored values (the log1p base's scale in the grouping's
    place: the request's ``version`` carries it into the cache key, see ``scale``)."""

    NAME = "genes.accumulate_expm1"
    KERNEL = staticmethod(accumulate_expm1)

    def partial(self, batch: pa.RecordBatch, groups: np.ndarray) -> pa.RecordBatch:
        return accumulate_expm1(batch, groups, self.args.group_count, self.scale)

    @property
    def scale(self) -> float:
        """ln(base) of a matrix log1p-transformed in another base, else 1: the host names it
        in the version (``<version>@<scale>``) so a cached result is of this scale."""
        _, _, scale = self.args.version.partition("@")
        return float(scale) if scale else 1.0


@dataclass(frozen=True)
class ClippedSumsArgs(Message):
    ingest_ids: tuple[str, ...] = bounded(items_max=100_000)
    gene_count: int = bounded(low=0, high=GENES_MAX)
    cell_count: int = bounded(low=0, high=GENES_MAX)


def clipped_sums(
    batch: pa.RecordBatch, clip: np.ndarray, cells: np.ndarray | None
) -> pa.RecordBatch:
    """Per gene of the slice: the sum and the sum of squares of its values clipped at
    ``clip[gene]``, over the cells where ``cells`` is true (None: all)."""
    genes, sums, squares = [], [], []
    for block in decode_blocks(batch):
        values = block.block
        if cells is not None:
            kept = cells[block.cell_ids]
            values = values[:, kept] if not kept.all() else values
        limit = clip[block.gene_ids]
        if sparse.issparse(values):
            rows = sparse.csr_matrix(values)
            row_of_value = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))
            data = np.minimum(rows.data.astype(np.float64), limit[row_of_value])
            sums.append(np.bincount(row_of_value, data, minlength=rows.shape[0]))
            squares.append(np.bincount(row_of_value, data * data, minlength=rows.shape[0]))
        else:
            data = np.minimum(np.asarray(values, dtype=np.float64), limit[:, np.newaxis])
            sums.append(data.sum(axis=1))
            squares.append(np.square(data).sum(axis=1))
        genes.append(block.gene_ids)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.concatenate(genes), type=pa.int64()),
            pa.array(np.concatenate(sums), type=pa.float64()),
            pa.array(np.concatenate(squares), type=pa.float64()),
        ],
        schema=SUMS_SCHEMA,
    )


@register
class ClippedSums(Unit):
    """Per gene, sums of clipped values (seurat_v3's second pass). Payload: the clip value of
    every gene (float64), then one byte per cell (1: the cell takes part)."""

    NAME = "genes.clipped_sums"
    STAGES = frozenset({Stage.FULL, Stage.RAW})
    RESUMABLE = True
    CHUNKS_AT_ONCE = True

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = ClippedSumsArgs.from_json(request.args)
        clip_bytes = 8 * self.args.gene_count
        if len(payload) != clip_bytes + self.args.cell_count:
            raise GenesInputError(
                f"{self.NAME}: payload of {len(payload)} bytes, expected "
                f"{clip_bytes + self.args.cell_count}"
            )
        self.clip = np.frombuffer(payload[:clip_bytes], dtype="<f8").astype(np.float64)
        cells = np.frombuffer(payload[clip_bytes:], dtype=np.uint8).astype(bool)
        self.cells = None if cells.all() else cells

    @property
    def output_schema(self) -> pa.Schema:
        return SUMS_SCHEMA

    @classmethod
    def calibration_work(cls, batch: pa.RecordBatch, rng: np.random.Generator):
        genes = int(batch.column(0).to_numpy().max()) + 1
        clip = rng.uniform(0.1, 1.0, genes)
        return lambda: clipped_sums(batch, clip, None)

    def plan(self, meta: PartitionMeta, not_here: frozenset[int]) -> list:
        check_same_ingest(meta, self.request, self.args.ingest_ids)
        return []

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        batches = list(chunk.batches())
        return self.context.compute(lambda: self._sums(batches))

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from self.context.compute(lambda b=batch: self._sums([b]))

    def _sums(self, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        out = []
        for batch in batches:
            if batch.num_rows:
                slice_layout(batch)
                out.append(clipped_sums(batch, self.clip, self.cells))
        return out
