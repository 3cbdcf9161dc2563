"""The host's side: completing fragments that came back unfinished, then running the super-plan.

The super-plan runs in a stated host memory budget (`SUPER_PLAN_MEMORY_BYTES_MAX`, or
$QUARRY_SUPER_PLAN_MEMORY_MIB, or `run_super(memory_bytes_max=...)`): a quarter of it holds
fragment outputs in memory (`spool.Spool`, the rest of them goes to disk), the other three
quarters are DataFusion's fair spill pool, so sorts and aggregations spill to the same
temporary directory instead of growing. Top-k and the final aggregation of partials stay
small by themselves. A hash join holds its build side whole: when one does not fit the pool
before any row came out, the super-plan runs once more over the same spooled inputs with
sort-merge joins, whose sorts spill (into a directory of DataFusion's own, removed with that
run's session); only if that does not fit either does the query end with `HostMemoryExceeded`
naming the budget.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from quarry import settings
from quarry.errors import HostMemoryExceeded
from quarry.plan import common_parts, duckdb_super, engine, merge, tree
from quarry.plan.computed import register_computed, substituted
from quarry.plan.decompose import Decomposition, Fragment
from quarry.plan.memory import SUPER_PLAN_MEMORY_BYTES_MAX, MemoryBudget
from quarry.plan.passthrough import SHAPES_KEPT_MAX, passthrough_fragment
from quarry.plan.rowwise import groups, rowwise_fragment
from quarry.plan.rules import build_side
from quarry.plan.spool import MIB, Spool, SpooledFragment, rows_in_files
from quarry.plan.stage import run_stage
from quarry.protocol.stage import Stage
from quarry.tally import Tally

# Completion runs the full stage over bounded groups of pushed-back rows, so host memory stays
# bounded and output streams while rows still arrive. Any grouping is correct: the full stage
# of a union equals the union of full stages up to what the super-plan merges anyway. Small
# groups on one core each, many streams at once (measured on 20 M rows under never: 4 MiB groups
# on one partition held +80 MiB, 16 MiB +260, 64 MiB on two partitions +410, none faster).
COMPLETION_GROUP_BYTES_MAX = 4 * 1024 * 1024
# The memory consumer that holds a hash join's build side (DataFusion 55: "HashJoinInput", with
# "[partition]" when partitioned); a sort-merge join does without it. Joins on no equal keys
# have no such way out: a cross join holds its build side whole ("CrossJoinExec"), a nested-loop
# join of most kinds spills what it cannot hold ("NestedLoopJoinLoad[partition]").
HASH_JOIN_CONSUMERS = ("HashJoinInput",)
# inputs of at most this many rows in all, in memory, run the super-plan in one partition
ONE_PARTITION_ROWS_MAX = 1 << 16


@dataclass(frozen=True)
class SortMergeRerun:
    """The super-plan ran again with sort-merge joins: a hash join's build side (``consumer``,
    as DataFusion names it) did not fit the spill pool of ``pool_bytes``."""

    consumer: str
    pool_bytes: int

    def describe(self) -> str:
        return (
            f"a hash join's build side did not fit the {self.pool_bytes // MIB} MiB pool: "
            f"ran again with sort-merge joins, which spill"
        )


@dataclass(frozen=True)
class HostPace:
    """The host's CPU as the super-plan meets it: the cores DataFusion may use, and what an
    emulated host does after each batch that took ``seconds`` of work (``stretch``: hold on as
    long as its slower cores would; None on the machine as it is). The coordinator builds it
    from the host profile; this module knows no profile."""

    cores: int
    stretch: Callable[[float], object] | None = None

    def paced(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches`` as they come, each followed by the stretch of the time it took."""
        iterator = iter(batches)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            if self.stretch is not None:
                self.stretch(time.perf_counter() - started)
            yield batch


def streams(decomposition: Decomposition) -> bool:
    """Whether the super-plan lets rows out while fragments still arrive (a pass-through, or
    row by row), rather than reading every fragment's output whole first."""
    return (
        passthrough_fragment(decomposition) is not None
        or rowwise_fragment(decomposition) is not None
    )


def machine_pace() -> HostPace:
    return HostPace(engine.cpu_count())


def complete(
    fragment: Fragment,
    batches: Iterable[pa.RecordBatch],
    group_bytes_max: int = COMPLETION_GROUP_BYTES_MAX,
) -> Iterator[pa.RecordBatch]:
    """Run the fragment's `full` stage over rows that came back `raw` or `filter`-ed, in
    bounded groups.

    The full stage contains the complete filter, so it also re-checks rows that a restricted
    device filtered with only part of the predicate. `batches` may hold more columns than the
    raw schema (whole slices); nothing is produced for no batches.
    """
    for group in groups(batches, group_bytes_max):
        yield from complete_group(fragment.stages[Stage.FULL], group)


def complete_group(stage: bytes, group: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return run_stage(stage, group[0].schema, group)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` with `schema`'s names and types (DataFusion may hand back view types)."""
    if batch.schema.equals(schema):
        return batch
    if batch.num_columns != len(schema):
        raise ValueError(
            f"a batch has {batch.num_columns} columns, expected {len(schema)}: "
            f"{', '.join(schema.names)}"
        )
    columns = [
        column if column.type == field.type else column.cast(field.type)
        for column, field in zip(batch.columns, schema)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def run_super(
    decomposition: Decomposition,
    fragment_outputs: Mapping[str, Iterable[pa.RecordBatch]],
    memory_bytes_max: int | None = None,
    spool_memory_bytes_max: int | None = None,
    temp_directory: str | Path | None = None,
    pace: HostPace | None = None,
    clock: Tally | None = None,
    inputs_in: Callable[[], object] | None = None,
    reran: Callable[[SortMergeRerun], object] | None = None,
    computed: Callable[[], Mapping[bytes, pa.Table]] | None = None,
    cut: Collection[str] = (),
) -> pa.RecordBatchReader:
    """Run the super-plan over each fragment's (completed) output; the result streams.

    A super-plan that only reads one fragment (``passthrough``) is not run at all: its batches
    stream straight out as they arrive. One that only filters and projects one fragment
    (``rowwise``) runs on each group of arriving batches. Any other starts on the first read:
    every fragment's output is read to its end, all at once (`spool.Spool`: in memory up to
    `spool_memory_bytes_max`, a quarter of `memory_bytes_max` by default, the rest in Arrow
    IPC files in a directory under `temp_directory`), then DataFusion runs the super-plan in a
    spill pool of the rest of the budget and its batches stream out. The spool and whatever
    DataFusion spilled are removed when the reader is exhausted, fails, or is dropped (pyarrow's
    ``close`` keeps a reader's Python iterator alive until the reader itself goes).

    DataFusion runs on ``pace``'s cores, each of its batches stretched as ``pace`` says (the
    host profile's compute factor); by default on this machine's cores as they are.
    ``clock`` counts the super-plan's own run (not the wait for its inputs): wall, and the
    process's CPU meanwhile (DataFusion works on threads of its own). ``inputs_in`` is called
    once every fragment's output is in and before the super-plan runs on them (the coordinator
    checks there that its catalog held), for a super-plan that reads them whole first.
    ``reran`` is told when a hash join did not fit and the super-plan ran again with sort-merge
    joins (`SortMergeRerun`). ``computed``, asked then too, gives the parts of the super-plan
    the host already ran, by their plan's bytes, with their output: those are read, not run
    again (`computed.substituted`). A part of the super-plan that occurs more than once runs
    once (`common_parts`); alike fragments count as one, unless a join's keys ``cut`` them.
    """
    pace = pace or machine_pace()
    clock = clock if clock is not None else Tally()
    missing = [f.name for f in decomposition.fragments if f.name not in fragment_outputs]
    if missing:
        raise ValueError(f"no output given for fragment(s) {', '.join(missing)}")
    schema = decomposition.output_schema
    only = passthrough_fragment(decomposition)
    if only is not None:  # nothing to run on the host: the fragment's rows are the answer
        batches = fragment_outputs[only.name]
        return pa.RecordBatchReader.from_batches(schema, (conform(b, schema) for b in batches))
    rowwise = rowwise_fragment(decomposition)
    if rowwise is not None:  # filters and projections: group by group, as rows arrive
        batches = _conformed(fragment_outputs[rowwise.name], rowwise.output_schema)
        return pa.RecordBatchReader.from_batches(
            schema, _run_rowwise(decomposition, rowwise, batches, pace, clock)
        )
    budget = MemoryBudget.of(memory_bytes_max, spool_memory_bytes_max)
    if decomposition.host_sql:  # a super-plan DataFusion cannot run: DuckDB's
        inputs = {
            f.name: (f.output_schema, _conformed(fragment_outputs[f.name], f.output_schema))
            for f in decomposition.fragments
        }
        return pa.RecordBatchReader.from_batches(
            schema,
            duckdb_super.run(
                decomposition.host_sql,
                decomposition.host_tables,
                inputs,
                schema,
                budget,
                temp_directory,
                pace.cores,
                clock,
                inputs_in,
                conform,
            ),
        )
    return pa.RecordBatchReader.from_batches(
        schema,
        _run(
            decomposition,
            fragment_outputs,
            budget,
            temp_directory,
            pace,
            clock,
            _Hooks(inputs_in, reran, computed, cut),
        ),
    )


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def functions_of(super_plan: bytes) -> tuple[str, ...]:
    """The functions a super-plan calls (its merge functions are registered by name): worked
    out once per plan."""
    return tuple(tree.function_names(tree.parse_plan(super_plan)).values())


def _run_rowwise(
    decomposition: Decomposition,
    fragment: Fragment,
    batches: Iterable[pa.RecordBatch],
    pace: HostPace,
    clock: Tally,
) -> Iterator[pa.RecordBatch]:
    schema = decomposition.output_schema
    functions = functions_of(decomposition.super_plan)
    partitions = pace.cores
    for group in groups(batches):
        with clock.timing(process=True):
            ctx = engine.session(partitions)
            merge.register_merge_functions(ctx, functions)
            engine.register_batches(ctx, fragment.name, fragment.output_schema, group, partitions)
            stream = engine.consume(ctx, decomposition.super_plan).execute_stream()
        for batch in clock.timed(pace.paced(stream), process=True):
            out = conform(batch.to_pyarrow(), schema)
            if out.num_rows:
                yield out


def _run(
    decomposition: Decomposition,
    fragment_outputs: Mapping[str, Iterable[pa.RecordBatch]],
    budget: MemoryBudget,
    temp_directory: str | Path | None,
    pace: HostPace,
    clock: Tally,
    hooks: _Hooks,
) -> Iterator[pa.RecordBatch]:
    with Spool(budget.spool_memory_bytes_max, temp_directory, pace.cores) as spool:
        spooled = spool.fill(
            {
                f.name: (f.output_schema, _conformed(fragment_outputs[f.name], f.output_schema))
                for f in decomposition.fragments
            }
        )
        partitions = engine_partitions(spooled.values(), pace.cores)
        if hooks.inputs_in is not None:
            hooks.inputs_in()
        _check_spooled(spooled)
        tables: dict[str, pa.Table] = {}
        if hooks.computed is not None:
            decomposition, tables = substituted(decomposition, hooks.computed())
        kept = temp_directory is None  # spills of a kept session go where it was made
        with clock.timing(process=True):
            decomposition, swap = _small_builds(decomposition, spooled, tables)
            if kept:
                ctx = _take_session(partitions, budget.pool_bytes, swap)
            else:
                ctx = engine.session(
                    partitions, budget.pool_bytes, spool.directory, swap_joins=swap
                )
            _register(ctx, decomposition, spooled, partitions, tables)
            decomposition, tables = _common_once(
                ctx, decomposition, tables, spool, spooled, partitions, hooks.cut
            )
        exhausted = yield from _run_as_planned(ctx, decomposition, budget, pace, clock)
        if exhausted is None:
            if kept:  # read to its end: the session goes back, holding none of this query's rows
                _give_back(ctx, [*spooled, *tables], (partitions, budget.pool_bytes, swap))
            return
        del ctx  # the failed run's session and whatever its operators still held
        if hooks.reran is not None:
            hooks.reran(SortMergeRerun(exhausted, budget.pool_bytes))
        yield from _run_sort_merge(decomposition, spooled, budget, pace, clock, tables)


def _common_once(
    ctx: Any,
    decomposition: Decomposition,
    tables: dict[str, pa.Table],
    spool: Spool,
    spooled: Mapping[str, SpooledFragment],
    partitions: int,
    cut: Collection[str],
) -> tuple[Decomposition, dict[str, pa.Table]]:
    """The super-plan's parts that occur more than once run now, once (``common_parts``), in
    what the spool's share of memory leaves; the super-plan reads their tables instead."""
    inputs = common_parts.Inputs.of(
        common_parts.same_outputs(decomposition.fragments, cut),
        {name: output.rows for name, output in spooled.items()},
        decomposition.output_schema,
    )
    held_max = max(0, spool.memory_bytes_max - spool.memory_bytes)
    plan, common = common_parts.run_once(
        ctx, decomposition.super_plan, inputs, held_max, partitions
    )
    if not common:
        return decomposition, tables
    return replace(decomposition, super_plan=plan), {**tables, **common}


def _small_builds(
    decomposition: Decomposition,
    spooled: Mapping[str, SpooledFragment],
    tables: Mapping[str, pa.Table],
) -> tuple[Decomposition, bool]:
    """The super-plan with each join building on its input of fewer delivered rows
    (``rules.build_side``), and whether DataFusion may still swap its joins (it may where the
    rule could not judge them all)."""
    rows = {name: output.rows for name, output in spooled.items()}
    rows.update((name, table.num_rows) for name, table in tables.items())
    plan = tree.parse_plan(decomposition.super_plan)
    turned = build_side.smaller_builds(plan, rows)
    if turned is None:
        return decomposition, True
    if not turned:
        return decomposition, False
    return replace(decomposition, super_plan=plan.SerializeToString()), False


def _run_as_planned(
    ctx: Any, decomposition: Decomposition, budget: MemoryBudget, pace: HostPace, clock: Tally
) -> Generator[pa.RecordBatch, None, str | None]:
    """The super-plan's batches; then None, or the hash join's memory consumer that did not
    fit before any batch came out, for the caller to run it again with sort-merge joins. Any
    other lack of memory is the query's error: once rows are out, a run again would give them
    twice."""
    yielded = False
    try:
        for batch in _execute(ctx, decomposition, pace, clock):
            yielded = True
            yield batch
    except Exception as error:  # DataFusion raises plain Exceptions
        consumer = engine.memory_exhausted(error)
        if consumer is None:
            raise
        if yielded or not _hash_join(consumer):
            raise HostMemoryExceeded(_exceeded_message(consumer, budget)) from None
        return consumer
    return None


def _run_sort_merge(
    decomposition: Decomposition,
    spooled: Mapping[str, SpooledFragment],
    budget: MemoryBudget,
    pace: HostPace,
    clock: Tally,
    tables: Mapping[str, pa.Table],
) -> Iterator[pa.RecordBatch]:
    """The super-plan once more over the same spooled inputs, its equi-joins as sort-merge
    joins, whose sorts spill: slower than hash joins, but held to the budget. Its session is
    made for this run and never kept, so no later query runs with its settings."""
    partitions = max(pace.cores, engine.SORT_MERGE_PARTITIONS_MIN)
    with clock.timing(process=True):
        ctx = engine.sort_merge_session(partitions, budget.pool_bytes)
        _register(ctx, decomposition, spooled, partitions, tables)
        engine.share_sort_reservations(ctx, decomposition.super_plan, partitions, budget.pool_bytes)
    try:
        yield from _execute(ctx, decomposition, pace, clock)
        return
    except Exception as error:  # DataFusion raises plain Exceptions
        consumer = engine.memory_exhausted(error)
        if consumer is None:
            raise
    # Raised out of the handler, the error keeps neither DataFusion's error nor the session
    # alive: the session's spills, in a directory of its own, go with it even while the caller
    # holds on to the error.
    del ctx
    raise HostMemoryExceeded(_exceeded_message(consumer, budget, sort_merge=True))


def _check_spooled(spooled: Mapping[str, SpooledFragment]) -> None:
    for name, output in spooled.items():
        on_disk = rows_in_files(output.files)
        assert on_disk == output.rows_on_disk, (
            f"{name}: the spool's files hold {on_disk} rows, {output.rows_on_disk} were written"
        )


def engine_partitions(spooled: Iterable[SpooledFragment], cores: int) -> int:
    """How many partitions the super-plan runs in: the host's cores, or one where every input
    is in memory and all of them hold fewer than ``ONE_PARTITION_ROWS_MAX`` rows. Over a few
    thousand rows, a second partition only adds its repartitioning and its hand-offs between
    threads (21 small TPC-DS SF 1 queries: 3.5% less host CPU on one, 2% less time)."""
    inputs = list(spooled)
    if any(output.rows_on_disk for output in inputs):
        return cores
    return 1 if sum(output.rows for output in inputs) <= ONE_PARTITION_ROWS_MAX else cores


def _register(
    ctx: Any,
    decomposition: Decomposition,
    spooled: Mapping[str, SpooledFragment],
    partitions: int,
    tables: Mapping[str, pa.Table],
) -> None:
    merge.register_merge_functions(ctx, functions_of(decomposition.super_plan))
    for name, output in spooled.items():
        engine.register_spooled(
            ctx, name, output.schema, output.batches, output.directory, partitions
        )
    register_computed(ctx, tables, partitions)


def _execute(
    ctx: Any, decomposition: Decomposition, pace: HostPace, clock: Tally
) -> Iterator[pa.RecordBatch]:
    schema = decomposition.output_schema
    with clock.timing(process=True):
        stream = engine.consume(ctx, decomposition.super_plan).execute_stream()
    for batch in clock.timed(pace.paced(stream), process=True):
        yield conform(batch.to_pyarrow(), schema)


def _give_back(ctx: Any, names: Iterable[str], kind: tuple[int, int, bool]) -> None:
    for name in names:
        for registered in engine.spooled_names(name):
            ctx.deregister_table(registered)
    _give_session(kind, ctx)


@dataclass(frozen=True)
class _Hooks:
    """What the caller is told, or asked, between the inputs' arrival and the super-plan."""

    inputs_in: Callable[[], object] | None = None
    reran: Callable[[SortMergeRerun], object] | None = None
    computed: Callable[[], Mapping[bytes, pa.Table]] | None = None
    cut: Collection[str] = ()  # fragments a join's keys cut: not taken for alike ones


# Super-plan sessions kept between queries, each used by one query at a time: a fresh session
# with its spill pool costs a third of a small super-plan's run (1.19 against 0.85 ms of CPU
# for a 40-row final aggregate). A query's pool is the session's, whole, while it runs (its
# operators let go of what they reserved when the plan ends); a session goes back only from a
# run read to its end, with every table it registered let go of; its spills go to a directory
# of its own, which DataFusion empties as each spill ends and removes with the session.
SESSIONS_KEPT_MAX = 4  # idle sessions per (cores, pool size, whether DataFusion swaps joins)
_idle_sessions: dict[tuple[int, int, bool], list[Any]] = {}  # by (cores, pool, swap joins)
_sessions_lock = threading.Lock()


def _take_session(partitions: int, pool_bytes: int, swap_joins: bool) -> Any:
    with _sessions_lock:
        idle = _idle_sessions.get((partitions, pool_bytes, swap_joins))
        if idle:
            return idle.pop()
    return engine.session(partitions, pool_bytes, swap_joins=swap_joins)


def _give_session(kind: tuple[int, int, bool], ctx: Any) -> None:
    with _sessions_lock:
        idle = _idle_sessions.setdefault(kind, [])
        if len(idle) < SESSIONS_KEPT_MAX:
            idle.append(ctx)


def _conformed(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    iterator = iter(batches)
    try:
        for batch in iterator:
            yield conform(batch, schema)
    finally:  # closed early (the spool stopped): let the producer stop too
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _hash_join(consumer: str) -> bool:
    return consumer.startswith(HASH_JOIN_CONSUMERS)


def _exceeded_message(consumer: str, budget: MemoryBudget, sort_merge: bool = False) -> str:
    if sort_merge:
        what = (
            "a join does not fit, not even run again as a sort-merge join that spills "
            f"({consumer or 'an operator'} ran out)"
        )
        also = ", or make the join's inputs smaller (a more selective filter)"
    elif consumer.startswith(("HashJoin", "NestedLoopJoin", "CrossJoin")):
        what = "a join's build side, which is held whole in memory, does not fit"
        also = ", or make the join's inputs smaller (a more selective filter)"
    else:
        what = f"{consumer or 'an operator'} could not spill enough to fit"
        also = ""
    variable = settings.SUPER_PLAN_MEMORY_MIB.name
    return (
        f"the host part of this query needs more memory than its budget of "
        f"{budget.bytes_max // MIB} MiB ({budget.pool_bytes // MIB} MiB for DataFusion): {what}. "
        f"Raise the budget with {variable}=<MiB> in the environment of the process "
        f"that runs the query (default {SUPER_PLAN_MEMORY_BYTES_MAX // MIB}){also}."
    )
