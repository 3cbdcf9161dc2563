"""split_predicate_by_capability: supported conjuncts go to devices in cost order, the host
re-checks the full predicate."""

from __future__ import annotations

from quarry.plan import Capabilities, decompose, expressions, run_stage, tree
from quarry.plan.decompose import push_rows
from quarry.plan.rules.split_predicate_by_capability import split_predicate_by_capability
from quarry.protocol.stage import Stage

from .harness import assert_same_rows, cut_after, execute

SCALEFLUX = {"test/t": Capabilities.scan_filter()}
LIKE_AND_ARITHMETIC = (
    "SELECT count(*) AS n, sum(x) AS sx FROM t WHERE s LIKE 'b%' "
    "AND i * 2 > 10 AND k = 3 AND x > 1.5"
)


def test_scan_filter_devices_get_only_simple_conjuncts(small) -> None:
    decomposition = decompose(LIKE_AND_ARITHMETIC, small.schemas, capabilities=SCALEFLUX)
    (fragment,) = decomposition.fragments
    assert fragment.device_filter == ["(k = 3)", "(x > 1.5)"]
    assert len(fragment.host_filter) == 2
    assert any("LIKE" in text for text in fragment.host_filter)
    assert fragment.device_stages == ("raw", "filter")
    assert "partial_aggregate" not in fragment.pushed  # the scan engine cannot aggregate
    text = decomposition.explain()
    assert "device filter: (k = 3) AND (x > 1.5)" in text
    assert "host re-check:" in text and "LIKE" in text


def test_scan_filter_answer_matches_duckdb(small) -> None:
    decomposition = decompose(LIKE_AND_ARITHMETIC, small.schemas, capabilities=SCALEFLUX)
    for choice in ("full", "random"):
        actual = execute(decomposition, small.data, choice, seed=7)
        assert_same_rows(actual, small.expected(LIKE_AND_ARITHMETIC), ordered=False, context=choice)


def test_full_devices_get_every_conjunct(small) -> None:
    decomposition = decompose(LIKE_AND_ARITHMETIC, small.schemas)
    (fragment,) = decomposition.fragments
    assert len(fragment.device_filter) == 4 and fragment.host_filter == []
    assert fragment.device_stages == ("raw", "filter", "full")


def test_cheapest_most_selective_first(small) -> None:
    sql = "SELECT id FROM t WHERE s = 'apple' AND x > 0 AND k = 3"
    cut = cut_after(
        sql, small.schemas, push_rows, split_predicate_by_capability, capabilities=SCALEFLUX
    )
    decomposition = decompose(sql, small.schemas, capabilities=SCALEFLUX)
    assert decomposition.fragments[0].device_filter == ["(k = 3)", "(x > 0.0)", "(s = 'apple')"]
    assert len(cut.fragments[0].device_conjuncts) == 3


def test_selectivity_estimates_reorder(small) -> None:
    sql = "SELECT id FROM t WHERE s = 'apple' AND x > 0 AND k = 3"
    seen = []

    def estimate(conjunct: dict) -> float | None:
        seen.append(conjunct)
        return 0.001 if conjunct["columns"] == ["x"] else None

    decomposition = decompose(sql, small.schemas, selectivity=estimate)
    assert decomposition.fragments[0].device_filter[0] == "(x > 0.0)"
    assert {c["dataset"] for c in seen} == {"test/t"}
    assert any(
        c["predicate"] == {"column": "k", "op": "=", "value": 3, "type": "int"} for c in seen
    )


def test_the_full_stage_filters_in_the_same_order(small) -> None:
    """Devices run the full stage most: its filter of the rows as stored takes the ranked order
    too. Each conjunct is estimated once, and comes with a stage that counts what it keeps."""
    sql = "SELECT id, x FROM t WHERE s = 'apple' AND k = 3 AND x > 0"
    shares = {"x > 0": 0.01, "s = 'apple'": 0.5, "k = 3": 0.9}  # textbook: k, x, s
    asked = []

    def estimate(conjunct: dict) -> float | None:
        text = _bare(conjunct["sql"])
        asked.append(text)
        kept = run_stage(conjunct["stage"], small.table.schema, small.table.to_batches())
        counted = small.expected(f"SELECT id FROM t WHERE {text}")
        assert sum(b.num_rows for b in kept) == len(counted)
        return shares[text]

    decomposition = decompose(sql, small.schemas, selectivity=estimate)
    (fragment,) = decomposition.fragments
    assert sorted(asked) == sorted(shares)
    assert [_bare(c) for c in fragment.device_filter] == ["x > 0", "s = 'apple'", "k = 3"]
    plan = tree.parse_plan(fragment.stages[Stage.FULL])
    (row_filter,) = [rel for rel in tree.iter_rels(plan) if tree.kind(rel) == "filter"]
    read = next(rel for rel in tree.iter_rels(plan) if tree.kind(rel) == "read")
    names, fields = tree.function_names(plan), tree.read_field_names(read.read)
    full_order = [
        _bare(expressions.render(c, names, fields))
        for c in expressions.conjuncts(row_filter.filter.condition, names)
    ]
    assert full_order == ["x > 0", "s = 'apple'", "k = 3"]
    for choice in ("full", "random"):
        actual = execute(decomposition, small.data, choice, seed=3)
        assert_same_rows(actual, small.expected(sql), ordered=False, context=choice)


def _bare(text: str) -> str:
    return text.strip("()").replace(" 0.0", " 0")


def test_capability_rules(small) -> None:
    sql = (
        "SELECT id FROM t WHERE (k = 1 OR k = 2) AND x < i AND s IS NOT NULL "
        "AND NOT (s = 'apple') AND abs(x) > 1 AND id > k"
    )
    decomposition = decompose(sql, small.schemas, capabilities={"*": "scan_filter"})
    (fragment,) = decomposition.fragments
    # OR of comparisons and column-to-column comparisons are scan-engine material (NOT of
    # `=` is planned as `!=`); a cast of a column (x < i compares double with int) and
    # function calls are not.
    assert sorted(fragment.device_filter) == sorted(
        ["((k = 1) OR (k = 2))", "s IS NOT NULL", "(s != 'apple')", "(k < id)"]
    )
    assert sorted(fragment.host_filter) == ["(abs(x) > 1.0)", "(x < CAST(i AS fp64))"]
    assert_same_rows(
        execute(decomposition, small.data, "random", seed=8), small.expected(sql), ordered=False
    )


def test_intersection_of_profiles() -> None:
    full, scan = Capabilities.full(), Capabilities.scan_filter()
    both = full.intersect(scan)
    assert both.filter_functions == scan.filter_functions
    assert not (both.aggregate or both.limit or both.project_expressions)
    assert full.intersect(full) == full and full.is_full and not both.is_full
    assert Capabilities.named("scan_filter") == scan
