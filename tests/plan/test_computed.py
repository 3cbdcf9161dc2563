"""computed: a part of the super-plan the host already ran is read, not run again."""

from __future__ import annotations

import pyarrow as pa

from quarry.coordinator.query.join_keys import run_through
from quarry.plan import decompose, tree
from quarry.plan.computed import COMPUTED_PREFIX, substituted
from quarry.plan.join_filters import join_filters

from .harness import assert_same_rows, execute

ROWS = {"tpch/orders": 1_500_000, "tpch/lineitem": 6_000_000, "tpch/customer": 150_000}


def _q18(tpch):
    decomposition = decompose(tpch.queries[18], tpch.schemas, "always")
    (pair, *_) = [p for p in join_filters(decomposition, ROWS) if p.through]
    return decomposition, pair


def _reads(super_plan: bytes, name: str) -> int:
    plan = tree.parse_plan(super_plan)
    return sum(1 for rel in tree.iter_rels(plan) if tree.named_table(rel) == (name,))


def test_q18s_having_is_read_from_what_its_keys_were_taken_from(tpch) -> None:
    """The HAVING over every order's partial sums runs once, for the keys; the super-plan reads
    its output in place of its part (no second read of the build fragment), and the answer is
    DuckDB's whether devices ran the full stage or handed rows back."""
    decomposition, pair = _q18(tpch)
    seen = []

    def computed(outputs):
        table = run_through(pair, outputs[pair.build], cores=2)
        changed, tables = substituted(decomposition, {pair.through: table})
        seen.append((changed, tables))
        return {pair.through: table}

    for choice in ("full", "random"):
        answer = execute(decomposition, tpch.data, choice, seed=5, computed=computed)
        assert_same_rows(answer, tpch.expected(18), ordered=True, context=choice)
    changed, tables = seen[-1]
    assert list(tables) == [f"{COMPUTED_PREFIX}0"]
    assert (
        _reads(changed.super_plan, pair.build) == _reads(decomposition.super_plan, pair.build) - 1
    )
    assert _reads(changed.super_plan, f"{COMPUTED_PREFIX}0") == 1
    assert changed.output_schema == decomposition.output_schema


def test_a_table_of_other_types_or_a_part_not_held_changes_nothing(tpch) -> None:
    """Keys of another type would join otherwise; a part the super-plan does not hold is
    nothing to read. Either way the super-plan stays as it was, untouched."""
    decomposition, pair = _q18(tpch)
    before = decomposition.super_plan
    as_text = pa.table({"l_orderkey": pa.array(["1", "2"])})
    assert substituted(decomposition, {pair.through: as_text}) == (decomposition, {})
    q17 = decompose(tpch.queries[17], tpch.schemas, "always")
    keys = pa.table({"l_orderkey": pa.array([1, 2], pa.int64())})
    assert substituted(q17, {pair.through: keys}) == (q17, {})
    assert decomposition.super_plan == before
