"""split_aggregate: partial aggregates per slice range, merged on the host."""

from __future__ import annotations

import pyarrow as pa

from quarry.plan import decompose, tree
from quarry.plan.decompose import push_rows
from quarry.plan.rules.split_aggregate import split_aggregate

from .harness import assert_same_rows, cut_after, execute, kinds_down

ALL_SPLITTABLE = (
    "SELECT k, count(*) AS n, count(x) AS nx, sum(x) AS sx, min(s) AS mn, "
    "max(d) AS mx, avg(x) AS ax, avg(i) AS ai, avg(p) AS ap, var_samp(x) AS vs, "
    "var_pop(i) AS vp, stddev(p) AS sd, stddev_pop(x) AS sp, "
    "bool_and(i > 0) AS ba, bool_or(i > 90) AS bo FROM t GROUP BY k"
)


def test_aggregate_splits_into_partial_and_final(small) -> None:
    cut = cut_after(ALL_SPLITTABLE, small.schemas, push_rows, split_aggregate)
    (fragment,) = cut.fragments
    assert kinds_down(fragment.rel)[0] == "aggregate"
    assert fragment.pushed[-1] == "partial_aggregate"
    assert not fragment.open
    # The host merges: variance via the quarry merge function, decimal avg via its UDF.
    names = set(tree.function_names(cut.plan).values())
    assert {
        "quarry_merge_var_samp",
        "quarry_merge_var_pop",
        "quarry_merge_stddev_samp",
        "quarry_merge_stddev_pop",
        "quarry_avg_decimal_2_19_6",
    } <= names


def test_every_splittable_aggregate_matches_duckdb(small) -> None:
    expected = small.expected(ALL_SPLITTABLE)
    for pushdown in ("never", "always"):
        decomposition = decompose(ALL_SPLITTABLE, small.schemas, pushdown=pushdown)
        for choice in ("full", "random"):
            actual = execute(decomposition, small.data, choice, seed=11)
            assert_same_rows(
                actual, expected, ordered=False, float_absolute=1e-9, context=f"{pushdown}/{choice}"
            )


def test_decimal_results_are_identical_to_the_unsplit_plan(small) -> None:
    # avg of decimal(15,2) is decimal(19,6) truncated by DataFusion; the merge truncates alike.
    sql = "SELECT k, avg(p) AS a, sum(p) AS s, min(p) AS lo, count(p) AS n FROM t GROUP BY k"
    never = execute(decompose(sql, small.schemas, pushdown="never"), small.data)
    always = decompose(sql, small.schemas)
    assert always.output_schema.field("a").type == pa.decimal128(19, 6)
    assert always.output_schema.field("s").type == pa.decimal128(25, 2)
    for seed in range(3):
        actual = execute(always, small.data, "random", seed=seed)
        assert sorted(actual.to_pylist(), key=str) == sorted(never.to_pylist(), key=str)


def test_partial_measures_are_shared(small) -> None:
    decomposition = decompose(
        "SELECT sum(x) AS s, avg(x) AS a, count(x) AS c FROM t", small.schemas
    )
    (fragment,) = decomposition.fragments
    assert len(fragment.output_schema) == 2  # sum(x) and count(x), each computed once


def test_no_rows_at_all(small) -> None:
    # Zone maps prune every chunk: no partial rows reach the host; count is 0, sums are NULL.
    sql = "SELECT count(*) AS n, sum(x) AS s, avg(p) AS a, var_samp(x) AS v FROM t WHERE i > 1000"
    decomposition = decompose(sql, small.schemas)
    actual = execute(decomposition, small.data, prune=True)
    assert actual.to_pylist() == [{"n": 0, "s": None, "a": None, "v": None}]
    assert_same_rows(actual, small.expected(sql), ordered=False)


def test_grouping_sets_stay_on_the_host(small) -> None:
    sql = "SELECT k, sum(x) AS s FROM t GROUP BY ROLLUP(k)"
    decomposition = decompose(sql, small.schemas)
    assert "partial_aggregate" not in decomposition.fragments[0].pushed
    assert_same_rows(execute(decomposition, small.data), small.expected(sql), ordered=False)


def test_having_and_aggregate_over_expressions(small) -> None:
    sql = (
        "SELECT k % 3 AS g, sum(x * i) AS s, count(*) AS n FROM t WHERE s <> 'apple' "
        "GROUP BY k % 3 HAVING count(*) > 10"
    )
    decomposition = decompose(sql, small.schemas)
    assert decomposition.fragments[0].pushed[-1] == "partial_aggregate"
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=4), small.expected(sql), ordered=False
    )


def test_measure_filter_clause(small) -> None:
    sql = (
        "SELECT k, sum(x) FILTER (WHERE i > 0) AS s, avg(i) FILTER (WHERE x < 0) AS a "
        "FROM t GROUP BY k"
    )
    decomposition = decompose(sql, small.schemas)
    assert decomposition.fragments[0].pushed[-1] == "partial_aggregate"
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=6), small.expected(sql), ordered=False
    )
