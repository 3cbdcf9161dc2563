"""A stand-in for devices and coordinator: run a decomposition over in-memory partitions.

Each dataset is split into partitions (one per "device") of several chunks (slice ranges). Per
chunk the "device" prunes with the zone map, then runs a stage: always `full`, or a random one
of its device stages (forced push-back). A chunk every row of which passes, under a sub-plan
slice statistics answer, is answered from its stored zone map as a device does. Rows that came
back `raw` or `filter`-ed are completed on the host, and the super-plan runs over the union.
"""

from __future__ import annotations

import decimal
import math
import random
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from quarry.plan import (
    Decomposition,
    complete,
    run_stage,
    run_super,
    slice_may_match,
    slice_must_match,
)
from quarry.plan.statistics import answer
from quarry.store.zonemap import zone_map as stored_zone_map

PARTITIONS = 4
CHUNKS_PER_PARTITION = 3


def chunks(
    table: pa.Table, partitions: int = PARTITIONS, chunks_per_partition: int = CHUNKS_PER_PARTITION
) -> list[pa.Table]:
    """Contiguous row ranges: partitions of whole rows, each cut into chunks."""
    pieces: list[pa.Table] = []
    rows = table.num_rows
    bounds = [rows * i // partitions for i in range(partitions + 1)]
    for start, stop in zip(bounds, bounds[1:]):
        inner = [
            start + (stop - start) * i // chunks_per_partition
            for i in range(chunks_per_partition + 1)
        ]
        pieces.extend(table.slice(a, b - a) for a, b in zip(inner, inner[1:]))
    return pieces


def zone_map(table: pa.Table, columns: Sequence[str]) -> dict[str, dict]:
    stats: dict[str, dict] = {}
    for name in columns:
        if name not in table.column_names:
            continue
        column = table.column(name)
        low_high = pc.min_max(column)
        stats[name] = {
            "min": low_high["min"].as_py(),
            "max": low_high["max"].as_py(),
            "null_count": column.null_count,
            "rows": table.num_rows,
        }
    return stats


def execute(
    decomposition: Decomposition,
    data: Mapping[str, pa.Table],
    stage_choice: str = "full",
    seed: int = 0,
    prune: bool = True,
    partitions: int = PARTITIONS,
    chunks_per_partition: int = CHUNKS_PER_PARTITION,
    computed: Callable[[Mapping[str, list[pa.RecordBatch]]], Mapping[bytes, pa.Table]]
    | None = None,
) -> pa.Table:
    """The query's answer; `stage_choice` is "full" or "random" (forced partial push-back).
    ``computed`` makes, from the fragments' outputs, parts of the super-plan already run."""
    rng = random.Random(seed)
    outputs: dict[str, list[pa.RecordBatch]] = {}
    for fragment in decomposition.fragments:
        table = data[fragment.dataset]
        done: list[pa.RecordBatch] = []
        pushed_back: list[pa.RecordBatch] = []
        columns = [p["column"] for p in fragment.predicates]
        for piece in chunks(table, partitions, chunks_per_partition):
            if (
                prune
                and fragment.predicates
                and not slice_may_match(fragment.predicates, zone_map(piece, columns))
            ):
                continue
            stage = "full"
            if stage_choice == "random":
                stage = rng.choice(fragment.device_stages)
            elif "full" not in fragment.device_stages:
                stage = "filter"
            answered = _answered(fragment, piece) if stage == "full" else None
            if answered is not None:  # a device answers it from the slice's statistics
                done.append(answered)
                continue
            batches = list(run_stage(fragment.stages[stage], table.schema, piece.to_batches()))
            (done if stage == "full" else pushed_back).extend(batches)
        if pushed_back or not done:
            done.extend(complete(fragment, pushed_back))
        outputs[fragment.name] = done
    parts = None if computed is None else (lambda: computed(outputs))
    return run_super(decomposition, outputs, computed=parts).read_all()


def _answered(fragment, piece: pa.Table) -> pa.RecordBatch | None:
    """The fragment's output over ``piece`` from its stored zone map, as a device answers a
    slice every row of which passes (None: it reads the slice)."""
    if not fragment.statistics or not piece.num_rows:
        return None
    stored = stored_zone_map(piece.combine_chunks().to_batches()[0])
    if fragment.predicates and not slice_must_match(fragment.predicates, stored):
        return None
    return answer(fragment.statistics, [(piece.num_rows, stored)], fragment.output_schema)


# ---- comparing answers -------------------------------------------------------------------

FLOAT_RELATIVE = 1e-9


def _scale(value: decimal.Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) else 0


def values_close(left: object, right: object, float_absolute: float = 0.0) -> bool:
    """Cell equality: exact for ints/strings/dates, 1e-9 relative for floats, decimals at scale.

    A decimal on either side is compared within one unit of the coarser decimal scale:
    DataFusion truncates avg of decimal(p, s) to scale s + 4 and divides decimals at its own
    scale, DuckDB returns a double or rounds at another scale; truncation is off by less than
    one unit of the last place, rounding by at most half.
    """
    if left is None or right is None:
        return left is None and right is None
    numbers = (int, float, decimal.Decimal)
    if (
        isinstance(left, bool)
        or isinstance(right, bool)
        or not (isinstance(left, numbers) and isinstance(right, numbers))
    ):
        return left == right
    if isinstance(left, int) and isinstance(right, int):
        return left == right
    a, b = float(left), float(right)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    scales = [_scale(x) for x in (left, right) if isinstance(x, decimal.Decimal)]
    tolerance = float_absolute
    if scales:
        tolerance = max(tolerance, 10.0 ** -min(scales))
    return math.isclose(a, b, rel_tol=FLOAT_RELATIVE, abs_tol=tolerance)


def _sort_key(row: tuple) -> tuple:
    key = []
    for value in row:
        if value is None:
            key.append((0, ""))
        elif isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool):
            key.append((1, round(float(value), 4)))
        else:
            key.append((2, str(value)))
    return tuple(key)


def rows_of(table: pa.Table) -> list[tuple]:
    return [tuple(row.values()) for row in table.to_pylist()] if table.num_columns else []


def duckdb_answer(table: pa.Table, name: str, sql: str) -> pa.Table:
    """What DuckDB answers for ``sql`` with ``table`` registered as ``name``: the reference
    every query path is checked against."""
    import duckdb

    connection = duckdb.connect()
    connection.register(name, table)
    return connection.execute(sql).fetch_arrow_table()


def duckdb_schema_answer(tables: Mapping[str, pa.Table], sql: str) -> pa.Table:
    """What DuckDB answers for ``sql`` over ``tables`` named ``schema/table`` (read as
    ``schema.table``)."""
    import duckdb

    connection = duckdb.connect()
    for schema in {name.split("/")[0] for name in tables}:
        connection.execute(f"CREATE SCHEMA {schema}")
    for name, table in tables.items():
        connection.register(name.replace("/", "_"), table)
        connection.execute(
            f"CREATE VIEW {name.replace('/', '.')} AS SELECT * FROM {name.replace('/', '_')}"
        )
    return connection.execute(sql).fetch_arrow_table()


def assert_same_rows(
    actual: pa.Table,
    expected: pa.Table,
    ordered: bool,
    float_absolute: float = 0.0,
    context: str = "",
) -> None:
    got, want = rows_of(actual), rows_of(expected)
    assert actual.num_columns == expected.num_columns, (
        f"{context}: {actual.num_columns} columns, expected {expected.num_columns}"
    )
    assert len(got) == len(want), f"{context}: {len(got)} rows, expected {len(want)}"
    if not ordered:
        got, want = sorted(got, key=_sort_key), sorted(want, key=_sort_key)
    for index, (g, w) in enumerate(zip(got, want)):
        assert all(values_close(a, b, float_absolute) for a, b in zip(g, w)), (
            f"{context}: row {index} differs: {g} != {w}"
        )


def cut_after(
    sql: str, schemas: Mapping[str, pa.Schema], *rules, capabilities: Mapping | None = None
):
    """The cut of `sql` after `rules`, in order, as the optimizer runs them (each rule tested
    on its own, after the row rules it needs)."""
    from quarry.plan.decompose import plan_cut
    from quarry.plan.optimizer import optimize
    from quarry.plan.trace import cut_snapshot

    cut, _, _ = plan_cut(sql, schemas, capabilities)
    cut, _ = optimize(cut, rules, cut_snapshot, copy=lambda cut: cut.copy())
    return cut


def kinds_down(rel) -> list[str]:
    """Relation kinds from `rel` down its single-input chain, e.g. ["aggregate", "filter", ...]."""
    from quarry.plan import tree

    chain = []
    while rel is not None:
        chain.append(tree.kind(rel))
        rel = tree.single_input(rel)
    return chain
