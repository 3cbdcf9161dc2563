"""semi_join_down: a semi or anti join whose condition reads one side of an inner join below
moves onto that side, and the answer is DuckDB's whatever the devices do."""

from __future__ import annotations

import pyarrow as pa
import pytest
from substrait import algebra_pb2

from quarry.plan import decompose, tree

from .harness import assert_same_rows, duckdb_schema_answer, execute

J = algebra_pb2.JoinRel
ROWS = 600


@pytest.fixture(scope="module")
def tables() -> dict[str, pa.Table]:
    returns = pa.table(
        {
            "r_date": [None if i % 17 == 0 else i % 90 for i in range(ROWS)],
            "r_item": [i % 30 for i in range(ROWS)],
            "qty": [i % 7 + 1 for i in range(ROWS)],
        }
    )
    dates = pa.table(
        {
            "d_sk": list(range(90)),
            "d_date": [f"2000-{1 + i // 30:02d}-{1 + i % 30:02d}" for i in range(90)],
            "d_week": [i // 7 for i in range(90)],
        }
    )
    items = pa.table({"i_sk": list(range(30)), "i_id": [f"id{i % 12}" for i in range(30)]})
    return {"d/returns": returns, "d/dates": dates, "d/items": items}


def _semi_depths(decomposition) -> list[tuple[int, int]]:
    """(join type, how many joins lie above it) of each semi and anti join."""
    plan = tree.parse_plan(decomposition.super_plan)
    found = []

    def walk(rel, joins_above: int) -> None:
        if tree.kind(rel) == "join":
            if rel.join.type in (J.JOIN_TYPE_LEFT_SEMI, J.JOIN_TYPE_LEFT_ANTI):
                found.append((rel.join.type, joins_above))
            joins_above += 1
        for child in tree.children(tree.body(rel)):
            if isinstance(child, algebra_pb2.Rel):
                walk(child, joins_above)

    walk(tree.root_rel(plan), 0)
    return found


Q83 = (  # TPC-DS Q83's shape: dates of the weeks some dates fall in
    "SELECT i_id, sum(qty) AS q FROM d.returns, d.items, d.dates "
    "WHERE r_item = i_sk AND r_date = d_sk AND d_date IN (SELECT d_date FROM d.dates "
    "WHERE d_week IN (SELECT d_week FROM d.dates WHERE d_date IN ('2000-01-05', '2000-02-20'))) "
    "GROUP BY i_id"
)


@pytest.mark.parametrize(
    "sql, moved",
    [
        (Q83, True),
        # NOT IN: an anti join, null-aware, moves all the same
        (Q83.replace("d_date IN (SELECT", "d_date NOT IN (SELECT"), True),
        # items IN items of some ids (Q33's shape)
        (
            "SELECT d_week, sum(qty) AS q FROM d.returns, d.items, d.dates WHERE r_item = i_sk "
            "AND r_date = d_sk AND i_id IN (SELECT i_id FROM d.items WHERE i_sk < 4) "
            "GROUP BY d_week",
            True,
        ),
        # the condition reads both sides of the join below: it stays above it
        (
            "SELECT r_item, qty FROM d.returns, d.items WHERE r_item = i_sk AND "
            "EXISTS (SELECT 1 FROM d.dates WHERE d_sk = r_date AND d_week = i_sk)",
            False,
        ),
        # a limit between: the rows below are not the rows above
        (
            "SELECT t.r_item FROM (SELECT r_item, d_date FROM d.returns, d.dates "
            "WHERE r_date = d_sk ORDER BY r_item, d_date LIMIT 40) t "
            "WHERE t.d_date IN (SELECT d_date FROM d.dates WHERE d_week = 2)",
            False,
        ),
    ],
)
def test_a_semi_join_moves_onto_the_side_it_reads_and_answers_the_same(
    tables, sql: str, moved: bool
) -> None:
    decomposition = decompose(sql, {name: table.schema for name, table in tables.items()})
    assert ("semi_join_down" in {f.rule for f in decomposition.fired}) is moved
    if moved and "NOT IN" not in sql:  # no semi join is left above every inner join
        assert all(depth > 0 for _, depth in _semi_depths(decomposition))
    for choice, seed in (("full", 0), ("random", 5)):
        answer = execute(decomposition, tables, choice, seed=seed)
        assert_same_rows(answer, duckdb_schema_answer(tables, sql), ordered=False)
