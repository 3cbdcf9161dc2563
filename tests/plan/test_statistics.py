"""Answers from slice statistics: which sub-plans they answer, what they answer, and that the
answer is the one a device computes by reading the slices (and DuckDB's)."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.errors import ProtocolError
from quarry.plan import decompose
from quarry.plan.statistics import SliceStatistic, answer
from quarry.store.zonemap import zone_map

from .harness import assert_same_rows, execute
from .test_property import EXAMPLES, SCHEMA, _literal, tables

SCHEMAS = {"test/t": SCHEMA}


def _statistics(sql: str) -> list[tuple[str, str]]:
    (fragment,) = decompose(sql, SCHEMAS).fragments
    return [(s.function, s.column) for s in fragment.statistics]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT count(*) FROM t", [("rows", "")]),
        ("SELECT sum(f) FROM t WHERE i > 3", [("sum", "f")]),
        (
            "SELECT count(*), count(s), min(f), max(s), sum(i) FROM t WHERE i > 3 AND f <= 2",
            [("rows", ""), ("count", "s"), ("min", "f"), ("max", "s"), ("sum", "i")],
        ),
        ("SELECT avg(f) FROM t WHERE i IS NOT NULL", [("sum", "f"), ("count", "f")]),
        ("SELECT min(i), max(i) FROM t WHERE i IS NOT NULL", [("min", "i"), ("max", "i")]),
    ],
)
def test_an_aggregate_of_stored_columns_is_answered(sql, expected) -> None:
    assert _statistics(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT g, sum(f) FROM t GROUP BY g",  # one row per group, not per slice
        "SELECT sum(f + 1) FROM t",  # an expression, not a stored column
        "SELECT sum(f) FROM t WHERE i + 1 > 3",  # a filter zone maps cannot judge
        "SELECT sum(f) FROM t WHERE i > 3 OR f < 0",
        "SELECT count(DISTINCT i) FROM t",
        "SELECT sum(f) FILTER (WHERE i > 0) FROM t",
        "SELECT var_samp(f) FROM t",
        "SELECT f FROM t WHERE i > 3",  # rows, not an aggregate
    ],
)
def test_anything_else_is_not(sql) -> None:
    assert _statistics(sql) == []


def _slice(**columns) -> tuple[int, dict]:
    batch = pa.record_batch(columns)
    return batch.num_rows, zone_map(batch)


def test_statistics_add_up_across_slices() -> None:
    slices = [
        _slice(i=pa.array([1, None, 5], pa.int64()), f=pa.array([0.5, 1.5, None])),
        _slice(i=pa.array([None, None], pa.int64()), f=pa.array([-2.0, 8.0])),
    ]
    statistics = [
        SliceStatistic("rows"),
        SliceStatistic("count", "i"),
        SliceStatistic("sum", "i"),
        SliceStatistic("min", "f"),
        SliceStatistic("max", "i"),
        SliceStatistic("sum", "f"),
    ]
    schema = pa.schema(
        [(n, pa.int64()) for n in ("n", "ci", "si")]
        + [("mf", pa.float64()), ("xi", pa.int64()), ("sf", pa.float64())]
    )
    batch = answer(statistics, slices, schema)
    assert batch.to_pylist() == [{"n": 5, "ci": 2, "si": 6, "mf": -2.0, "xi": 5, "sf": 8.0}]


def test_a_column_with_no_value_sums_to_null() -> None:
    slices = [_slice(i=pa.array([None, None], pa.int64()))]
    schema = pa.schema([("s", pa.int64()), ("m", pa.int64()), ("c", pa.int64())])
    statistics = [
        SliceStatistic("sum", "i"),
        SliceStatistic("min", "i"),
        SliceStatistic("count", "i"),
    ]
    assert answer(statistics, slices, schema).to_pylist() == [{"s": None, "m": None, "c": 0}]


def test_what_statistics_cannot_say_exactly_is_read() -> None:
    schema = pa.schema([("x", pa.float64())])
    # NaN: the engine orders it above every number, the bounds skip it; sums are not kept
    nan = [_slice(f=pa.array([1.0, math.nan]))]
    assert answer([SliceStatistic("max", "f")], nan, schema) is None
    assert answer([SliceStatistic("sum", "f")], nan, schema) is None
    # a store written before sums were kept
    old = [(2, {"f": {"min": 1.0, "max": 2.0, "null_count": 0, "rows": 2, "nan_count": 0}})]
    assert answer([SliceStatistic("sum", "f")], old, schema) is None
    # a total past 64 bits: the engine's own sum decides what happens
    big = [_slice(i=pa.array([2**62, 2**62 - 1], pa.int64()))] * 2
    assert answer([SliceStatistic("sum", "i")], big, pa.schema([("x", pa.int64())])) is None
    # a column the zone map does not cover
    assert answer([SliceStatistic("min", "g")], nan, schema) is None


def test_zone_maps_keep_sums_only_when_exact() -> None:
    batch = pa.record_batch(
        {
            "i": pa.array([1, 2, None], pa.int64()),
            "f": pa.array([0.25, 0.5, 1.0]),
            "nan": pa.array([1.0, math.nan, 2.0]),
            "inf": pa.array([math.inf, -math.inf, 1.0]),
            "big": pa.array([2**62, 2**62, 0], pa.int64()),
            "u": pa.array([1, 2, 3], pa.uint64()),
            "none": pa.array([None, None, None], pa.int64()),
            "s": pa.array(["a", "b", "c"]),
        }
    )
    stored = zone_map(batch)
    assert stored["i"]["sum"] == 3 and stored["f"]["sum"] == 1.75
    for column in ("nan", "inf", "big", "u", "none", "s"):
        assert "sum" not in stored[column], column


@st.composite
def statistics_queries(draw) -> str:
    count = draw(st.integers(1, 4))
    measures = []
    for index in range(count):
        template = draw(st.sampled_from(("count(*)", "count({c})", "sum({n})", "min({c})")))
        template = draw(st.sampled_from((template, template.replace("min", "max"))))
        column = draw(st.sampled_from(("g", "h", "i", "f", "s")))
        measures.append(
            f"{template.format(c=column, n=draw(st.sampled_from(('i', 'f'))))} AS a{index}"
        )
    conjuncts = []
    for _ in range(draw(st.integers(0, 2))):
        column = draw(st.sampled_from(("g", "i", "f")))
        op = draw(st.sampled_from(("<", "<=", ">", ">=", "=", "<>")))
        conjuncts.append(f"{column} {op} {draw(_literal(column))}")
    where = f" WHERE {' AND '.join(conjuncts)}" if conjuncts else ""
    return f"SELECT {', '.join(measures)} FROM t{where}"


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=tables(),
    sql=statistics_queries(),
    ordered=st.booleans(),
    partitions=st.integers(1, 4),
    chunks_per_partition=st.integers(1, 3),
)
def test_answered_from_statistics_as_read(
    table: pa.Table, sql: str, ordered: bool, partitions: int, chunks_per_partition: int
) -> None:
    """Whether a device answers a slice from its statistics or reads it, the answer is the
    same, and DuckDB's (sorted tables: whole slices pass a range filter)."""
    if ordered:
        table = table.sort_by([("i", "ascending"), ("f", "ascending")])
    data = {"test/t": table}
    connection = duckdb.connect()
    connection.register("t", table)
    expected = connection.execute(sql).fetch_arrow_table()
    for mode in ("always", "never"):
        got = execute(
            decompose(sql, SCHEMAS, pushdown=mode),
            data,
            partitions=partitions,
            chunks_per_partition=chunks_per_partition,
        )
        assert_same_rows(got, expected, ordered=False, context=f"{mode}: {sql}")


def test_a_statistic_a_device_does_not_know_is_refused() -> None:
    with pytest.raises(ProtocolError, match="no slice statistic 'avg'"):
        SliceStatistic.from_json({"function": "avg", "column": "f"})
