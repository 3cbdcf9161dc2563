"""The optimizer: named rules in ordered lists, one copy of the cut, bounded fixpoints, and the
trace EXPLAIN VERBOSE shows (the rules that fired, in order, each with the cut it left)."""

from __future__ import annotations

import pytest

from quarry.plan import DECOMPOSITION_RULES, PLAN_RULES, RULES, decompose, tree
from quarry.plan.cut import Cut
from quarry.plan.decompose import plan_cut, push_rows
from quarry.plan.optimizer import optimize
from quarry.plan.rules import Fixpoint, Rule, RuleDidNotSettle, rewrite_sites
from quarry.plan.rules.decimal_scale import decimal_scale
from quarry.plan.rules.read_once import read_once
from quarry.plan.rules.split_alike_by_join_keys import split_alike_by_join_keys
from quarry.plan.trace import cut_snapshot

from .harness import assert_same_rows, execute

FILTER_AGGREGATE = "SELECT k, sum(x) AS total FROM t WHERE i > 3 GROUP BY k"
TWO_ALIKE_READS = "SELECT count(*) AS n FROM t a JOIN t b ON a.id = b.id"


def fired(decomposition) -> list[str]:
    return [step.rule for step in decomposition.fired]


def test_every_rule_is_named_after_its_module() -> None:
    for rule in (*PLAN_RULES, *RULES, *DECOMPOSITION_RULES):
        steps = rule.rules if isinstance(rule, Fixpoint) else (rule,)
        for step in steps:
            assert step.apply.__module__ == f"quarry.plan.rules.{step.name}", step


def test_the_cut_is_copied_once_per_decomposition_not_per_rule(small, monkeypatch) -> None:
    copies = []
    real = Cut.copy
    monkeypatch.setattr(Cut, "copy", lambda cut: copies.append(1) or real(cut))
    decomposition = decompose(FILTER_AGGREGATE, small.schemas)
    assert len(decomposition.fired) >= 4  # several rules changed it, each in place
    assert len(copies) == 1
    decompose(FILTER_AGGREGATE, small.schemas, pushdown="never")
    assert len(copies) == 1  # no rule, no copy


def test_the_optimizer_leaves_the_cut_it_was_given(small) -> None:
    cut, _, _ = plan_cut(FILTER_AGGREGATE, small.schemas)
    before = cut.plan.SerializeToString()
    after, steps = optimize(cut, RULES, cut_snapshot, copy=Cut.copy)
    assert cut.plan.SerializeToString() == before
    assert [f.pushed for f in cut.fragments] == [["projection"]]
    assert after.fragments[0].pushed == ["projection", "filter", "partial_aggregate"]
    assert steps


def test_a_rule_that_never_settles_fails_naming_it(small) -> None:
    cut, _, _ = plan_cut("SELECT x + 1 AS y FROM t", small.schemas)
    restless = Rule("restless", lambda cut: (cut, True))
    with pytest.raises(RuleDidNotSettle, match=r"rules restless \(churn\) .* after 3 rounds"):
        optimize(cut, (Fixpoint("churn", (restless,), 3),), cut_snapshot, copy=Cut.copy)
    # a site rule that claims a change it never makes: bounded by the relations it could move
    spinning = Rule("spinning", lambda cut: (cut, rewrite_sites(cut, "project", _claims)))
    with pytest.raises(RuleDidNotSettle, match="rule spinning did not settle: project"):
        optimize(cut, (spinning,), cut_snapshot, copy=Cut.copy)


def _claims(cut, rel, fragment) -> bool:
    return True


def test_decimal_scale_reports_a_change_only_when_it_makes_one(small, tpch) -> None:
    cut, _, steps = plan_cut(tpch.queries[1], tpch.schemas, plan_rules=())
    assert steps == ()
    plan = tree.copy_plan(cut.plan)
    assert decimal_scale.apply(plan)[1]  # Q1's ``1 - l_discount`` and ``1 + l_tax``
    assert not decimal_scale.apply(plan)[1]  # aligned already
    cut, _, _ = plan_cut("SELECT p * 2 AS v FROM t", small.schemas, plan_rules=())
    assert not decimal_scale.apply(cut.plan)[1]  # a product's literal keeps its scale
    assert fired(decompose(tpch.queries[1], tpch.schemas))[0] == "decimal_scale"
    assert "decimal_scale" not in fired(decompose(tpch.queries[6], tpch.schemas))


def test_read_once_reports_a_change_only_when_it_makes_one(small) -> None:
    apart = decompose(TWO_ALIKE_READS, small.schemas, decomposition_rules=())
    assert len(apart.fragments) == 2 and len(apart.alike) == 1
    once, changed = read_once.apply(apart)
    assert changed and len(once.fragments) == 1 and once.alike == ()
    assert len(apart.fragments) == 2  # a new decomposition: the plan cache shares the one given
    assert read_once.apply(once) == (once, False)
    assert_same_rows(execute(once, small.data), small.expected(TWO_ALIKE_READS), ordered=False)


def test_reads_a_join_cuts_apart_stay_apart_and_the_others_are_read_once(small) -> None:
    apart = decompose(TWO_ALIKE_READS, small.schemas, decomposition_rules=())
    (group,) = apart.alike

    def cut_by(names_when_shared, names_when_apart):
        return lambda d: names_when_shared if len(d.fragments) == 1 else names_when_apart

    kept_apart = split_alike_by_join_keys(cut_by(set(), {group[1]}))
    split, changed = kept_apart.apply(apart)
    assert changed and split.alike == () and len(split.fragments) == 2
    assert read_once.apply(split) == (split, False)
    # cut when shared too, or cut apart by no key: shared as before
    for shared_cut, apart_cut in (({group[0]}, {group[1]}), (set(), set())):
        rule = split_alike_by_join_keys(cut_by(shared_cut, apart_cut))
        assert rule.apply(apart) == (apart, False)


def test_the_trace_lists_the_rules_that_fired_in_order(small, tpch) -> None:
    assert fired(decompose(FILTER_AGGREGATE, small.schemas)) == [
        "push_filter",
        "push_projection",
        "split_predicate_by_capability",
        "split_aggregate",
        "prune_slices",
    ]
    assert fired(decompose(TWO_ALIKE_READS, small.schemas)) == ["read_once"]
    assert fired(decompose(FILTER_AGGREGATE, small.schemas, pushdown="never")) == []
    q1 = fired(decompose(tpch.queries[1], tpch.schemas))
    assert q1 == [
        "decimal_scale",
        "push_filter",
        "push_projection",
        "split_predicate_by_capability",
        "split_aggregate",
        "prune_slices",
    ]
    q21 = fired(decompose(tpch.queries[21], tpch.schemas))
    assert q21[-1] == "read_once" and "push_filter" in q21  # l1 and l3 alike: read once
    top_k = fired(decompose("SELECT id FROM t WHERE s = 'apple' ORDER BY x LIMIT 5", small.schemas))
    assert top_k[-2:] == ["push_limit", "prune_slices"]


def test_each_step_shows_the_cut_it_left(small) -> None:
    decomposition = decompose(FILTER_AGGREGATE, small.schemas)
    steps = {step.rule: step for step in decomposition.fired}
    assert all("plan" not in step.__dict__ for step in steps.values())  # not rendered yet
    filtered = steps["push_filter"].plan
    assert filtered.startswith("super-plan:") and "__quarry_fragment_0 <- test/t" in filtered
    fragment_part = filtered.split("__quarry_fragment_0 <- test/t", 1)[1]
    assert "filter (i > 3)" in fragment_part and "aggregate" not in fragment_part
    split = steps["split_aggregate"].plan.split("__quarry_fragment_0 <- test/t", 1)[1]
    assert "partial_aggregate" in split and "aggregate by" in split
    assert "zone-map predicates: i > 3" in steps["prune_slices"].plan
    assert steps["prune_slices"].to_json() == {
        "rule": "prune_slices",
        "plan": steps["prune_slices"].plan,
    }
    once = decompose(TWO_ALIKE_READS, small.schemas).fired[-1].plan
    assert once.count("<- test/t") == 1 and once.count("read __quarry_fragment_0") == 2


def test_the_lists_are_arguments(small) -> None:
    only_rows = decompose(FILTER_AGGREGATE, small.schemas, rules=(push_rows,))
    assert fired(only_rows) == ["push_filter", "push_projection"]
    (fragment,) = only_rows.fragments
    assert fragment.pushed == ["projection", "filter"] and fragment.predicates == []
    assert_same_rows(
        execute(only_rows, small.data), small.expected(FILTER_AGGREGATE), ordered=False
    )
