"""DataFusion glue: sessions, Substrait in and out, schemas, and the catalog of stored datasets.

Everything that talks to DataFusion's Python API lives here, so the rules stay protobuf surgery.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from datafusion import (
    DataFrame,
    ExecutionPlan,
    RuntimeEnvBuilder,
    SessionConfig,
    SessionContext,
)
from datafusion.substrait import Consumer, Producer, Serde
from substrait import algebra_pb2, plan_pb2, type_pb2

from quarry.plan import depth, tree
from quarry.store import codec

RESERVED_PREFIX = "__quarry"
# A sort reserves this share of its partition's part of the pool up front, to merge what it
# spilled; DataFusion's default (10 MiB a partition) would not fit a small pool at all.
SORT_SPILL_RESERVATION_SHARE = 4
SORT_SPILL_RESERVATION_BYTES_MAX = 10 * 1024 * 1024


# A session whose equi-joins are sort-merge joins (`sort_merge_session`) sorts both inputs of
# every join in every partition, so many sorts share its pool at once (TPC-H Q18: five a
# partition). Measured on Q18's super-plan over its fragments' outputs at SF 1 (DataFusion 55):
# with `session`'s settings alone it fails even in a 96 MiB pool, a sort unable to take its
# first batch; merging at most 4 spilled runs at a time (a merge otherwise reserves,
# unspillable, a batch for every run it reads), batches of 2,048 rows (every sort holds at
# least one) and each sort's reservation a share among all of them (`share_sort_reservations`),
# it answers in a 12 MiB pool on 2 partitions, 24 MiB on 4 and 48 MiB on 8.
SORT_MERGE_FAN_IN_MAX = 4
SORT_MERGE_BATCH_ROWS = 2048
# DataFusion plans an equi-join as a sort-merge join only over two partitions or more; over one
# it makes a hash join whatever it was told.
SORT_MERGE_PARTITIONS_MIN = 2


def session(
    target_partitions: int | None = None,
    memory_pool_bytes: int | None = None,
    temp_directory: str | Path | None = None,
    optimize: bool = True,
    swap_joins: bool = True,
) -> SessionContext:
    """A DataFusion session; with `memory_pool_bytes`, its operators share a fair spill pool
    of that size and sorts and aggregations spill to `temp_directory` (else the OS's
    temporary directory) instead of growing. Without `optimize`, plans run as they come (no
    logical optimizer pass; the analyzer's type coercion and the physical optimizer still run):
    for plans the optimizer already made, whose second pass finds nothing but costs a third of
    a small stage's run. Without `swap_joins`, each hash join builds on its left input as the
    plan says (``rules.build_side`` chose it), DataFusion's statistics never turning it round."""
    config = SessionConfig()
    if target_partitions is not None:
        config = config.with_target_partitions(target_partitions)
    if not optimize:
        config = config.set("datafusion.optimizer.max_passes", "0")
    if not swap_joins:
        config = config.set("datafusion.optimizer.join_reordering", "false")
    if memory_pool_bytes is None:
        return SessionContext(config)
    partitions = target_partitions or cpu_count()
    return _spilling(config, partitions, memory_pool_bytes, temp_directory)


def sort_merge_session(target_partitions: int, memory_pool_bytes: int) -> SessionContext:
    """A session with a fair spill pool, as `session` makes it, whose equi-joins run as
    sort-merge joins: slower than hash joins, but held to the pool, where a hash join holds its
    whole build side. Its spills go to a temporary directory of DataFusion's own under the OS's,
    removed with the session: the merge fan-in is a runtime setting, and setting one (DataFusion
    55) drops the spill directory a session was made with."""
    assert target_partitions >= SORT_MERGE_PARTITIONS_MIN and memory_pool_bytes > 0
    config = (
        SessionConfig()
        .with_target_partitions(target_partitions)
        .set("datafusion.optimizer.prefer_hash_join", "false")
        .set("datafusion.execution.batch_size", str(SORT_MERGE_BATCH_ROWS))
    )
    ctx = _spilling(config, target_partitions, memory_pool_bytes, None)
    fan_in = f"SET datafusion.runtime.max_spill_merge_fan_in = '{SORT_MERGE_FAN_IN_MAX}'"
    ctx.sql(fan_in).collect()
    return ctx


def share_sort_reservations(
    ctx: SessionContext, plan: plan_pb2.Plan | bytes, partitions: int, memory_pool_bytes: int
) -> None:
    """Make what each sort reserves up front to merge its spills a share of the pool among all
    the sorts of `plan`, which run at once in every partition. Plans made on `ctx` before keep
    the reservation they were made with."""
    sorts = max(1, sorts_in(consume(ctx, plan).execution_plan()))
    reservation_bytes = min(
        SORT_SPILL_RESERVATION_BYTES_MAX,
        memory_pool_bytes // (SORT_SPILL_RESERVATION_SHARE * partitions * sorts),
    )
    setting = f"SET datafusion.execution.sort_spill_reservation_bytes = '{reservation_bytes}'"
    ctx.sql(setting).collect()


def sorts_in(plan: ExecutionPlan) -> int:
    """The full sorts in a physical plan (a top-k keeps its rows, no spill)."""
    shown = plan.display()
    own = shown.startswith("SortExec:") and not shown.startswith("SortExec: TopK")
    return int(own) + sum(sorts_in(child) for child in plan.children())


def _spilling(
    config: SessionConfig,
    partitions: int,
    memory_pool_bytes: int,
    temp_directory: str | Path | None,
) -> SessionContext:
    assert memory_pool_bytes > 0
    reservation_bytes = min(
        SORT_SPILL_RESERVATION_BYTES_MAX,
        memory_pool_bytes // (SORT_SPILL_RESERVATION_SHARE * partitions),
    )
    settings = {
        "datafusion.execution.sort_spill_reservation_bytes": str(reservation_bytes),
        # Split into byte ranges, a file is read through a path that keeps about as much
        # memory as it read until the process ends (DataFusion 55); a whole file is read a
        # batch at a time. Spooled fragments come as one file per partition instead.
        "datafusion.optimizer.repartition_file_scans": "false",
        # A round-robin repartition buffers, outside any spill, whatever its consumers (a
        # spilling sort) do not take yet; inputs come already split into partitions.
        "datafusion.optimizer.enable_round_robin_repartition": "false",
        # Sorting each partition and merging them leaves the merge, which cannot spill,
        # starved when the sorts end near their share of the pool; one sort gets all of it.
        "datafusion.optimizer.repartition_sorts": "false",
    }
    for key, value in settings.items():
        config = config.set(key, value)
    runtime = RuntimeEnvBuilder().with_fair_spill_pool(memory_pool_bytes)
    if temp_directory is None:
        runtime = runtime.with_disk_manager_os()
    else:
        runtime = runtime.with_temp_file_path(temp_directory)
    return SessionContext(config, runtime)


_EXHAUSTED = re.compile(r"Resources exhausted: Failed to allocate .*? for (\w+)")


def memory_exhausted(error: BaseException) -> str | None:
    """The operator (DataFusion's memory consumer) that could not grow within the pool, or
    None when `error` is not about memory; "" when the consumer is not named."""
    message = str(error)
    if "Resources exhausted" not in message:
        return None
    found = _EXHAUSTED.search(message)
    return found.group(1) if found else ""


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def register_batches(
    ctx: SessionContext,
    reference: str,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    partitions: int = 1,
) -> None:
    """Register an in-memory table; a table with no batches still carries its schema.

    Batches are dealt round-robin into `partitions` partitions so that DataFusion can scan
    them in parallel.
    """
    dealt: list[list[pa.RecordBatch]] = [[] for _ in range(max(partitions, 1))]
    for index, batch in enumerate(batches):
        dealt[index % len(dealt)].append(aligned(batch))
    filled = [partition for partition in dealt if partition]
    ctx.register_record_batches(reference, filled or [[codec.empty_batch(schema)]])


WIDE_ALIGNMENT = 16  # what the engine needs of a 128-bit value's buffer (decimal128's i128)


def aligned(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each column of 128-bit values whose buffer is not on a 16-byte boundary
    copied to one. Batches that arrive over Flight lie where the IPC stream put them, on 8
    bytes; handed such a decimal column, the engine realigns it itself, far slower than a copy
    (320,000 rows of two decimals: 32 ms against 1 ms; TPC-H SF 1 Q9 spent a fifth of the
    host's CPU there)."""
    columns = batch.columns
    if not any(_misaligned(column) for column in columns):
        return batch
    copied = [pa.concat_arrays([c, c[:0]]) if _misaligned(c) else c for c in columns]
    return pa.RecordBatch.from_arrays(copied, schema=batch.schema)


def _misaligned(column: pa.Array) -> bool:
    kind = column.type
    if not pa.types.is_decimal(kind) or kind.bit_width < 128:
        return False
    values = column.buffers()[1]
    return values is not None and values.address % WIDE_ALIGNMENT != 0


def spooled_names(reference: str) -> tuple[str, ...]:
    """Every name ``register_spooled`` may register for a table (to let go of them after)."""
    return (reference, f"{reference}__disk", f"{reference}__memory")


def register_spooled(
    ctx: SessionContext,
    reference: str,
    schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    directory: Path | None,
    partitions: int = 1,
) -> None:
    """Register a table of in-memory `batches` plus the Arrow IPC files in `directory`.

    The files are scanned as a stream, a batch at a time per partition (see `session`); the
    table is the union of both parts, so filters and projections reach each of them.
    """
    if directory is None:
        register_batches(ctx, reference, schema, batches, partitions)
        return
    disk_name = f"{reference}__disk"
    ctx.register_arrow(disk_name, str(directory), schema=schema, file_extension=".arrow")
    frame = ctx.table(disk_name)
    if batches:
        memory_name = f"{reference}__memory"
        register_batches(ctx, memory_name, schema, batches, partitions)
        frame = ctx.table(memory_name).union(frame)
    ctx.register_view(reference, frame)


def consume(ctx: SessionContext, plan: plan_pb2.Plan | bytes) -> DataFrame:
    """The plan as a DataFusion frame on ``ctx``; one too deep for DataFusion's decoder is
    consumed in parts (``depth``)."""
    data = plan if isinstance(plan, bytes) else plan.SerializeToString()
    try:
        decoded = Serde.deserialize_bytes(data)
    except Exception as error:  # DataFusion raises plain Exceptions
        if not depth.too_deep(error):
            raise
        return _consumed_in_parts(ctx, tree.parse_plan(data))
    logical_plan = Consumer.from_substrait_plan(ctx, decoded)
    return ctx.create_dataframe_from_logical_plan(logical_plan)


_parts = itertools.count()


def _consumed_in_parts(ctx: SessionContext, plan: plan_pb2.Plan) -> DataFrame:
    """Each part a view of ``ctx`` while the parts above it are consumed, then let go of: the
    frames hold the views' plans, which DataFusion inlines where they are read."""
    names: list[str] = []

    def register(part: plan_pb2.Plan) -> algebra_pb2.Rel:
        name = f"{RESERVED_PREFIX}_part_{next(_parts)}"
        frame = consume(ctx, part)
        schema = frame.schema()
        if not any(pa.types.is_nested(f.type) for f in schema):  # names a view can hold
            del part.relations[0].root.names[:]
            part.relations[0].root.names.extend(f"c{i}" for i in range(len(schema)))
            frame = consume(ctx, part)
            schema = frame.schema()
        ctx.register_view(name, frame)
        names.append(name)
        return _typed_read(name, schema)

    try:
        return consume(ctx, depth.split(plan, register))
    finally:
        for name in names:
            ctx.deregister_table(name)


def _typed_read(name: str, schema: pa.Schema) -> algebra_pb2.Rel:
    """A read of table ``name`` typed exactly as DataFusion's producer types one of ``schema``."""
    ctx = session()
    register_batches(ctx, name, schema, [])
    read = tree.copy_rel(tree.root_rel(produce(ctx, ctx.table(name))))
    assert tree.kind(read) == "read", f"SELECT * planned as {tree.kind(read)}, not a read"
    read.read.ClearField("projection")
    return read


def produce(ctx: SessionContext, frame: DataFrame) -> plan_pb2.Plan:
    return produce_logical(ctx, frame.optimized_logical_plan())


def produce_logical(ctx: SessionContext, logical_plan) -> plan_pb2.Plan:
    plan = tree.parse_plan(Producer.to_substrait_plan(logical_plan, ctx).encode())
    # DataFusion also writes each grouping set's expressions in the deprecated field 1 of
    # AggregateRel.Grouping, which this protobuf version no longer declares; kept as an unknown
    # field, it would survive our rewrites of `grouping_expressions` and DataFusion's consumer
    # would read the stale copy. `expression_references` carries the same information.
    plan.DiscardUnknownFields()
    _unique_names_in(plan)
    _conditioned_joins(plan)
    return plan


def _conditioned_joins(plan: plan_pb2.Plan) -> None:
    """DataFusion's optimizer drops a join condition it finds always true (``a LEFT JOIN b ON
    NOT CAST(NULL AS INTEGER) IS NOT NULL``, in SQLite's corpus) and its producer then writes
    the join with none, which its consumer refuses ("join condition should not be empty"): the
    condition is written back as the ``true`` it was."""
    for rel in tree.iter_rels(plan):
        if tree.kind(rel) == "join" and not rel.join.HasField("expression"):
            rel.join.expression.literal.boolean = True


def _unique_names_in(plan: plan_pb2.Plan) -> None:
    """A query may answer two columns of one name (SELECT * FROM a, b); DataFusion's consumer
    refuses a plan whose root names repeat, or an empty relation's (what such a query with a
    false filter plans as), so those are made unique; the answer takes the query's own names
    back where it is conformed to its output schema (``superplan.conform``)."""
    for relation in plan.relations:
        if relation.HasField("root"):
            _made_unique(relation.root.names)
    for rel in tree.iter_rels(plan):
        if tree.kind(rel) == "read" and rel.read.HasField("virtual_table"):
            _made_unique(rel.read.base_schema.names)


def _made_unique(names: MutableSequence[str]) -> None:
    unique = unique_names(names)
    if unique != list(names):
        del names[:]
        names.extend(unique)


def plan_schema(ctx: SessionContext, plan: plan_pb2.Plan) -> pa.Schema:
    return consume(ctx, plan).schema()


def unique_names(names: Iterable[str]) -> list[str]:
    """Names made unique, because DataFusion tables need unique column names."""
    seen: dict[str, int] = {}
    result: list[str] = []
    for name in names:
        candidate = name
        while candidate in seen:
            seen[name] += 1
            candidate = f"{name}__{seen[name]}"
        seen[candidate] = 0
        result.append(candidate)
    return result


# Substrait -> Arrow for the types DataFusion's producer writes; type variation 1 / 2 mark
# DataFusion's wider or view variants (unsigned ints, large and view strings, date64).
_INTEGERS = {
    "i8": (pa.int8(), pa.uint8()),
    "i16": (pa.int16(), pa.uint16()),
    "i32": (pa.int32(), pa.uint32()),
    "i64": (pa.int64(), pa.uint64()),
}
_TIME_UNITS = {0: "s", 3: "ms", 6: "us", 9: "ns"}


def arrow_type(substrait_type: type_pb2.Type) -> pa.DataType | None:
    """The Arrow type DataFusion uses for a Substrait type, or None when not known here."""
    which = substrait_type.WhichOneof("kind")
    value = getattr(substrait_type, which) if which else None
    variation = getattr(value, "type_variation_reference", 0)
    if which in _INTEGERS:
        return _INTEGERS[which][1 if variation == 1 else 0]
    simple = {"bool": pa.bool_(), "fp32": pa.float32(), "fp64": pa.float64()}
    if which in simple:
        return simple[which]
    if which == "string":
        return {0: pa.string(), 1: pa.large_string(), 2: pa.string_view()}.get(variation)
    if which == "binary":
        return {0: pa.binary(), 1: pa.large_binary(), 2: pa.binary_view()}.get(variation)
    if which == "date":
        return pa.date64() if variation == 1 else pa.date32()
    if which == "decimal":
        return pa.decimal128(value.precision, value.scale)
    if which == "precision_timestamp":
        return pa.timestamp(_TIME_UNITS.get(value.precision, "us"))
    return None


def read_arrow_schema(read: algebra_pb2.ReadRel) -> dict[str, pa.DataType | None]:
    names = tree.read_field_names(read)
    return {name: arrow_type(t) for name, t in zip(names, read.base_schema.struct.types)}


@dataclass
class Catalog:
    """The stored datasets as SQL tables: `domain.name`, and bare `name` when unambiguous."""

    tables: Mapping[str, pa.Schema]
    _by_reference: dict[tuple[str, ...], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bare_count: dict[str, int] = {}
        for dataset in self.tables:
            domain, name = split_dataset(dataset)
            bare_count[name] = bare_count.get(name, 0) + 1
        for dataset in self.tables:
            domain, name = split_dataset(dataset)
            self._by_reference[(domain, name)] = dataset
            if bare_count[name] == 1:
                self._by_reference[(name,)] = dataset

    def register(self, ctx: SessionContext) -> None:
        domains = sorted({split_dataset(dataset)[0] for dataset in self.tables})
        for domain in domains:
            ctx.sql(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(domain)}").collect()
        for reference, dataset in self._by_reference.items():
            sql_name = ".".join(quote_identifier(part) for part in reference)
            register_batches(ctx, sql_name, self.tables[dataset], [])

    def dataset_of(self, names: tuple[str, ...]) -> str | None:
        """The dataset a read's named table refers to, whatever qualification DataFusion kept."""
        parts = list(names)
        if len(parts) == 3 and parts[0] == "datafusion":
            parts = parts[1:]
        if (
            len(parts) == 2
            and parts[0] == "public"
            and ("public", parts[1]) not in self._by_reference
        ):
            parts = parts[1:]
        return self._by_reference.get(tuple(parts))

    def sql_names(self) -> list[str]:
        return sorted(".".join(reference) for reference in self._by_reference)


def split_dataset(dataset: str) -> tuple[str, str]:
    """("domain", "name") from "domain/name"."""
    domain, slash, name = dataset.partition("/")
    if not slash or not domain or not name or "/" in name:
        raise ValueError(f"dataset names are 'domain/name', got {dataset!r}")
    if domain.startswith(RESERVED_PREFIX) or name.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"dataset {dataset!r}: names starting with {RESERVED_PREFIX!r} are "
            "reserved for quarry's fragment tables"
        )
    return domain, name


def cpu_count() -> int:
    return os.cpu_count() or 1
