"""A SQL sub-plan: the three Substrait stages of a fragment (raw, filter, full) over slices.

The payload is the stages' bytes back to back, their lengths in ``SubstraitArgs``. Zone-map
predicates prune slices before anything is read. A plan this device cannot decode or plan is
``PlanNotSupported`` (the device hands it back: the host then runs the fragment itself over raw
slices); an error while running (division by zero, a bad cast) is the query's error: running it
on the host would fail the same way. An engine that panics or runs out of memory is the
device's failure, not the query's (``StageFailed``): the device hands the range back, and
quarantines the plan's shape (``shape``) after a panic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from quarry.device.unit import Chunk, Skipped, Unit, conform, register
from quarry.errors import (
    ExecutionError,
    PlanNotSupported,
    ProtocolError,
    QueryError,
    StageFailed,
)
from quarry.lazy import cached_property
from quarry.plan import tree
from quarry.plan.errors import StageError
from quarry.plan.join_filters import stored_column
from quarry.plan.keys import KEY_SET_BYTES_MAX, KeyCut, keep, keep_in, keep_named
from quarry.plan.keys import decode as decode_keys
from quarry.plan.prune import slice_may_match, slice_must_match
from quarry.plan.rowwise import adjacent_once, coalesced, groups
from quarry.plan.shape import shape_of
from quarry.plan.stage import prepare, run_stage
from quarry.plan.statistics import STATISTICS_MAX, SliceStatistic, answer
from quarry.plan.superplan import COMPLETION_GROUP_BYTES_MAX, complete_group
from quarry.plan.superplan import conform as typed
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import SliceRange, ranges_of
from quarry.store.partition import PartitionMeta, whole_read_bytes, zone_bounds

STAGE_BYTES_MAX = 64 << 20
PREDICATES_MAX = 10_000
KEY_FILTERS_MAX = 16


@dataclass(frozen=True)
class KeyFilter(Message):
    """Keep only the output rows whose ``column`` holds one of a key set (``plan.keys``) that
    follows the stages in the payload, ``key_bytes`` long: a join's build keys."""

    column: int = bounded(low=0, high=1 << 20)
    key_bytes: int = bounded(low=1, high=KEY_SET_BYTES_MAX)


@dataclass(frozen=True)
class SubstraitArgs(Message):
    raw_bytes: int = bounded(low=0, high=STAGE_BYTES_MAX)
    filter_bytes: int = bounded(low=0, high=STAGE_BYTES_MAX)
    full_bytes: int = bounded(low=1, high=STAGE_BYTES_MAX)
    output_schema: pa.Schema
    raw_schema: pa.Schema
    predicates: tuple[Any, ...] = bounded(items_max=PREDICATES_MAX, default=())  # zone maps
    key_filters: tuple[KeyFilter, ...] = bounded(items_max=KEY_FILTERS_MAX, default=())
    # "full" without its row filter (``Fragment.unfiltered``), after it in the payload; 0: none
    unfiltered_bytes: int = bounded(low=0, high=STAGE_BYTES_MAX, default=0)
    # that sub-plan as slice statistics (``Fragment.statistics``): slices every row of which
    # passes are answered from their zone maps, unread
    statistics: tuple[SliceStatistic, ...] = bounded(items_max=STATISTICS_MAX, default=())
    # repeats of the sub-plan's output rows change nothing the query answers (``plan.repeats``:
    # a DISTINCT above, the filtering side of a semi join): a device drops them, chunk by chunk
    distinct: bool = False


def stages_payload(
    stages: dict[Stage, bytes], key_sets: Sequence[bytes] = (), unfiltered: bytes = b""
) -> bytes:
    return b"".join(
        (stages[Stage.RAW], stages[Stage.FILTER], stages[Stage.FULL], unfiltered, *key_sets)
    )


def split_payload(args: SubstraitArgs, payload: bytes) -> dict[Stage, bytes]:
    lengths = (args.raw_bytes, args.filter_bytes, args.full_bytes, args.unfiltered_bytes)
    keys = sum(f.key_bytes for f in args.key_filters)
    if sum(lengths) + keys != len(payload):
        raise ProtocolError(
            f"SubstraitArgs: stage lengths {lengths} and key sets ({keys} bytes) do not add up "
            f"to the payload ({len(payload)})"
        )
    raw_end, filter_end = lengths[0], lengths[0] + lengths[1]
    return {
        Stage.RAW: payload[:raw_end],
        Stage.FILTER: payload[raw_end:filter_end],
        Stage.FULL: payload[filter_end : filter_end + lengths[2]],
    }


def unfiltered_stage(args: SubstraitArgs, payload: bytes) -> bytes:
    """ "full" without its row filter, for slices every row of which passes it (b"": none)."""
    start = args.raw_bytes + args.filter_bytes + args.full_bytes
    return payload[start : start + args.unfiltered_bytes]


def key_cuts(args: SubstraitArgs, payload: bytes) -> list[KeyCut]:
    """The key sets after the stages, as cuts of the output."""
    start = args.raw_bytes + args.filter_bytes + args.full_bytes + args.unfiltered_bytes
    cuts = []
    for key_filter in args.key_filters:
        if key_filter.column >= len(args.output_schema):
            raise ProtocolError(f"a key filter names output column {key_filter.column}")
        try:
            keys = decode_keys(payload[start : start + key_filter.key_bytes])
        except ValueError as error:
            raise ProtocolError(f"SubstraitArgs: {error}") from None
        cuts.append(KeyCut(key_filter.column, keys))
        start += key_filter.key_bytes
    return cuts


ENGINE_BATCH_ROWS = 8192  # DataFusion's batch size: rows handed on as they are come no larger
# an engine run costs about what reading this many slices does (a few ms against ~0.3)
SLICES_PER_RUN = 4


@register
class SubstraitUnit(Unit):
    NAME = "substrait"
    STAGES = frozenset({Stage.FULL, Stage.FILTER, Stage.RAW})
    # One DataFusion run per chunk: its setup costs the same whatever it reads, so a chunk
    # holds about CHUNK_READ_BYTES of the columns read, up to CHUNK_SLICES_MAX slices: a narrow
    # read (sum(ke): one column of five) 64 slices at once, a whole-row read sixteen 4 MiB
    # slices. 64 MiB and 64 slices rather than 16 and 16: four times fewer runs, TPC-H SF 1
    # Q6 0.149 to 0.104 s, Q15 0.105 to 0.078, Q18 0.73 to 0.61 (seven runs each, one cluster).
    CHUNK_SLICES_MAX = 64
    CHUNK_READ_BYTES = 64 << 20
    RESUMABLE = True
    CHUNKS_AT_ONCE = True

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self._answers: dict[tuple[int, int], pa.RecordBatch] = {}  # (partition, first): output

    # Read from the request when first asked: the host makes a unit for every task of every
    # fragment, to complete whatever its device hands back, and most hand nothing back
    # (decoding a probe's key sets and placing its cuts: 0.12 ms of the host's CPU a task).

    @cached_property
    def args(self) -> SubstraitArgs:
        return SubstraitArgs.from_json(self.request.args)

    @cached_property
    def stages(self) -> dict[Stage, bytes]:
        return split_payload(self.args, self.payload)

    @cached_property
    def unfiltered(self) -> bytes:
        return unfiltered_stage(self.args, self.payload)

    @cached_property
    def cuts(self) -> list[KeyCut]:
        return key_cuts(self.args, self.payload)

    @cached_property
    def _placed(self) -> tuple[list[tuple[str, KeyCut]], list[KeyCut]]:
        """On the device, cuts on a stored column cut what is read (``placed_cuts``)."""
        return placed_cuts(self.stages[Stage.FULL], self.cuts)

    @property
    def _input_cuts(self) -> list[tuple[str, KeyCut]]:
        return self._placed[0]

    @property
    def _output_cuts(self) -> list[KeyCut]:
        return self._placed[1]

    @property
    def output_schema(self) -> pa.Schema:
        return self.args.output_schema

    @property
    def raw_schema(self) -> pa.Schema:
        return self.args.raw_schema

    def columns(self) -> list[str] | None:
        return self._columns

    @cached_property
    def _columns(self) -> list[str] | None:
        """Worked out once per request: the loop asks for every chunk it reads."""
        try:
            return read_columns(self.stages, self.args.raw_schema)
        except StageError:  # not a plan this device decodes: running it says so, as it did
            return None

    def shape(self) -> str:
        """The stages the device runs, literals erased: a shape that failed here is
        quarantined for the dataset (``plan.shape``)."""
        return shape_of(self.stages[Stage.FILTER], self.stages[Stage.FULL])

    def chunk_slices(self, meta: PartitionMeta) -> int:
        if not meta.slices:
            return 1
        columns = self.columns()
        read = sum(whole_read_bytes(meta, columns))
        per_slice = max(1, read // len(meta.slices))
        return max(1, min(self.CHUNK_SLICES_MAX, self.CHUNK_READ_BYTES // per_slice))

    def plan(self, meta: PartitionMeta, not_here: frozenset[int]) -> list[Skipped]:
        predicates = list(self.args.predicates)
        excluded = [
            n
            for n, info in enumerate(meta.slices)
            if predicates and not slice_may_match(predicates, info.zone_map)
        ]
        reason = "zone maps exclude every row"
        pruned = [Skipped(r, Skip.PRUNED, reason) for r in ranges_of(excluded)]
        keyless = self._keyless(meta, not_here | frozenset(excluded))
        reason = "zone maps hold none of a join's keys"
        pruned += [Skipped(r, Skip.PRUNED, reason) for r in ranges_of(keyless)]
        return pruned + self._answered(meta, not_here | frozenset(excluded) | frozenset(keyless))

    def _keyless(self, meta: PartitionMeta, not_here: frozenset[int]) -> list[int]:
        """Slices whose zone maps hold none of a join's keys (TPC-DS inventory, stored in date
        order, against 60 dates: 3 of 96 slices hold one), where skipping them pays: each gap
        it opens in a run of slices costs an engine run of its own, about what reading
        ``SLICES_PER_RUN`` slices does (scattered through the run, TPC-H Q18's 20% of lineitem
        skipped made it no faster)."""
        if not self._input_cuts:
            return []
        left = [n for n in range(len(meta.slices)) if n not in not_here]
        holds = np.ones(len(meta.slices), np.bool_)
        for column, cut in self._input_cuts:
            holds &= cut.may_hold_each(zone_bounds(meta, column))
        keyless = [n for n in left if not holds[n]]
        if not keyless:
            return []
        runs_before = len(ranges_of(left))
        runs_after = len(ranges_of(sorted(set(left) - set(keyless))))
        if (runs_after - runs_before) * SLICES_PER_RUN > len(keyless):
            return []
        return keyless

    def _answered(self, meta: PartitionMeta, not_here: frozenset[int]) -> list[Skipped]:
        """Runs of slices every row of which passes, whose statistics say the sub-plan's output
        (``plan.statistics``); each run's answer is kept for ``answer``."""
        statistics, predicates = self.args.statistics, self.args.predicates
        if not statistics or self.cuts:  # a join's key sets cut rows, not an aggregate
            return []
        passing = [
            n
            for n, info in enumerate(meta.slices)
            if n not in not_here and (not predicates or slice_must_match(predicates, info.zone_map))
        ]
        answered = []
        for run in ranges_of(passing):
            slices = [(meta.slices[n].rows, meta.slices[n].zone_map) for n in run.numbers()]
            batch = answer(statistics, slices, self.args.output_schema)
            if batch is not None:
                self._answers[(meta.partition, run.first)] = batch
                answered.append(Skipped(run, Skip.ANSWERED, "answered from the slices' statistics"))
        return answered

    def answer(self, meta: PartitionMeta, answered: SliceRange) -> list[pa.RecordBatch]:
        return [self._answers.pop((meta.partition, answered.first))]

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        # Read first: the read costs the same whatever is decided, so the drive's time for the
        # decision is the work that follows it.
        batches = chunk.joined_batches()
        stage, schema = self._full_for(chunk), chunk.meta.schema
        return self.context.compute(lambda: self._executed(stage, schema, batches))

    def _executed(
        self, stage: bytes, schema: pa.Schema, batches: list[pa.RecordBatch]
    ) -> list[pa.RecordBatch]:
        if self._input_cuts and batches:
            kept = keep_in(batches, self._input_cuts).to_batches()
            batches = coalesced(kept, ENGINE_BATCH_ROWS)
        if self._reads_only and stage == self.stages[Stage.FULL]:
            # the rows as read are the output: no engine run for them (309 of TPC-DS's 577
            # fragments, 173 of them a fact table's, most cut by a join's keys)
            output = [part for batch in batches if batch.num_rows for part in self._as_read(batch)]
        else:
            output = list(_run(stage, schema, (batch for batch in batches if batch.num_rows)))
        kept = self._kept(output, self._output_cuts)
        if self.args.distinct:
            kept = [once for batch in kept if (once := adjacent_once(batch)).num_rows]
        return coalesced(kept, ENGINE_BATCH_ROWS)

    def _full_for(self, chunk: Chunk) -> bytes:
        """The whole sub-plan, without its filter when every row of the chunk passes it by its
        slices' zone maps (``sum(ke) WHERE ke > X`` below every value: a third of the CPU)."""
        predicates = self.args.predicates
        if self.unfiltered and all(
            slice_must_match(predicates, chunk.meta.slices[n].zone_map) for n in chunk.numbers
        ):
            return self.unfiltered
        return self.stages[Stage.FULL]

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """On the host: the full stage over rows handed back raw or filtered. It contains the
        whole filter, so it also re-checks rows a restricted device filtered with only part of
        the predicate. The key sets cut its output as they cut the device's."""
        if self._reads_only:
            for group in groups(batches, COMPLETION_GROUP_BYTES_MAX):
                yield from self._kept([part for b in group for part in self._as_read(b)])
            return
        stage = self.stages[Stage.FULL]
        for group in groups(batches, COMPLETION_GROUP_BYTES_MAX):
            # one group per host core at a time (the host context's slots)
            yield from self.context.compute(
                lambda group=group: self._kept(_host_errors(complete_group(stage, group)))
            )

    @cached_property
    def _reads_only(self) -> bool:
        """Whether the sub-plan is its read (41 fragments of the 22 TPC-H queries: nation,
        supplier, a key-cut lineitem): then the rows as read are its output, and the host has
        nothing to run over those handed back (an engine run per group: 0.5 to 1 ms each, and
        TPC-H Q2 completes five such fragments)."""
        return self.stages.get(Stage.RAW) == self.stages[Stage.FULL]

    def _as_read(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """A slice as read, as the sub-plan's output: its columns in order, typed as declared,
        in batches of at most the engine's (a reader streams a large answer as it did)."""
        batch = typed(batch.select(self.args.raw_schema.names), self.args.output_schema)
        rows = batch.num_rows
        return [batch.slice(at, ENGINE_BATCH_ROWS) for at in range(0, rows, ENGINE_BATCH_ROWS)]

    def _kept(
        self, batches: Iterable[pa.RecordBatch], cuts: Sequence[KeyCut] | None = None
    ) -> list[pa.RecordBatch]:
        """The output without the rows a join's key sets (all of them by default) drop."""
        cuts = self.cuts if cuts is None else cuts
        if not cuts:
            return list(batches)
        kept = (keep(batch, cuts) for batch in batches)
        return [batch for batch in kept if batch.num_rows]

    def raw_slice(self, meta: PartitionMeta, number: int, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A slice handed back raw, without the rows a join's key sets drop (Q8 shipped 338 MB
        of lineitem raw, uncut, when its devices handed ranges back under load)."""
        return super().raw_slice(meta, number, keep_named(batch, self._input_cuts))

    def ships_as_stored(self) -> bool:
        return not self._input_cuts

    def filter(self, chunk: Chunk) -> dict[int, list[pa.RecordBatch]]:
        stage, schema = self.stages[Stage.FILTER], chunk.meta.schema
        out = {}
        for number, batch in zip(chunk.numbers, chunk.batches(), strict=True):
            batch = keep_named(batch, self._input_cuts)
            filtered = self.context.compute(lambda b=batch: list(_run(stage, schema, [b])))
            out[number] = [conform(b, self.args.raw_schema) for b in filtered]
        return out


def placed_cuts(
    stage: bytes, cuts: Sequence[KeyCut]
) -> tuple[list[tuple[str, KeyCut]], list[KeyCut]]:
    """The key cuts a device applies to the rows it reads, by stored column, and those it
    applies to the sub-plan's output. A cut goes below the sub-plan when its column comes
    unchanged from a stored one through operators a filter on it commutes with (a group key,
    a projection, a filter): fewer rows to aggregate, the same output."""
    if not cuts:
        return [], []
    try:
        prepared = prepare(stage)
    except StageError:
        return [], list(cuts)  # running it will say why
    plan = tree.parse_plan(prepared.plan)
    placed, after = [], []
    for cut in cuts:
        column = stored_column(plan, cut.column)
        if column is None or column not in prepared.columns:
            after.append(cut)
        else:
            placed.append((column, cut))
    return placed, after


def read_columns(stages: dict[Stage, bytes], raw_schema: pa.Schema) -> list[str]:
    """What a fragment's stages read (the cut prunes its read to the query's columns): the only
    byte ranges of each slice a device takes off its store."""
    read = [*prepare(stages[Stage.FULL]).columns]
    if stages[Stage.FILTER]:
        read += prepare(stages[Stage.FILTER]).columns
    return list(dict.fromkeys([*read, *raw_schema.names]))


def _run(
    stage: bytes, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A stage's non-empty output batches, its errors as the user should see them."""
    try:
        for batch in run_stage(stage, schema, batches):
            if batch.num_rows:
                yield batch
    except StageError as error:
        if error.memory:
            raise StageFailed(f"the device's engine ran out of memory: {error}", True) from None
        if error.panicked:
            raise StageFailed(f"the device's engine panicked: {error}") from None
        if error.while_running:
            raise ExecutionError(str(error)) from None
        raise PlanNotSupported(f"this device cannot run the sub-plan: {error}") from None


def run_on_host(
    stage: bytes, schema: pa.Schema, batches: list[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A stage on the host; its errors are the query's (there is nowhere else to run it)."""
    return _host_errors(run_stage(stage, schema, batches))


def _host_errors(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except StageError as error:
        if error.while_running:
            raise ExecutionError(str(error)) from None
        raise QueryError(str(error)) from None
