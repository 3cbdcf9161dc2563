"""Property: the answer does not depend on how much the devices did.

Random tables (ints, floats, strings, nulls) and random filter + group-by + aggregate queries
give the same answer with pushdown never, always, and always with a random stage per chunk over
random partition and chunk counts; and the same answer as DuckDB.

Floats are multiples of 1/8 below 125 in magnitude, so every sum of them is exact in binary
floating point and sums and averages must agree to the last bit whatever the summation order;
variances come from different algorithms (Welford on one side, Chan's merge on the other) and
agree to 1e-9 relative.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.plan import decompose
from quarry.settings import PROPERTY_EXAMPLES

from .harness import assert_same_rows, execute

ROWS_MAX = 60
NUMERIC = ("i", "f")
ANY_COLUMN = ("g", "h", "i", "f", "s")
GROUP_COLUMNS = ("g", "h")
AGGREGATES = (
    "count(*)",
    "count({any})",
    "sum({num})",
    "min({any})",
    "max({any})",
    "avg({num})",
    "var_samp({num})",
    "stddev({num})",
    "var_pop({num})",
    "count(DISTINCT {any})",
)
# Only duplicate-insensitive aggregates: the holistic rule pushes a DISTINCT below them.
DUPLICATE_INSENSITIVE = (
    "count(DISTINCT {any})",
    "min({any})",
    "max({any})",
    "sum(DISTINCT {num})",
    "avg(DISTINCT {num})",
)
WORDS = ("apple", "apricot", "banana", "blue", "cherry", "")
SCHEMA = pa.schema(
    [
        ("g", pa.int64()),
        ("h", pa.string()),
        ("i", pa.int64()),
        ("f", pa.float64()),
        ("s", pa.string()),
    ]
)
# More examples for a bug hunt: QUARRY_PROPERTY_EXAMPLES=2000 pytest tests/plan/test_property.py
EXAMPLES = PROPERTY_EXAMPLES.get() or 150
# Sums of 1/8-multiples are exact; the tolerance covers variance algorithms only.
FLOAT_ABSOLUTE = 1e-9


def _nullable(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


@st.composite
def tables(draw) -> pa.Table:
    rows = draw(st.integers(0, ROWS_MAX))

    def column(strategy: st.SearchStrategy) -> list:
        return draw(st.lists(_nullable(strategy), min_size=rows, max_size=rows))

    return pa.table(
        {
            "g": column(st.integers(0, 3)),
            "h": column(st.sampled_from(("x", "y", "z"))),
            "i": column(st.integers(-1000, 1000)),
            "f": column(st.integers(-1000, 1000).map(lambda v: v / 8)),
            "s": column(st.sampled_from(WORDS)),
        },
        schema=SCHEMA,
    )


@st.composite
def predicates(draw) -> str:
    kind = draw(st.sampled_from(("compare", "null", "like", "arithmetic", "or")))
    if kind == "compare":
        column = draw(st.sampled_from(ANY_COLUMN))
        op = draw(st.sampled_from(("=", "<>", "<", "<=", ">", ">=")))
        return f"{column} {op} {draw(_literal(column))}"
    if kind == "null":
        column = draw(st.sampled_from(ANY_COLUMN))
        return f"{column} IS {draw(st.sampled_from(('', 'NOT ')))}NULL"
    if kind == "like":
        return f"s LIKE '{draw(st.sampled_from(('a%', '%e%', 'b_ue')))}'"
    if kind == "arithmetic":
        return f"i + {draw(st.integers(-50, 50))} > {draw(st.integers(-500, 500))}"
    return f"({draw(predicates())} OR {draw(predicates())})"


def _literal(column: str) -> st.SearchStrategy:
    if column in ("g", "i"):
        return st.integers(-5, 5) if column == "g" else st.integers(-1000, 1000).map(str)
    if column == "f":
        return st.integers(-1000, 1000).map(lambda v: repr(v / 8))
    values = ("x", "y", "z") if column == "h" else WORDS
    return st.sampled_from(values).map(lambda v: f"'{v}'")


@st.composite
def queries(draw, templates: tuple[str, ...] = AGGREGATES) -> str:
    groups = draw(st.lists(st.sampled_from(GROUP_COLUMNS), unique=True, max_size=2))
    count = draw(st.integers(1, 4))
    measures = []
    for index in range(count):
        template = draw(st.sampled_from(templates))
        measure = template.format(
            any=draw(st.sampled_from(ANY_COLUMN)), num=draw(st.sampled_from(NUMERIC))
        )
        measures.append(f"{measure} AS a{index}")
    conjuncts = draw(st.lists(predicates(), max_size=3))
    where = f" WHERE {' AND '.join(conjuncts)}" if conjuncts else ""
    group_by = f" GROUP BY {', '.join(groups)}" if groups else ""
    return f"SELECT {', '.join([*groups, *measures])} FROM t{where}{group_by}"


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=tables(),
    sql=st.one_of(queries(), queries(DUPLICATE_INSENSITIVE)),
    partitions=st.integers(1, 4),
    chunks_per_partition=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_answer_independent_of_pushdown(
    table: pa.Table, sql: str, partitions: int, chunks_per_partition: int, seed: int
) -> None:
    _same_answer_every_cut(table, sql, partitions, chunks_per_partition, seed)


def _same_answer_every_cut(
    table: pa.Table, sql: str, partitions: int, chunks_per_partition: int, seed: int
) -> None:
    data = {"test/t": table}
    answers = {}
    for mode in ("never", "always", "random"):
        decomposition = decompose(
            sql, {"test/t": SCHEMA}, pushdown="never" if mode == "never" else "always"
        )
        answers[mode] = execute(
            decomposition,
            data,
            stage_choice="random" if mode == "random" else "full",
            seed=seed,
            partitions=partitions,
            chunks_per_partition=chunks_per_partition,
        )
    connection = duckdb.connect()
    connection.register("t", table)
    expected = connection.execute(sql).fetch_arrow_table()
    for mode, answer in answers.items():
        assert_same_rows(
            answer,
            answers["never"],
            ordered=False,
            float_absolute=FLOAT_ABSOLUTE,
            context=f"{mode} vs never: {sql}",
        )
        assert_same_rows(
            answer,
            expected,
            ordered=False,
            float_absolute=FLOAT_ABSOLUTE,
            context=f"{mode} vs DuckDB: {sql}",
        )


COMPARISONS = ("=", "<", "<=", ">", "<>")


@st.composite
def correlated_queries(draw) -> str:
    """A subquery correlated with the outer row by an equality or not, in SELECT, WHERE or
    HAVING: scalar (count, an aggregate), EXISTS / NOT EXISTS, IN / NOT IN. DataFusion turns
    those correlated by equalities into joins; the others' super-plan is DuckDB's."""
    op = draw(st.sampled_from(COMPARISONS))
    column = draw(st.sampled_from(("g", "i", "f")))
    inner = f"x.{column} {op} t.{column}"
    # bare columns inside the subquery are its own (x's)
    extra = draw(st.one_of(st.just(""), predicates().map(lambda p: f" AND {p}")))
    outer_where = draw(st.one_of(st.just(""), predicates().map(lambda p: f" WHERE {p}")))
    shape = draw(st.sampled_from(("count", "aggregate", "exists", "in", "having")))
    if shape == "count":
        return f"SELECT g, i, (SELECT count(*) FROM t AS x WHERE {inner}) AS c FROM t{outer_where}"
    if shape == "aggregate":
        measure = draw(st.sampled_from(("max(x.i)", "min(x.f)", "sum(x.i)", "count(x.s)")))
        return f"SELECT h, f, (SELECT {measure} FROM t AS x WHERE {inner}) AS c FROM t"
    if shape == "exists":
        negated = draw(st.sampled_from(("", "NOT ")))
        return (
            f"SELECT g, i, s FROM t WHERE {negated}EXISTS "
            f"(SELECT 1 FROM t AS x WHERE {inner}{extra})"
        )
    if shape == "in":
        negated = draw(st.sampled_from(("", "NOT ")))
        return (
            f"SELECT g, i FROM t WHERE i {negated}IN "
            f"(SELECT x.i FROM t AS x WHERE x.g {op} t.g){outer_where.replace('WHERE', 'AND')}"
        )
    return (
        f"SELECT g, count(*) AS n FROM t GROUP BY g HAVING count(*) >= "
        f"(SELECT count(*) FROM t AS x WHERE x.g {op} t.g)"
    )


@pytest.mark.slow
@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=tables(),
    sql=correlated_queries(),
    partitions=st.integers(1, 4),
    chunks_per_partition=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_correlated_subqueries_answer_independent_of_pushdown(
    table: pa.Table, sql: str, partitions: int, chunks_per_partition: int, seed: int
) -> None:
    _same_answer_every_cut(table, sql, partitions, chunks_per_partition, seed)
