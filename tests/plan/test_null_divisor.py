"""null_divisor: an integer divided or taken modulo by zero is NULL, as SQLite and DuckDB's
integer division answer, where DataFusion alone fails the query."""

from __future__ import annotations

import duckdb
import pytest

from quarry.plan import decompose

from .harness import assert_same_rows, execute


def expected(small, sql: str):
    """DuckDB's answer with SQLite's integer division (``/`` of integers is ``//``)."""
    connection = duckdb.connect()
    connection.execute("SET integer_division = true")
    connection.register("t", small.table)
    return connection.execute(sql).fetch_arrow_table()


@pytest.mark.parametrize(
    "sql",
    [
        # SQLite's corpus: a divisor that is an aggregate over no rows
        "SELECT 52 / - COUNT(*) AS v FROM t WHERE k > 100",
        "SELECT id, 1000 / (k - 3) AS v, 1000 % (k - 3) AS m FROM t WHERE id < 200",
        "SELECT k, SUM(i) / (COUNT(*) - COUNT(*)) AS v FROM t GROUP BY k",
        "SELECT id, i / 7 AS v FROM t WHERE id < 50",  # a literal divisor: left alone
    ],
)
def test_a_zero_divisor_gives_null_in_every_cut(small, sql: str) -> None:
    decomposition = decompose(sql, small.schemas)
    for choice, seed in (("full", 0), ("random", 3)):
        answer = execute(decomposition, small.data, choice, seed=seed)
        assert_same_rows(answer, expected(small, sql), ordered=False)


def test_only_divisors_that_may_be_zero_are_wrapped(small) -> None:
    wrapped = decompose("SELECT i / k AS v FROM t", small.schemas)
    literal = decompose("SELECT i / 4 AS v FROM t", small.schemas)
    floats = decompose("SELECT x / k AS v FROM t", small.schemas)
    fired = [{f.rule for f in d.fired} for d in (wrapped, literal, floats)]
    assert ["null_divisor" in rules for rules in fired] == [True, False, False]
