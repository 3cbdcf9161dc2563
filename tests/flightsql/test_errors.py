"""What a Flight SQL client sees when a query fails: quarry's message in a Flight error, never a
traceback. A query quarry refuses says what to write instead; one that meets a bug in quarry is
an internal error naming the query, whose traceback stays in the endpoint's log."""

from __future__ import annotations

import pytest

from quarry.coordinator.query import planning


def _failure(endpoint, sql: str) -> str:
    import adbc_driver_manager

    with (
        endpoint.connect() as connection,
        connection.cursor() as cursor,
        pytest.raises(adbc_driver_manager.Error) as raised,
    ):
        cursor.execute(sql)
        cursor.fetch_arrow_table()
    message = str(raised.value)
    assert "Traceback" not in message and ".py" not in message
    return message


def test_a_query_quarry_cannot_run_is_a_clean_error_saying_what_to_write(endpoint):
    message = _failure(endpoint, "SELECT NULL FROM lab.runs")
    assert "type NULL" in message and "CAST(NULL AS INTEGER)" in message
    message = _failure(endpoint, "SELECT max(NULL) FROM lab.runs")
    assert "type NULL" in message and "hint:" in message


def test_output_names_that_repeat_answer(endpoint):
    """DataFusion refuses them; DuckDB runs such a query's super-plan (``duckdb_super``)."""
    with endpoint.connect() as connection, connection.cursor() as cursor:
        cursor.execute("SELECT run_id AS a, weight AS a FROM lab.runs")
        table = cursor.fetch_arrow_table()
    assert table.column_names == ["a", "a"] and table.num_rows > 0


def test_a_bug_is_an_internal_flight_error_naming_the_query(endpoint, monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("decomposition changed the result types")

    monkeypatch.setattr(planning, "plan", broken)
    sql = "SELECT count(*) FROM lab.runs WHERE run_id > 3"
    message = _failure(endpoint, sql)
    assert "internal error in quarry" in message and "AssertionError" in message
    assert f"query: {sql}" in message
