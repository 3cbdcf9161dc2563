"""push_filter: filter conjuncts move into the fragment; unsafe ones stay on the host."""

from __future__ import annotations

from quarry.plan import decompose, tree
from quarry.plan.cut import Cut
from quarry.plan.optimizer import optimize
from quarry.plan.rules.push_filter import push_filter
from quarry.plan.trace import cut_snapshot

from .harness import assert_same_rows, cut_after, execute, kinds_down


def _super_kinds(cut) -> list[str]:
    return [tree.kind(rel) for rel in tree.iter_rels(cut.plan)]


def test_filter_moves_into_the_fragment(small) -> None:
    cut = cut_after("SELECT id FROM t WHERE i > 3 AND s = 'apple'", small.schemas, push_filter)
    (fragment,) = cut.fragments
    assert kinds_down(fragment.rel) == ["filter", "read"]
    assert "filter" not in _super_kinds(cut)
    assert len(fragment.raw_conjuncts) == 2  # directly on the scan: the filter stage can run it
    assert fragment.pushed[-1] == "filter"


def test_the_rule_changes_the_optimizers_copy_not_its_input(small) -> None:
    before = cut_after("SELECT id FROM t WHERE i > 3", small.schemas)
    plan_bytes = before.plan.SerializeToString()
    after, fired = optimize(before, (push_filter,), cut_snapshot, copy=Cut.copy)
    assert before.plan.SerializeToString() == plan_bytes
    assert kinds_down(before.fragments[0].rel) == ["read"]
    assert kinds_down(after.fragments[0].rel) == ["filter", "read"]
    assert [step.rule for step in fired] == ["push_filter"]


def test_subquery_conjunct_stays_on_the_host(small) -> None:
    sql = "SELECT id FROM t WHERE i > 3 AND x > (SELECT avg(x) FROM t)"
    cut = cut_after(sql, small.schemas, push_filter)
    outer = cut.fragments[0]
    assert kinds_down(outer.rel) == ["filter", "read"]
    assert len(outer.raw_conjuncts) == 1
    assert "filter" in _super_kinds(cut)  # x > (subquery) reads another fragment
    decomposition = decompose(sql, small.schemas)
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=1), small.expected(sql), ordered=False
    )


def test_nondeterministic_conjunct_stays_on_the_host(small) -> None:
    # The filter stage and the full stage may both evaluate a conjunct: random() would differ.
    cut = cut_after("SELECT id FROM t WHERE random() < 2.0 AND i > 3", small.schemas, push_filter)
    (fragment,) = cut.fragments
    names = cut.function_names()
    assert len(fragment.raw_conjuncts) == 1
    assert "random" in {names[a] for a in tree.used_function_anchors(cut.plan)}
    assert "random" not in {names[a] for a in tree.used_function_anchors(fragment.rel)}


def test_filter_answers_match_duckdb(small) -> None:
    sql = (
        "SELECT id, s, d FROM t WHERE (i BETWEEN -10 AND 10 OR s LIKE 'b%') "
        "AND d >= DATE '2020-03-01' AND x IS NOT NULL"
    )
    for pushdown in ("never", "always"):
        decomposition = decompose(sql, small.schemas, pushdown=pushdown)
        for choice in ("full", "random"):
            actual = execute(decomposition, small.data, choice, seed=5)
            assert_same_rows(
                actual, small.expected(sql), ordered=False, context=f"{pushdown}/{choice}"
            )
