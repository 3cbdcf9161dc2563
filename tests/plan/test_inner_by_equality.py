"""inner_by_equality: an outer join whose null-supplying side an inner join above compares with
``=`` runs as an inner join, and the answer is DuckDB's whatever the devices do."""

from __future__ import annotations

import pyarrow as pa
import pytest
from substrait import algebra_pb2

from quarry.plan import decompose, tree

from .harness import assert_same_rows, duckdb_schema_answer, execute

J = algebra_pb2.JoinRel
ROWS = 400


@pytest.fixture(scope="module")
def tables() -> dict[str, pa.Table]:
    sales = pa.table(
        {
            "item": [i % 40 for i in range(ROWS)],
            "ticket": [i // 3 for i in range(ROWS)],
            "qty": [i % 7 + 1 for i in range(ROWS)],
        }
    )
    returned = range(0, ROWS, 5)
    returns = pa.table(
        {
            "item": [i % 40 for i in returned],
            "ticket": [i // 3 for i in returned],
            "reason": [None if i % 4 == 0 else i % 6 for i in returned],
            "back": [i % 3 for i in returned],
        }
    )
    reason = pa.table({"r_sk": [0, 1, 2, 3, 4, 5], "r_desc": ["a", "b", "a", "c", "a", "b"]})
    return {"d/sales": sales, "d/returns": returns, "d/reason": reason}


def _decomposed(tables, sql: str):
    return decompose(sql, {name: table.schema for name, table in tables.items()})


def _join_types(decomposition) -> list[int]:
    plan = tree.parse_plan(decomposition.super_plan)
    return sorted(rel.join.type for rel in tree.iter_rels(plan) if tree.kind(rel) == "join")


Q93 = (  # TPC-DS Q93's shape
    "SELECT s.item, sum(CASE WHEN r.back IS NOT NULL THEN s.qty - r.back ELSE s.qty END) AS q "
    "FROM d.sales s LEFT JOIN d.returns r ON r.item = s.item AND r.ticket = s.ticket, d.reason "
    "WHERE r.reason = r_sk AND r_desc = 'a' GROUP BY s.item"
)


@pytest.mark.parametrize(
    "sql, turned",
    [
        (Q93, True),
        # the preserved side compared: the join stays outer
        (
            "SELECT s.item, r.back FROM d.sales s LEFT JOIN d.returns r ON r.item = s.item "
            "AND r.ticket = s.ticket JOIN d.reason ON s.qty = r_sk",
            False,
        ),
        # a NULL made something else on the way up: ``=`` may hold for it
        (
            "SELECT t.item, r_desc FROM (SELECT s.item, coalesce(r.reason, 0) AS why "
            "FROM d.sales s LEFT JOIN d.returns r ON r.item = s.item AND r.ticket = s.ticket) t "
            "JOIN d.reason ON t.why = r_sk",
            False,
        ),
        # a limit between takes its rows before the join above drops any
        (
            "SELECT t.item, r_desc FROM (SELECT s.item, r.reason FROM d.sales s LEFT JOIN "
            "d.returns r ON r.item = s.item AND r.ticket = s.ticket ORDER BY s.ticket LIMIT 50) t "
            "JOIN d.reason ON t.reason = r_sk",
            False,
        ),
    ],
)
def test_an_outer_join_an_equality_above_rejects_the_nulls_of_is_inner(
    tables, sql: str, turned: bool
) -> None:
    decomposition = _decomposed(tables, sql)
    assert ("inner_by_equality" in {f.rule for f in decomposition.fired}) is turned
    assert (J.JOIN_TYPE_LEFT in _join_types(decomposition)) is not turned
    for choice, seed in (("full", 0), ("random", 5)):
        answer = execute(decomposition, tables, choice, seed=seed)
        assert_same_rows(answer, duckdb_schema_answer(tables, sql), ordered=False)
