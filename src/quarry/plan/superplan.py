"""The host's side: completing fragments that came back unfinished, then running the super-plan.

The super-plan runs in a stated host memory budget (`SUPER_PLAN_MEMORY_BYTES_MAX`, or
$QUARRY_SUPER_PLAN_MEMORY_MIB, or `run_super(memory_bytes_max=...)`): a quarter of it holds
fragment outputs in memory (`spool.Spool`, the rest of them goes to disk), the other three
quarters are DataFusion's fair spill pool, so sorts and aggregations spill to the same
temporary directory instead of growing. Top-k and the final aggregation of partials stay
small by themselves; a join's build side must fit the pool, else the query ends with
`HostMemoryExceeded` naming the budget.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from substrait import algebra_pb2

from quarry.errors import QueryError
from quarry.plan import engine, merge, tree
from quarry.plan.decompose import Decomposition, Fragment
from quarry.plan.passthrough import passthrough_fragment
from quarry.plan.spool import MIB, Spool, rows_in_files
from quarry.plan.stage import run_stage

# Completion runs the full stage over bounded groups of pushed-back rows, so host memory stays
# bounded and output streams while rows still arrive. Any grouping is correct: the full stage
# of a union equals the union of full stages up to what the super-plan merges anyway.
COMPLETION_GROUP_BYTES_MAX = 64 * 1024 * 1024

# Host memory for one query's super-plan: fragment outputs held for it plus DataFusion's pool.
# Not counted: batches in flight in the coordinator's bounded queues and completion groups, and
# a few batches per partition that scans read ahead.
SUPER_PLAN_MEMORY_BYTES_MAX = 512 * MIB
SUPER_PLAN_MEMORY_ENV = "QUARRY_SUPER_PLAN_MEMORY_MIB"
# The spool's in-memory share is 1 / SPOOL_MEMORY_SHARE of the budget; the pool gets the rest.
SPOOL_MEMORY_SHARE = 4
SUPER_PLAN_MEMORY_BYTES_MIN = 8 * MIB  # below this a spilled sort cannot even merge its runs


def complete(
    fragment: Fragment,
    batches: Iterable[pa.RecordBatch],
    group_bytes_max: int = COMPLETION_GROUP_BYTES_MAX,
) -> Iterator[pa.RecordBatch]:
    """Run the fragment's `full` stage over rows that came back `raw` or `filter`-ed.

    The full stage contains the complete filter, so it also re-checks rows that a restricted
    device filtered with only part of the predicate. `batches` may hold more columns than the
    raw schema (whole slices); nothing is produced for no batches.
    """
    assert group_bytes_max > 0
    group: list[pa.RecordBatch] = []
    group_bytes = 0
    for batch in batches:
        group.append(batch)
        group_bytes += batch.nbytes
        if group_bytes >= group_bytes_max:
            yield from _complete_group(fragment, group)
            group, group_bytes = [], 0
    if group:
        yield from _complete_group(fragment, group)


def _complete_group(fragment: Fragment, group: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    schema = group[0].schema
    return run_stage(fragment.stages["full"], schema, group, target_partitions=engine.cpu_count())


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


class HostMemoryExceeded(QueryError):
    """The super-plan needs more host memory than its budget, for something that cannot spill."""

    code = "host_memory_exceeded"


@dataclass(frozen=True)
class MemoryBudget:
    """How a super-plan's host memory is shared: spool in memory, DataFusion's pool."""

    bytes_max: int
    spool_memory_bytes_max: int

    @property
    def pool_bytes(self) -> int:
        return self.bytes_max - self.spool_memory_bytes_max

    @classmethod
    def of(
        cls, bytes_max: int | None = None, spool_memory_bytes_max: int | None = None
    ) -> MemoryBudget:
        total = default_memory_bytes_max() if bytes_max is None else bytes_max
        if total < SUPER_PLAN_MEMORY_BYTES_MIN:
            raise QueryError(
                f"the super-plan memory budget is {total} bytes; it must be at least "
                f"{SUPER_PLAN_MEMORY_BYTES_MIN // MIB} MiB"
            )
        spool = (
            total // SPOOL_MEMORY_SHARE
            if spool_memory_bytes_max is None
            else spool_memory_bytes_max
        )
        assert 0 <= spool < total, f"spool memory {spool} must leave a pool within {total} bytes"
        return cls(total, spool)


def default_memory_bytes_max() -> int:
    """$QUARRY_SUPER_PLAN_MEMORY_MIB in MiB if set, else `SUPER_PLAN_MEMORY_BYTES_MAX`."""
    text = os.environ.get(SUPER_PLAN_MEMORY_ENV, "").strip()
    if not text:
        return SUPER_PLAN_MEMORY_BYTES_MAX
    try:
        mib = int(text)
    except ValueError:
        mib = 0
    if mib <= 0:
        raise QueryError(
            f"{SUPER_PLAN_MEMORY_ENV}={text!r}: give the super-plan's host memory budget as a "
            f"whole number of MiB, e.g. {SUPER_PLAN_MEMORY_ENV}=2048"
        )
    return mib * MIB


def run_super(
    decomposition: Decomposition,
    fragment_outputs: Mapping[str, Iterable[pa.RecordBatch]],
    memory_bytes_max: int | None = None,
    spool_memory_bytes_max: int | None = None,
    temp_directory: str | Path | None = None,
) -> pa.RecordBatchReader:
    """Run the super-plan over each fragment's (completed) output; the result streams.

    A super-plan that only reads one fragment (``passthrough``) is not run at all: its batches
    stream straight out as they arrive. Any other starts on the first read: every fragment's
    output is read to its end, all at once (`spool.Spool`: in memory up to
    `spool_memory_bytes_max`, a quarter of `memory_bytes_max` by default, the rest in Arrow
    IPC files in a directory under `temp_directory`), then DataFusion runs the super-plan in a
    spill pool of the rest of the budget and its batches stream out. The spool and whatever
    DataFusion spilled are removed when the reader is exhausted, fails, or is dropped (pyarrow's
    ``close`` keeps a reader's Python iterator alive until the reader itself goes).
    """
    missing = [f.name for f in decomposition.fragments if f.name not in fragment_outputs]
    if missing:
        raise ValueError(f"no output given for fragment(s) {', '.join(missing)}")
    schema = decomposition.output_schema
    only = passthrough_fragment(decomposition)
    if only is not None:  # nothing to run on the host: the fragment's rows are the answer
        batches = fragment_outputs[only.name]
        return pa.RecordBatchReader.from_batches(schema, (conform(b, schema) for b in batches))
    budget = MemoryBudget.of(memory_bytes_max, spool_memory_bytes_max)
    return pa.RecordBatchReader.from_batches(
        schema, _run(decomposition, fragment_outputs, budget, temp_directory)
    )


def _run(
    decomposition: Decomposition,
    fragment_outputs: Mapping[str, Iterable[pa.RecordBatch]],
    budget: MemoryBudget,
    temp_directory: str | Path | None,
) -> Iterator[pa.RecordBatch]:
    schema = decomposition.output_schema
    partitions = engine.cpu_count()
    with Spool(budget.spool_memory_bytes_max, temp_directory, partitions) as spool:
        spooled = spool.fill(
            {
                f.name: (f.output_schema, _conformed(fragment_outputs[f.name], f.output_schema))
                for f in decomposition.fragments
            }
        )
        ctx = engine.session(partitions, budget.pool_bytes, spool.directory)
        merge.register_merge_functions(
            ctx, tree.function_names(tree.parse_plan(decomposition.super_plan)).values()
        )
        for name, output in spooled.items():
            on_disk = rows_in_files(output.files)
            assert on_disk == output.rows_on_disk, (
                f"{name}: the spool's files hold {on_disk} rows, {output.rows_on_disk} were written"
            )
            engine.register_spooled(
                ctx, name, output.schema, output.batches, output.directory, partitions
            )
        try:
            stream = engine.consume(ctx, decomposition.super_plan).execute_stream()
            for batch in stream:
                yield conform(batch.to_pyarrow(), schema)
        except Exception as error:  # DataFusion raises plain Exceptions
            consumer = engine.memory_exhausted(error)
            if consumer is None:
                raise
            raise HostMemoryExceeded(_exceeded_message(consumer, budget)) from None


def _conformed(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    iterator = iter(batches)
    try:
        for batch in iterator:
            yield conform(batch, schema)
    finally:  # closed early (the spool stopped): let the producer stop too
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _exceeded_message(consumer: str, budget: MemoryBudget) -> str:
    join = consumer.startswith(("HashJoin", "NestedLoopJoin", "CrossJoin"))
    if join:
        what = "a join's build side, which is held whole in memory, does not fit"
        also = ", or make the join's inputs smaller (a more selective filter)"
    else:
        what = f"{consumer or 'an operator'} could not spill enough to fit"
        also = ""
    return (
        f"the host part of this query needs more memory than its budget of "
        f"{budget.bytes_max // MIB} MiB ({budget.pool_bytes // MIB} MiB for DataFusion): {what}. "
        f"Raise the budget with {SUPER_PLAN_MEMORY_ENV}=<MiB> in the environment of the process "
        f"that runs the query (default {SUPER_PLAN_MEMORY_BYTES_MAX // MIB}){also}."
    )


JOIN_RELS = ("join", "cross", "hash_join", "merge_join", "nested_loop_join")


def memory_summary(decomposition: Decomposition, budget: MemoryBudget | None = None) -> str:
    """How a (not pass-through) super-plan holds data, in words for EXPLAIN."""
    budget = budget or MemoryBudget.of()
    plan = tree.parse_plan(decomposition.super_plan)
    partial = {f.name for f in decomposition.fragments if "partial_aggregate" in f.pushed}
    holds: list[str] = []
    top_k_sorts = 0  # sorts right under a fetch: DataFusion runs them as top-k
    sorts = 0
    for rel in tree.iter_rels(plan):
        rel_kind = tree.kind(rel)
        if rel_kind == "fetch" and tree.kind(rel.fetch.input) == "sort":
            top_k_sorts += 1
            holds.append(f"top-k keeps {_fetch_rows(rel.fetch)} rows")
        elif rel_kind == "sort":
            sorts += 1
        elif rel_kind == "aggregate":
            if _reads_only(rel.aggregate.input, partial):
                holds.append("aggregates partials")
            else:
                holds.append("aggregate spills beyond the budget")
        elif rel_kind in JOIN_RELS or (
            rel_kind == "set" and rel.set.op != algebra_pb2.SetRel.SET_OP_UNION_ALL
        ):
            holds.append("join build side must fit the budget")
    if sorts > top_k_sorts:
        holds.append("sort spills beyond the budget")
    for message in tree.iter_messages(plan):
        if isinstance(message, algebra_pb2.Expression.Subquery):
            holds.append("join build side must fit the budget")  # subqueries become joins
        elif isinstance(message, algebra_pb2.Expression.WindowFunction):
            holds.append("window sort spills beyond the budget")
    summary = (
        f"streams fragments into a spool of at most {budget.spool_memory_bytes_max // MIB} MiB "
        f"in memory, the rest on disk; runs in a {budget.pool_bytes // MIB} MiB spill pool"
    )
    unique = list(dict.fromkeys(holds))
    return summary + (": " + ", ".join(unique) if unique else "")


def _fetch_rows(fetch: algebra_pb2.FetchRel) -> str:
    """The rows a top-k keeps: its count plus offset, as DataFusion's producer writes them."""
    count = _literal_int(fetch.count_expr) if fetch.HasField("count_expr") else None
    offset = _literal_int(fetch.offset_expr) if fetch.HasField("offset_expr") else 0
    if count is None or count < 0 or offset is None:
        return "its"
    return f"{count + offset:,}"


def _literal_int(expression: algebra_pb2.Expression) -> int | None:
    kind = expression.literal.WhichOneof("literal_type")
    return int(getattr(expression.literal, kind)) if kind in ("i8", "i16", "i32", "i64") else None


def _reads_only(rel: algebra_pb2.Rel, fragments: set[str]) -> bool:
    """Whether every read under `rel` reads one of `fragments` (no join in between)."""
    reads = [tree.named_table(r) for r in tree.iter_rels(rel) if tree.kind(r) == "read"]
    kinds = {tree.kind(r) for r in tree.iter_rels(rel)}
    return (
        bool(reads)
        and not kinds & set(JOIN_RELS)
        and all(names is not None and len(names) == 1 and names[0] in fragments for names in reads)
    )
