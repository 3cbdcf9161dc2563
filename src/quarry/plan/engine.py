"""DataFusion glue: sessions, Substrait in and out, schemas, and the catalog of stored datasets.

Everything that talks to DataFusion's Python API lives here, so the rules stay protobuf surgery.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from datafusion import DataFrame, SessionConfig, SessionContext
from datafusion.substrait import Consumer, Producer, Serde
from substrait import algebra_pb2, plan_pb2, type_pb2

from quarry.plan import tree

RESERVED_PREFIX = "__quarry"


def session(target_partitions: int | None = None) -> SessionContext:
    config = SessionConfig()
    if target_partitions is not None:
        config = config.with_target_partitions(target_partitions)
    return SessionContext(config)


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


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
        dealt[index % len(dealt)].append(batch)
    filled = [partition for partition in dealt if partition]
    ctx.register_record_batches(reference, filled or [[empty_batch(schema)]])


def consume(ctx: SessionContext, plan: plan_pb2.Plan | bytes) -> DataFrame:
    data = plan if isinstance(plan, bytes) else plan.SerializeToString()
    logical_plan = Consumer.from_substrait_plan(ctx, Serde.deserialize_bytes(data))
    return ctx.create_dataframe_from_logical_plan(logical_plan)


def produce(ctx: SessionContext, frame: DataFrame) -> plan_pb2.Plan:
    return produce_logical(ctx, frame.optimized_logical_plan())


def produce_logical(ctx: SessionContext, logical_plan) -> plan_pb2.Plan:
    plan = tree.parse_plan(Producer.to_substrait_plan(logical_plan, ctx).encode())
    # DataFusion also writes each grouping set's expressions in the deprecated field 1 of
    # AggregateRel.Grouping, which this protobuf version no longer declares; kept as an unknown
    # field, it would survive our rewrites of `grouping_expressions` and DataFusion's consumer
    # would read the stale copy. `expression_references` carries the same information.
    plan.DiscardUnknownFields()
    return plan


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
