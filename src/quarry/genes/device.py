"""The device half of differential expression: unit of work `genes.accumulate` (Figure 1, §7).

It runs in the one device loop (``quarry.device.loop``), which decides per slice whether to
accumulate it here or push it back raw (forced by the request, or the controller's Eq. 1 on
measured drive time). For each partition of the request the unit
1. finds its cached Combine for (dataset version, grouping), if any, and which slices it covers
   (the loop records those as ``cached``: not read again);
2. accumulates every slice the loop runs here (inside ``context.compute``, so a slow drive is
   slow);
3. Combines the partition (cache + new partials), stores that in its cache when it covers more
   than before, and reduces it to the statistics of the one or two cell sets the host compares
   (`select_groups`: the group, and the reference or "rest");
4. ships those side statistics (a few dozen bytes per gene), combined over its partitions.

On the host the same unit completes what was pushed back: it accumulates each raw slice and
reduces them to side statistics the same way. A slice is either executed, cached or pushed back,
never two of them, so the host's Combine of everything counts every cell once.

Arguments (``AccumulateArgs``) name the dataset version and ingests the host saw, the grouping
digest and shape, and the sides; the payload is the group id per cell (int32 little-endian), or
empty: then, if anything must be computed, the device answers at once that it needs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from quarry.device.unit import Chunk, Skipped, Unit, register
from quarry.genes.errors import GenesInputError, check_same_ingest
from quarry.genes.groups import grouping_digest
from quarry.genes.layout import slice_layout
from quarry.genes.ranks import RANK_SCHEMA, combine_ranks, rank_sums, select_rank_sides
from quarry.genes.stats import PARTIAL_SCHEMA, accumulate, combine, select_sides
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import ranges_of
from quarry.store.partition import PartitionMeta

PROGRAM = "genes.accumulate"
# Groupings whose statistics a device keeps per dataset version; the oldest-named others go.
CACHED_GROUPINGS_MAX = 64
SIDES_MAX = 4096  # one per group of a grouping (rank_genes_groups), or the two of a comparison
GROUPS_MAX = 1 << 20
CELLS_MAX = 1 << 31
OUTPUT_ROWS_PER_BATCH = 1 << 16


@dataclass(frozen=True)
class AccumulateArgs(Message):
    version: str = bounded(chars_max=64)
    ingest_ids: tuple[str, ...] = bounded(items_max=100_000)
    grouping: str = bounded(chars_max=128)  # digest of the group id per cell
    group_count: int = bounded(low=1, high=GROUPS_MAX)
    cell_count: int = bounded(low=0, high=CELLS_MAX)
    sides: tuple[tuple[int, ...], ...] = bounded(items_max=GROUPS_MAX)  # group ids per side

    def __post_init__(self) -> None:
        if not 1 <= len(self.sides) <= SIDES_MAX:
            raise GenesInputError(f"{PROGRAM}: 1 to {SIDES_MAX} sides, got {len(self.sides)}")
        if any(not 0 <= g < self.group_count for side in self.sides for g in side):
            raise GenesInputError(f"{PROGRAM}: side group ids must be in [0, {self.group_count})")


@dataclass
class Cached:
    covered: set[int]
    statistics: pa.Table


@dataclass
class PartitionWork:
    meta: PartitionMeta
    usable: Cached | None
    stored: Cached | None  # what the cache holds now (maybe not usable for this request)
    todo: bool
    partials: list[pa.RecordBatch | pa.Table] = field(default_factory=list)
    executed: list[int] = field(default_factory=list)


@register
class Accumulate(Unit):
    NAME = PROGRAM
    STAGES = frozenset({Stage.FULL, Stage.RAW})  # no filter stage: all of a slice or nothing
    CHUNK_SLICES_MAX = 1

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = AccumulateArgs.from_json(request.args)
        self.group_of_cell = _grouping(self.args, payload) if payload else None
        self.works: dict[int, PartitionWork] = {}
        self.sides: list[pa.RecordBatch] = []
        self.host_partials: list[pa.RecordBatch] = []

    SCHEMA: pa.Schema = PARTIAL_SCHEMA  # what ``KERNEL`` gives and the unit ships
    CACHE_FORMAT = b"1"  # of its cached statistics: another format is recomputed
    KERNEL = staticmethod(accumulate)  # (slice, group of each cell, groups) -> partial

    @property
    def output_schema(self) -> pa.Schema:
        return self.SCHEMA

    @classmethod
    def calibration_work(cls, batch: pa.RecordBatch, rng: np.random.Generator):
        """The host's own work on a calibration slice (``dispatch.host_accumulate_s_per_byte``):
        the statistic over 10 random groups."""
        _, _, cells = slice_layout(batch)
        groups = rng.integers(0, 10, cells).astype(np.int32)
        return lambda: cls.KERNEL(batch, groups, 10)

    # ---- the statistic: a unit of the same shape (``RankSums``) changes only these -------------

    def partial(self, batch: pa.RecordBatch, groups: np.ndarray) -> pa.RecordBatch:
        """One slice's statistics per (gene, group)."""
        return self.KERNEL(batch, groups, self.args.group_count)

    def reduce(
        self, partials: list[pa.RecordBatch | pa.Table], sides: tuple[tuple[int, ...], ...]
    ) -> tuple[pa.RecordBatch, list[pa.RecordBatch]]:
        """Partials as one set of statistics, and the statistics of each side."""
        statistics = combine(partials)
        return statistics, select_sides(statistics, sides)

    def merge(self, sides: list[pa.RecordBatch]) -> pa.RecordBatch:
        """Side statistics of several partitions as one."""
        return combine(sides)

    # ---- on the device ------------------------------------------------------------------------

    def plan(self, meta: PartitionMeta, not_here: frozenset[int]) -> list[Skipped]:
        check_same_ingest(meta, self.request, self.args.ingest_ids)
        stored = _load(self, meta)
        wanted = set(range(len(meta.slices))) - not_here
        # A Combine cannot be taken apart: a cache that covers a slice this request pushes back
        # cannot serve it, so the slices are accumulated again (and the cache kept as it is).
        usable = stored if stored is not None and stored.covered <= wanted else None
        covered = usable.covered if usable is not None else set()
        work = PartitionWork(meta, usable, stored, todo=bool(wanted - covered))
        if usable is not None:
            work.partials.append(usable.statistics)
        self.works[meta.partition] = work
        reason = "cached partial statistics of this grouping"
        return [Skipped(r, Skip.CACHED, reason) for r in ranges_of(sorted(covered))]

    def payload_needed(self) -> bool:
        return self.group_of_cell is None and any(w.todo for w in self.works.values())

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        work = self.works[chunk.meta.partition]
        groups = self._groups()
        for number, batch in zip(chunk.numbers, chunk.batches(), strict=True):
            work.partials.append(self.context.compute(lambda b=batch: self.partial(b, groups)))
            work.executed.append(number)
        return []

    def finish_partition(self, meta: PartitionMeta) -> list[pa.RecordBatch]:
        work = self.works[meta.partition]
        statistics, sides = self.context.compute(
            lambda: self.reduce(work.partials, self.args.sides)
        )
        self.sides.extend(sides)
        _store(self, work, statistics)
        return []

    # ---- on the host: what came back raw ------------------------------------------------------

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        groups = self._groups()
        partials = []
        for batch in batches:
            if batch.num_rows:
                partials.append(self.context.compute(lambda b=batch: self.partial(b, groups)))
        # all of a handed-back range or none of it: a fetch that broke off is done again
        self.host_partials.extend(partials)
        return iter(())

    # ---- both -------------------------------------------------------------------------------

    def finish(self) -> list[pa.RecordBatch]:
        if self.host_partials:
            _, sides = self.context.compute(
                lambda: self.reduce(self.host_partials, self.args.sides)
            )
            self.sides.extend(sides)
        if not self.sides:
            return []
        output = self.context.compute(lambda: self.merge(self.sides))
        return list(_batches(output, self.SCHEMA))

    def summary(self) -> dict[str, int]:
        return {
            "cache_hits": sum(1 for w in self.works.values() if w.usable is not None and not w.todo)
        }

    def _groups(self) -> np.ndarray:
        if self.group_of_cell is None:
            raise GenesInputError(f"{PROGRAM}: slices to accumulate but no grouping was sent")
        return self.group_of_cell


# ---- cache ----------------------------------------------------------------------------------


def _cache_key(unit: Accumulate, partition: int) -> str:
    args = unit.args
    return unit.context.cache_key(
        unit.request.domain,
        unit.request.dataset,
        unit.NAME,
        args.version,
        args.grouping,
        f"{partition:04d}",
    )


def _load(unit: Accumulate, meta: PartitionMeta) -> Cached | None:
    raw = unit.context.cache_get(_cache_key(unit, meta.partition))
    if raw is None:
        return None
    try:
        table = pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
    except (pa.ArrowException, OSError):
        return None  # a damaged cache entry: recompute (the put below replaces it)
    metadata = table.schema.metadata or {}
    if (
        metadata.get(b"format") != unit.CACHE_FORMAT
        or metadata.get(b"ingest", b"").decode() != meta.ingest["id"]
    ):
        return None  # written for other data: recompute (the put below replaces it)
    covered = {int(n) for n in json.loads(metadata[b"covered"])}
    if covered and max(covered) >= len(meta.slices):
        return None
    return Cached(covered, table.replace_schema_metadata(None))


def _store(unit: Accumulate, work: PartitionWork, statistics: pa.RecordBatch) -> None:
    if not work.executed:
        return
    previous = work.usable.covered if work.usable is not None else set()
    covered = previous | set(work.executed)
    if work.stored is not None and not work.stored.covered <= covered:
        return  # the cache covers slices this request did not: keep the larger coverage
    metadata = {
        b"format": unit.CACHE_FORMAT,
        b"ingest": work.meta.ingest["id"].encode(),
        b"covered": json.dumps(sorted(covered)).encode(),
    }
    sink = pa.BufferOutputStream()
    schema = statistics.schema.with_metadata(metadata)
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays(statistics.columns, schema=schema))
    _evict(unit)
    unit.context.cache_put(_cache_key(unit, work.meta.partition), sink.getvalue().to_pybytes())


def _evict(unit: Accumulate) -> None:
    """Bound the cache: drop other versions of the dataset, and groupings beyond the limit."""
    context, args = unit.context, unit.args
    base = context.cache_key(unit.request.domain, unit.request.dataset, unit.NAME) + "/"
    keys = context.store.list(base)
    current = f"{base}{args.version}/"
    stale = [k for k in keys if not k.startswith(current)]
    groupings = sorted({k[len(current) :].split("/")[0] for k in keys if k.startswith(current)})
    others = [g for g in groupings if g != args.grouping]
    excess = others[: max(0, len(groupings) + 1 - CACHED_GROUPINGS_MAX)]
    doomed = stale + [k for k in keys if any(k.startswith(f"{current}{g}/") for g in excess)]
    if doomed:
        with context.store.transaction() as txn:
            for key in doomed:
                txn.delete(key)


# ---- reduce and output ------------------------------------------------------------------------


def _grouping(args: AccumulateArgs, payload: bytes) -> np.ndarray:
    group_of_cell = np.frombuffer(payload, dtype="<i4").astype(np.int32)
    if len(group_of_cell) != args.cell_count:
        raise GenesInputError(
            f"{PROGRAM}: the grouping covers {len(group_of_cell)} cells, the request says "
            f"{args.cell_count}"
        )
    if grouping_digest(group_of_cell, args.group_count) != args.grouping:
        # The digest names the cache entry: a payload that does not match would poison it.
        raise GenesInputError(f"{PROGRAM}: the grouping does not match its digest")
    return group_of_cell


def _batches(output: pa.RecordBatch, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for start in range(0, max(output.num_rows, 1), OUTPUT_ROWS_PER_BATCH):
        chunk = output.slice(start, OUTPUT_ROWS_PER_BATCH)
        if chunk.num_rows:
            yield pa.RecordBatch.from_arrays(chunk.columns, schema=schema)


@register
class RankSums(Accumulate):
    """The same pipeline for the Wilcoxon test (``genes.ranks``): per (gene, group) the sum of
    the gene's ranks and the cells expressing it, cached per grouping like the moments."""

    NAME = "genes.rank_sums"
    SCHEMA = RANK_SCHEMA
    CACHE_FORMAT = b"2"  # 2: with each group's sum
    KERNEL = staticmethod(rank_sums)

    def reduce(
        self, partials: list[pa.RecordBatch | pa.Table], sides: tuple[tuple[int, ...], ...]
    ) -> tuple[pa.RecordBatch, list[pa.RecordBatch]]:
        statistics = combine_ranks(partials)
        return statistics, select_rank_sides(statistics, sides)

    def merge(self, sides: list[pa.RecordBatch]) -> pa.RecordBatch:
        return combine_ranks(sides)
