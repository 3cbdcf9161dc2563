"""A fragment whose repeated rows change nothing above (a DISTINCT, a semi join's filtering
side) ships each run of equal rows once, and the answer is DuckDB's."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from tests.plan.harness import assert_same_rows

TICKETS = 20_000  # ten lines each, one customer and day to a ticket


@pytest.fixture(scope="module")
def sales(cluster):
    rng = np.random.default_rng(5)
    customers = np.repeat(rng.integers(0, 3_000, TICKETS), 10)
    days = np.repeat(rng.integers(0, 365, TICKETS), 10)
    table = pa.table(
        {
            "customer": customers,
            "day": days,
            "item": rng.integers(0, 500, TICKETS * 10),
            "price": rng.random(TICKETS * 10),
        }
    )
    dates = pa.table({"day": np.arange(365), "month": np.arange(365) // 31})
    cluster.ingest(table, "test/repeat_sales")
    cluster.ingest(dates, "test/repeat_dates")
    yield {"repeat_sales": table, "repeat_dates": dates}
    cluster.drop("test/repeat_sales")
    cluster.drop("test/repeat_dates")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT s.customer, s.day FROM {sales} s JOIN {dates} d ON s.day = d.day "
        "WHERE d.month < 6",
        "SELECT d.month FROM {dates} d WHERE EXISTS "
        "(SELECT 1 FROM {sales} s WHERE s.day = d.day AND s.customer < 100)",
    ],
)
def test_a_fragment_ships_each_run_of_equal_rows_once(cluster, sales, sql: str) -> None:
    query = cluster.query(
        sql.format(sales="test.repeat_sales", dates="test.repeat_dates"), pushdown="always"
    )
    result = query.execute().read_all()
    connection = duckdb.connect()
    for name, table in sales.items():
        connection.register(name, table)
    expected = connection.execute(sql.format(sales="repeat_sales", dates="repeat_dates"))
    assert_same_rows(result, expected.fetch_arrow_table(), ordered=False)
    fragment = next(f.name for f in query.decomposition.fragments if "sales" in f.dataset)
    partitions = [p for p in query.explain(analyze=True).analyze.partitions if p.label == fragment]
    shipped = sum(p.counters.rows_shipped for p in partitions)
    read = sum(p.counters.rows_read for p in partitions)
    assert 0 < shipped <= read // 5, (shipped, read)  # a ticket's ten lines: one row
