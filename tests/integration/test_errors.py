"""Errors a user can act on, always: SQL of SQLite's sqllogictest corpus shape (tables of int
columns with NULLs, duplicate output names, types the decomposition could change) either answers
as DataFusion alone answers it, values and types, or raises a ``QuarryError`` that says what is
not supported and what to do; never an ``AssertionError`` or a bare ``Exception``. Each query
runs under every pushdown (``server`` on this flat cluster is the host completing raw slices)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import datafusion
import duckdb
import pyarrow as pa
import pytest

import quarry
from quarry.coordinator.query import planning
from quarry.errors import InternalError, QuarryError, QueryError
from quarry.plan.errors import NotSupported
from tests.commands import run_quarry

MODES = ("never", "always", "auto", "server")
TABLES = {  # the corpus's tab0..tab2, with NULLs in tab2
    "tab0": {"col0": [97, 15, 87], "col1": [1, 81, 21], "col2": [99, 47, 10]},
    "tab1": {"col0": [51, 85, 91], "col1": [14, 5, 47], "col2": [96, 59, 68]},
    "tab2": {"col0": [64, 75, 46, None], "col1": [77, 67, None, 5], "col2": [40, 58, 23, 1]},
}

ANSWERED = [
    # types DataFusion's analyzer changes after the frame's own schema was read
    "SELECT CASE WHEN col0 > 50 THEN col0 ELSE 1.5 END FROM tab2",
    "SELECT col0 FROM tab0 UNION SELECT col0 * 1.5 FROM tab1",
    "SELECT SUM(CASE WHEN col0 > 50 THEN col0 ELSE 0.5 END) FROM tab2",
    "SELECT COALESCE(col0, 1.5) FROM tab2",
    # arithmetic that changes types, on rows and on aggregates
    "SELECT col0 / 2, - col0, col0 * 1.0 FROM tab0",
    "SELECT - MIN(col0) * 86 FROM tab0",
    "SELECT ALL - 3 * + COUNT(*) FROM tab1",
    "SELECT AVG(col0), - AVG(col1), SUM(col0) / COUNT(*) FROM tab2",
    "SELECT COUNT(*) * 1.0, CAST(NULL AS INTEGER) FROM tab1",
    "SELECT NULLIF(col0, col1), COALESCE(col0, NULL) FROM tab2",
    # two output columns of one name
    "SELECT * FROM tab0, tab1 cor0 WHERE NOT NULL <= ( NULL )",
    "SELECT tab0.col0, tab1.col0 FROM tab0 JOIN tab1 ON tab0.col1 < tab1.col1",
    "SELECT * FROM tab2, tab1 cor0, tab0 AS cor1, tab1, tab2 AS cor2",
    "SELECT * FROM tab0 a, tab0 b, tab0 c, tab0 d",
    "SELECT col0 FROM tab0 INTERSECT SELECT col0 FROM tab0",
    # NOT IN keeps its NULL semantics; NOT EXISTS keeps its own
    "SELECT * FROM tab0 WHERE col0 NOT IN (SELECT col1 FROM tab2)",
    "SELECT * FROM tab2 WHERE col0 NOT IN (SELECT col1 FROM tab0 WHERE col1 > 1000)",
    "SELECT col2, COUNT(*) FROM tab2 WHERE col1 NOT IN (SELECT col0 FROM tab1) GROUP BY col2",
    "SELECT * FROM tab0 WHERE NOT EXISTS (SELECT 1 FROM tab2 WHERE tab2.col1 = tab0.col0)",
]
# DataFusion alone refuses these too: quarry says so, with a hint. (An integer divided by zero
# is NULL in quarry, as in SQLite and DuckDB: plan/rules/null_divisor.py; a decimal one fails.)
REFUSED_BY_DATAFUSION = [
    "SELECT CAST(col0 AS DECIMAL(10, 2)) / CAST(0 AS DECIMAL(10, 2)) FROM tab0"
]
# DataFusion refuses these (output names that repeat) or cannot run them (a NOT IN correlated
# by more than an equality): DuckDB runs their super-plan, and they answer as DuckDB does
ANSWERED_AS_DUCKDB = [
    "SELECT col0 AS a, col1 AS a FROM tab0",
    "SELECT - col0 AS col0, col0 FROM tab0 AS cor0 GROUP BY col0",
    "SELECT *, * FROM tab0",
    "SELECT DISTINCT col0, col0 FROM tab1",
    "SELECT * FROM tab0 WHERE col0 + 1 NOT IN (SELECT col1 FROM tab2 WHERE tab2.col2 > tab0.col2)",
]
# DataFusion answers these alone, but not through Substrait: quarry refuses them, saying how
NOT_SUPPORTED = [
    "SELECT NULL FROM tab0",
    "SELECT MAX(NULL), MIN(NULL) FROM tab0",
]


@pytest.fixture(scope="module")
def tables() -> dict[str, pa.Table]:
    return {
        name: pa.table(columns, pa.schema([(c, pa.int64()) for c in columns]))
        for name, columns in TABLES.items()
    }


@pytest.fixture(scope="module")
def cluster(tables):
    with quarry.local(devices=3) as cluster:
        for name, table in tables.items():
            cluster.ingest(table, f"slt/{name}")
        yield cluster


def datafusion_alone(tables: dict[str, pa.Table], sql: str) -> pa.Table:
    ctx = datafusion.SessionContext()
    for name, table in tables.items():
        ctx.register_record_batches(name, [table.to_batches()])
    return ctx.sql(sql).to_arrow_table()


def rows(table: pa.Table) -> list[str]:
    """The rows in an order of their own (names aside: two columns may share one)."""
    return sorted(repr(row) for row in zip(*(column.to_pylist() for column in table.columns)))


@pytest.mark.parametrize("sql", ANSWERED)
def test_answers_as_datafusion_alone(cluster, tables, sql):
    expected = datafusion_alone(tables, sql)
    for mode in MODES:
        assert cluster.explain(sql, pushdown=mode)  # planned alone, too
        answer = cluster.sql(sql, pushdown=mode).read_all()
        assert answer.schema.names == expected.schema.names, mode
        assert answer.schema.types == expected.schema.types, mode
        assert rows(answer) == rows(expected), mode


@pytest.mark.parametrize("sql", ANSWERED_AS_DUCKDB)
def test_what_datafusion_cannot_run_answers_as_duckdb(cluster, tables, sql):
    connection = duckdb.connect()
    for name, table in tables.items():
        connection.register(name, table)
    expected = connection.execute(sql).fetch_arrow_table()
    for mode in MODES:
        assert "DuckDB runs the query" in cluster.explain(sql, pushdown=mode).plan
        answer = cluster.sql(sql, pushdown=mode).read_all()
        assert answer.schema.names == expected.schema.names, mode
        assert rows(answer) == rows(expected), mode


@pytest.mark.parametrize("sql", REFUSED_BY_DATAFUSION)
def test_what_datafusion_refuses_is_a_query_error(cluster, tables, sql):
    with pytest.raises(Exception):  # noqa: B017 - DataFusion's own, of whatever class
        datafusion_alone(tables, sql)
    for mode in MODES:
        with pytest.raises(QueryError) as raised:
            cluster.sql(sql, pushdown=mode).read_all()
        message = str(raised.value)
        assert message and "Traceback" not in message


@pytest.mark.parametrize("sql", NOT_SUPPORTED)
def test_what_substrait_cannot_carry_is_refused_with_a_hint(cluster, sql):
    for mode in MODES:
        with pytest.raises(NotSupported, match="not supported") as raised:
            cluster.sql(sql, pushdown=mode).read_all()
        assert "\nhint: " in str(raised.value)
        with pytest.raises(NotSupported):
            cluster.explain(sql, pushdown=mode)


def test_a_null_type_says_what_to_do(cluster):
    with pytest.raises(NotSupported, match=r"CAST\(NULL AS INTEGER\)"):
        cluster.explain("SELECT NULL FROM tab0")


def test_a_broken_invariant_while_planning_is_an_internal_error_naming_the_query(
    cluster, monkeypatch, caplog
):
    def broken(*args, **kwargs):
        raise AssertionError("decomposition changed the result types")

    monkeypatch.setattr(planning, "plan", broken)
    sql = "SELECT col0 FROM tab0 WHERE col1 > 5"
    with caplog.at_level(logging.ERROR, logger="quarry.errors"):
        for call in (lambda: cluster.sql(sql), lambda: cluster.explain(sql)):
            with pytest.raises(InternalError) as raised:
                call()
            message = str(raised.value)
            assert "AssertionError: decomposition changed the result types" in message
            assert f"query: {sql}" in message and "bug" in message
            assert isinstance(raised.value.__cause__, AssertionError)
    assert any(record.exc_info for record in caplog.records)  # the traceback, in the log


def test_a_broken_invariant_while_the_answer_streams_is_an_internal_error(cluster, monkeypatch):
    """Not the query's ExecutionError: the query did nothing wrong."""
    from quarry.coordinator.query import run

    def broken_run(decomposition, *args, **kwargs):
        def batches():
            raise AssertionError("a fragment's output is missing")
            yield

        return pa.RecordBatchReader.from_batches(decomposition.output_schema, batches())

    monkeypatch.setattr(run, "run_super", broken_run)
    with pytest.raises(
        InternalError, match="AssertionError: a fragment's output is missing"
    ) as raised:
        cluster.sql("SELECT col0 FROM tab1", pushdown="always").read_all()
    assert "query: SELECT col0 FROM tab1" in str(raised.value)
    assert isinstance(raised.value, QuarryError)


BROKEN_CLI = """
import sys
from quarry.coordinator.query import planning

def broken(*args, **kwargs):
    raise AssertionError("decomposition changed the result types")

planning.plan = broken
from quarry.cli import main

sys.argv = ["quarry", *sys.argv[1:]]
main()
"""


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_the_cli_prints_one_error_line_for_a_failing_query(cluster, tmp_path):
    """A query quarry refuses, and one that meets a bug: one ``error:`` line each, never a
    traceback; a bug exits 1, naming the query and the file its traceback went to."""
    options = ("sql", "--cluster", str(cluster.cluster_file))
    refused = run_quarry(*options, "SELECT NULL FROM tab0", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    (line,) = _error_lines(refused.stderr)
    assert "type NULL" in line and "hint: give the NULL a type" in refused.stderr

    sql = "SELECT col0 FROM tab0"
    broken = subprocess.run(
        [sys.executable, "-c", BROKEN_CLI, *options, sql],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    (line,) = _error_lines(broken.stderr)
    assert "AssertionError: decomposition changed the result types" in line
    assert f"query: {sql}" in broken.stderr
    trace = broken.stderr.strip().splitlines()[-1].removeprefix("traceback: ")
    assert "Traceback" in Path(trace).read_text()
