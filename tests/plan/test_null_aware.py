"""NOT IN over a subquery answers as DataFusion alone answers it, NULLs and empty subqueries
included, under every device stage; the anti joins NOT EXISTS plans stay as they are."""

from __future__ import annotations

import datafusion
import pyarrow as pa
import pytest

from quarry.plan import decompose
from quarry.plan.rules.null_aware import null_aware_flags
from tests.plan.harness import execute

TABLES = {
    "t/a": pa.table({"x": pa.array([1, 2, 3, None, 5], pa.int64()), "k": [1, 1, 2, 2, 3]}),
    "t/b": pa.table({"y": pa.array([2, None, 7], pa.int64()), "k": [1, 2, 3]}),
    "t/c": pa.table({"y": pa.array([2, 7, 9], pa.int64()), "k": [1, 2, 3]}),
}
SCHEMAS = {name: table.schema for name, table in TABLES.items()}


def datafusion_alone(sql: str) -> pa.Table:
    ctx = datafusion.SessionContext()
    for name, table in TABLES.items():
        ctx.register_record_batches(name.split("/")[1], [table.to_batches()])
    return ctx.sql(sql).to_arrow_table()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM a WHERE x NOT IN (SELECT y FROM b)",  # a NULL in b: no row
        "SELECT * FROM a WHERE x NOT IN (SELECT y FROM c)",  # none in c: a's NULL x goes
        "SELECT * FROM a WHERE x NOT IN (SELECT y FROM c WHERE y > 100)",  # empty: every row
        "SELECT * FROM a WHERE x + 1 NOT IN (SELECT y * 2 FROM c WHERE k > 1)",
        "SELECT k, count(*) FROM a WHERE x NOT IN (SELECT y FROM c) "
        "AND k NOT IN (SELECT k FROM b WHERE y IS NOT NULL) GROUP BY k",
        "SELECT * FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.y = a.x)",
    ],
)
def test_not_in_answers_as_datafusion_alone(sql):
    expected = datafusion_alone(sql)
    for choice in ("full", "random"):
        answer = execute(decompose(sql, SCHEMAS), TABLES, stage_choice=choice)
        assert answer.schema.types == expected.schema.types
        assert sorted(map(repr, answer.to_pylist())) == sorted(map(repr, expected.to_pylist()))


def test_a_correlated_not_in_answers_through_duckdb():
    """DataFusion cannot keep a correlated NOT IN's NULL semantics: its super-plan is DuckDB's
    (``duckdb_super``), which answers as SQL says (a NULL in the correlated rows keeps none)."""
    sql = "SELECT * FROM a WHERE x NOT IN (SELECT y FROM b WHERE b.k = a.k)"
    decomposition = decompose(sql, SCHEMAS)
    assert decomposition.host_sql == sql
    answer = execute(decomposition, TABLES, stage_choice="random")
    assert sorted(map(repr, answer.to_pylist())) == ["{'x': 1, 'k': 1}", "{'x': 5, 'k': 3}"]


def test_only_not_in_is_null_aware():
    ctx = datafusion.SessionContext()
    for name, table in TABLES.items():
        ctx.register_record_batches(name.split("/")[1], [table.to_batches()])
    plan = ctx.sql(
        "SELECT * FROM a WHERE x NOT IN (SELECT y FROM b) "
        "AND NOT EXISTS (SELECT 1 FROM c WHERE c.y = a.x)"
    ).optimized_logical_plan()
    assert sorted(null_aware_flags(plan)) == [False, True]
