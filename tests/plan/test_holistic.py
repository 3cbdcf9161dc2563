"""holistic: count distinct / median keep their aggregate on the host."""

from __future__ import annotations

from quarry.plan import decompose
from quarry.plan.decompose import push_rows
from quarry.plan.rules.holistic import holistic

from .harness import assert_same_rows, cut_after, execute, kinds_down


def test_median_pushes_only_what_is_below_it(small) -> None:
    sql = "SELECT k, median(x) AS m FROM t WHERE i > -50 GROUP BY k"
    cut = cut_after(sql, small.schemas, push_rows, holistic)
    (fragment,) = cut.fragments
    assert "aggregate" not in kinds_down(fragment.rel)
    assert "filter" in kinds_down(fragment.rel)
    assert not fragment.open
    assert any("median" in note for note in fragment.notes)
    decomposition = decompose(sql, small.schemas)
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=1), small.expected(sql), ordered=False
    )


def test_duplicate_insensitive_aggregates_push_a_distinct(small) -> None:
    # Two different distinct columns: DataFusion keeps count(DISTINCT) in one aggregate.
    sql = (
        "SELECT s, k, count(DISTINCT i) AS a, count(DISTINCT x) AS b, max(s) AS c, "
        "min(d) AS e FROM t WHERE x > 0 GROUP BY s, k"
    )
    cut = cut_after(sql, small.schemas, push_rows, holistic)
    (fragment,) = cut.fragments
    assert kinds_down(fragment.rel)[0] == "aggregate"
    assert len(fragment.rel.aggregate.measures) == 0  # a DISTINCT over keys and arguments
    assert fragment.pushed[-1] == "distinct"
    decomposition = decompose(sql, small.schemas)
    for choice in ("full", "random"):
        assert_same_rows(
            execute(decomposition, small.data, choice, seed=2),
            small.expected(sql),
            ordered=False,
            context=choice,
        )


def test_distinct_with_a_duplicate_sensitive_aggregate_stays(small) -> None:
    sql = "SELECT k, count(DISTINCT i) AS a, count(DISTINCT x) AS b, avg(x) AS c FROM t GROUP BY k"
    decomposition = decompose(sql, small.schemas)
    (fragment,) = decomposition.fragments
    assert "distinct" not in fragment.pushed and "partial_aggregate" not in fragment.pushed
    assert any("holistic" in note for note in fragment.notes)
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=3),
        small.expected(sql),
        ordered=False,
        float_absolute=1e-9,
    )


def test_single_count_distinct_is_split_after_datafusion_rewrites_it(small) -> None:
    # DataFusion turns count(DISTINCT i) GROUP BY k into GROUP BY k, i then count: distributive.
    sql = "SELECT k, count(DISTINCT i) AS a, sum(x) AS b FROM t GROUP BY k"
    decomposition = decompose(sql, small.schemas)
    assert decomposition.fragments[0].pushed[-1] == "partial_aggregate"
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=4), small.expected(sql), ordered=False
    )
