"""A super-plan DataFusion cannot run (a subquery correlated by more than equalities, output
names that repeat) is DuckDB's, over fragments cut as any scan: the same answer as DuckDB alone
whatever the devices did, and the scans still narrowed to the columns the query reads."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from quarry.plan import decompose
from quarry.plan.errors import PlanError

from .harness import assert_same_rows, execute

TABLE = pa.table(
    {
        "a": [1, 2, 3, None, 5, 6],
        "b": [5, 6, 7, 8, None, 1],
        "c": [9, 8, 7, 6, 5, 4],
        "wide": ["x" * 100] * 6,
    }
)
SCHEMAS = {"slt/t1": TABLE.schema}
QUERIES = [
    "SELECT a, (SELECT count(*) FROM t1 AS x WHERE x.b < t1.b) AS n FROM t1",
    "SELECT a FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t1 AS x WHERE x.c > t1.a AND x.b > 5)",
    "SELECT a, c FROM t1 WHERE a NOT IN (SELECT b FROM t1 AS z WHERE z.c > t1.c)",
    "SELECT c, count(*) FROM t1 GROUP BY c HAVING count(*) > (SELECT count(*) FROM t1 AS x "
    "WHERE x.c > t1.c) - 5",
    "SELECT a, a, b AS a FROM t1",
]


def _duckdb(sql: str) -> pa.Table:
    connection = duckdb.connect()
    connection.register("t1", TABLE)
    return connection.execute(sql).fetch_arrow_table()


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("stage_choice", ["full", "random"])
def test_answers_as_duckdb_whatever_the_devices_did(sql, stage_choice):
    for pushdown in ("always", "never"):
        decomposition = decompose(sql, SCHEMAS, pushdown=pushdown)
        # DataFusion joins an EXISTS correlated by a comparison itself
        on_duckdb = "EXISTS" not in sql
        assert (decomposition.host_sql == sql) is on_duckdb
        assert ("DuckDB runs" in decomposition.explain()) is on_duckdb
        answer = execute(decomposition, {"slt/t1": TABLE}, stage_choice=stage_choice, seed=3)
        if "count" not in sql:  # DataFusion's names where it planned the query: count(*)
            assert answer.schema.names == _duckdb(sql).schema.names
        assert_same_rows(answer, _duckdb(sql), ordered=False, context=f"{pushdown}: {sql}")


def test_the_scans_read_only_the_columns_the_query_does():
    (fragment,) = decompose(QUERIES[0], SCHEMAS).fragments
    assert fragment.raw_schema.names == ["a", "b"]
    (everything,) = decompose(QUERIES[-1], SCHEMAS).fragments  # DataFusion refused: all
    assert "wide" in everything.raw_schema.names


def test_what_duckdb_refuses_too_is_a_plan_error():
    with pytest.raises(PlanError, match="nowhere"):
        decompose("SELECT a, a FROM t1 WHERE nowhere > 1", SCHEMAS)
