"""What an ADBC user sees through the real Flight SQL driver: answers equal to DuckDB's on the
same data, prepared statements with parameters, the catalog, pandas, and quarry's own errors."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from tests.plan.harness import assert_same_rows

QUERIES = [
    # (SQL, ordered)
    ("SELECT count(*) AS n, avg(ke) AS mean_ke FROM physics.particles WHERE ke > 3", False),
    (
        "SELECT CAST(floor(x / 25) AS BIGINT) AS b, count(*) AS n, max(ke) AS top "
        "FROM physics.particles GROUP BY 1 ORDER BY 1",
        True,
    ),
    ("SELECT id, x, ke FROM physics.particles WHERE ke > 8 ORDER BY ke DESC LIMIT 25", True),
    ("SELECT id, x * 2 + y AS s FROM physics.particles WHERE id < 500", False),
    (
        "SELECT r.name, count(*) AS n FROM physics.particles p JOIN lab.runs r "
        "ON p.id = r.run_id WHERE p.ke > 0.5 GROUP BY r.name ORDER BY r.name",
        True,
    ),
]


@pytest.mark.parametrize("sql, ordered", QUERIES)
def test_statements_answer_as_duckdb_does(endpoint, sql, ordered):
    with endpoint.connect() as connection, connection.cursor() as cursor:
        cursor.execute(sql)
        result = cursor.fetch_arrow_table()
    assert_same_rows(result, endpoint.duckdb(sql), ordered, float_absolute=1e-9, context=sql)


def test_fetchall_gives_rows_and_the_description_names_the_columns(endpoint):
    sql = "SELECT run_id, name, weight FROM lab.runs WHERE run_id < 8 ORDER BY run_id"
    with endpoint.connect() as connection, connection.cursor() as cursor:
        cursor.execute(sql)
        rows = cursor.fetchall()
        names = [column[0] for column in cursor.description]
    assert names == ["run_id", "name", "weight"]
    assert rows == [tuple(r.values()) for r in endpoint.duckdb(sql).to_pylist()]
    assert rows[1] == (1, "run-1", 0.5) and rows[0][2] is None


def test_a_large_answer_streams_in_batches(endpoint):
    sql = "SELECT id, ke FROM physics.particles"
    with endpoint.connect() as connection, connection.cursor() as cursor:
        cursor.execute(sql)
        reader = cursor.fetch_record_batch()
        batches = list(reader)
    assert len(batches) > 4, "the answer came whole, not as a stream of the devices' batches"
    result = pa.Table.from_batches(batches)
    assert_same_rows(result, endpoint.duckdb(sql), ordered=False)


@pytest.mark.slow
def test_ten_million_rows_stream_through_adbc(endpoint):
    """A 10M-row answer arrives as a stream of batches, every row once, as DuckDB has them."""
    import duckdb
    import numpy as np

    rows = 10_000_000
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"id": ids, "v": (ids % 977).astype(np.float64) * 0.5})
    endpoint.cluster.ingest(table, "lab/big", partitions=4)
    try:
        sql = "SELECT id, v FROM lab.big WHERE v >= 1"
        with endpoint.connect() as connection, connection.cursor() as cursor:
            cursor.execute(sql)
            batches = list(cursor.fetch_record_batch())
        assert len(batches) > 16, "the answer came whole, not as a stream"
        got = pa.Table.from_batches(batches).sort_by("id")
        con = duckdb.connect()
        con.register("big", table)
        expected = con.execute("SELECT id, v FROM big WHERE v >= 1 ORDER BY id").fetch_arrow_table()
        assert got.num_rows == expected.num_rows > 9_000_000
        assert got.column("id").equals(expected.column("id"))
        assert got.column("v").equals(expected.column("v"))
    finally:
        endpoint.cluster.drop("lab/big")


def test_a_prepared_statement_binds_its_parameters(endpoint):
    sql = "SELECT count(*) AS n, sum(ke) AS total FROM physics.particles WHERE ke > ?"
    with endpoint.connect() as connection, connection.cursor() as cursor:
        for threshold in (3.0, 0.25, 12.5):  # one statement, run again with another value
            cursor.execute(sql, parameters=(threshold,))
            result = cursor.fetch_arrow_table()
            expected = endpoint.duckdb(sql.replace("?", repr(threshold)))
            assert_same_rows(result, expected, ordered=False, float_absolute=1e-6)
        assert result.column("n")[0].as_py() > 0


def test_parameters_of_every_kind_bind_as_typed_literals(endpoint):
    cases = [  # (statement, its parameters, the same query with literals, for DuckDB)
        (
            "SELECT count(*) AS n FROM lab.runs WHERE name = ?",
            ("O'Brien",),
            "SELECT count(*) AS n FROM lab.runs WHERE name = 'O''Brien'",
        ),
        (
            "SELECT run_id FROM lab.runs WHERE started >= ? ORDER BY run_id",
            (datetime.date(2024, 7, 11),),
            "SELECT run_id FROM lab.runs WHERE started >= DATE '2024-07-11' ORDER BY run_id",
        ),
        (
            "SELECT count(*) AS n FROM lab.runs WHERE ok = ? AND weight > ?",
            (True, 20),
            "SELECT count(*) AS n FROM lab.runs WHERE ok = TRUE AND weight > 20",
        ),
        (
            "SELECT count(*) AS n FROM lab.runs WHERE run_id -? > 190",
            (-5,),
            "SELECT count(*) AS n FROM lab.runs WHERE run_id - (-5) > 190",
        ),
        (
            "SELECT count(*) AS n FROM lab.runs WHERE weight IS NOT DISTINCT FROM ?",
            (None,),
            "SELECT count(*) AS n FROM lab.runs WHERE weight IS NULL",
        ),
        (
            "SELECT run_id FROM lab.runs ORDER BY run_id LIMIT ?",
            (3,),
            "SELECT run_id FROM lab.runs ORDER BY run_id LIMIT 3",
        ),
        ("SELECT $2 AS b, $1 AS a", ("x", 2), "SELECT 2 AS b, 'x' AS a"),
    ]
    with endpoint.connect() as connection, connection.cursor() as cursor:
        for sql, values, reference in cases:
            cursor.execute(sql, parameters=values)
            result = cursor.fetch_arrow_table()
            assert_same_rows(result, endpoint.duckdb(reference), ordered=True, context=sql)


def test_a_prepared_statement_says_its_parameters_types(endpoint):
    """As JDBC needs them: it writes each value into a vector of the schema's type."""
    sql = "SELECT count(*) FROM lab.runs WHERE name = ? AND started >= ? AND weight > ?"
    with endpoint.connect() as connection, connection.cursor() as cursor:
        schema = cursor.adbc_prepare(sql)
    assert schema.types == [pa.utf8(), pa.date32(), pa.float64()]


def test_a_string_parameter_is_a_value_never_sql(endpoint):
    sql = "SELECT count(*) AS n FROM lab.runs WHERE name = ?"
    with endpoint.connect() as connection, connection.cursor() as cursor:
        for attempt in ("x' OR '1'='1", "x'; SELECT 1 --", "?", "$1", "\\' OR 1=1 --"):
            cursor.execute(sql, parameters=(attempt,))
            assert cursor.fetchall() == [(0,)], attempt
        cursor.execute(sql, parameters=("O'Brien",))
        assert cursor.fetchall() == [(RUNS_NAMED_OBRIEN,)]


RUNS_NAMED_OBRIEN = len(range(0, 200, 7))


def test_each_row_of_a_parameter_batch_runs_the_statement_once(endpoint):
    sql = "SELECT count(*) AS n FROM lab.runs WHERE run_id < ?"
    with endpoint.connect() as connection, connection.cursor() as cursor:
        cursor.execute(sql, pa.record_batch([pa.array([1, 10, 100])], names=["0"]))
        assert cursor.fetch_arrow_table().column("n").to_pylist() == [1, 10, 100]


def test_get_objects_lists_domains_as_schemas_and_datasets_as_tables(endpoint):
    with endpoint.connect() as connection:
        objects = connection.adbc_get_objects().read_all().to_pylist()
        only_physics = connection.adbc_get_objects(db_schema_filter="phys%").read_all()
        runs_only = connection.adbc_get_objects(table_name_filter="r_ns").read_all()
    (catalog,) = objects
    schemas = {s["db_schema_name"]: s for s in catalog["catalog_db_schemas"]}
    assert set(schemas) == {"physics", "lab"}
    (table,) = schemas["physics"]["db_schema_tables"]
    assert (table["table_name"], table["table_type"]) == ("particles", "TABLE")
    columns = [c["column_name"] for c in table["table_columns"]]
    assert columns == endpoint.tables["physics.particles"].column_names
    physics = only_physics.to_pylist()[0]["catalog_db_schemas"]
    assert [s["db_schema_name"] for s in physics] == ["physics"]
    tables = [
        t["table_name"]
        for s in runs_only.to_pylist()[0]["catalog_db_schemas"]
        for t in s["db_schema_tables"] or []
    ]
    assert tables == ["runs"]


def test_a_tables_schema_is_the_datasets(endpoint):
    with endpoint.connect() as connection:
        schema = connection.adbc_get_table_schema("runs", db_schema_filter="lab")
        assert connection.adbc_get_table_types() == ["TABLE"]
        info = connection.adbc_get_info()
    assert schema.equals(endpoint.cluster.entry("lab/runs").schema)
    assert info["vendor_name"] == "quarry"
    assert info["vendor_arrow_version"] == pa.__version__


def test_pandas_reads_sql_through_the_connection(endpoint):
    import pandas as pd

    sql = "SELECT run_id, name, weight FROM lab.runs WHERE run_id BETWEEN 10 AND 40 ORDER BY run_id"
    with endpoint.connect() as connection:
        frame = pd.read_sql(sql, connection)
    expected = endpoint.duckdb(sql).to_pandas()
    pd.testing.assert_frame_equal(frame, expected, check_dtype=False)


def test_an_unknown_table_is_named_with_the_tables_there_are(endpoint):
    import adbc_driver_manager

    with (
        endpoint.connect() as connection,
        connection.cursor() as cursor,
        pytest.raises(adbc_driver_manager.Error) as raised,
    ):
        cursor.execute("SELECT * FROM physics.nope")
    message = str(raised.value)
    assert "physics.nope" in message and "not found" in message
    assert "known tables" in message and "physics.particles" in message and "lab.runs" in message
    assert "Traceback" not in message


def test_the_endpoint_is_read_only(endpoint):
    import adbc_driver_manager

    with endpoint.connect() as connection, connection.cursor() as cursor:
        with pytest.raises(adbc_driver_manager.Error, match="read-only"):
            cursor.executemany("SELECT count(*) FROM lab.runs WHERE run_id < ?", [(1,), (2,)])
        with pytest.raises(adbc_driver_manager.Error, match="only SELECT"):
            cursor.execute("DROP TABLE lab.runs")
    assert endpoint.cluster.entry("lab/runs").rows == 200
