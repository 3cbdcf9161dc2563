"""Placeholders are found outside strings, names and comments; each parameter becomes a literal
of its own type that DataFusion reads back as the same value and type."""

from __future__ import annotations

import datetime
import decimal
import math

import datafusion
import pyarrow as pa
import pytest

from quarry.errors import QueryError
from quarry.flightsql.parameter_types import parameter_types
from quarry.flightsql.parameters import bind, find, literal

VALUES = [
    pa.scalar(3, pa.int64()),
    pa.scalar(-3, pa.int64()),
    pa.scalar(-7, pa.int8()),
    pa.scalar(2**64 - 1, pa.uint64()),
    pa.scalar(3.0),
    pa.scalar(-1e300),
    pa.scalar(5e-324),
    pa.scalar(1.5, pa.float32()),
    pa.scalar(True),
    pa.scalar("it's \\ ? -- /* $1"),
    pa.scalar("x", pa.large_string()),
    pa.scalar(b"\x00\xff'"),
    pa.scalar(decimal.Decimal("-12.345"), pa.decimal128(10, 3)),
    pa.scalar(datetime.date(2024, 2, 29)),
    pa.scalar(datetime.datetime(2024, 1, 2, 3, 4, 5, 123456), pa.timestamp("us")),
    pa.scalar(None, pa.float64()),
    pa.scalar(None, pa.utf8()),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{v.type}:{v.as_py()!r}"[:40])
def test_a_literal_reads_back_as_the_same_value(value):
    answer = datafusion.SessionContext().sql(f"SELECT {literal(value)} AS v").to_arrow_table()
    back = answer.column("v")[0]
    if pa.types.is_timestamp(value.type):
        assert back.as_py() == value.as_py()  # DataFusion's TIMESTAMP keeps every digit
        return
    assert _family(back.type) == _family(value.type)
    assert back.as_py() == value.as_py()


def _family(arrow_type: pa.DataType) -> pa.DataType:
    """Text is text: DataFusion types a VARCHAR as a string view, a quoted literal as utf8."""
    is_text = pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type)
    return pa.utf8() if is_text else arrow_type


def test_special_floats_read_back():
    context = datafusion.SessionContext()
    for number in (math.nan, math.inf, -math.inf):
        sql = f"SELECT {literal(pa.scalar(number))} AS v"
        back = context.sql(sql).to_arrow_table().column("v")[0].as_py()
        assert (math.isnan(back) and math.isnan(number)) or back == number


def test_placeholders_inside_strings_names_and_comments_stay_text():
    sql = (
        "SELECT '?', \"a?\", ? -- ?\n/* ? */, E'\\'?', $$ ? $$, $tag$ ? $tag$, x-? "
        "FROM t WHERE y = 'it''s ?'"
    )
    found = find(sql)
    assert found.count == 2
    bound = bind(sql, found, [pa.scalar(-5), pa.scalar(1)])
    assert bound.count("(-5)") == 1 and "x- 1 " in bound
    assert "'?'" in bound and '"a?"' in bound and "-- ?" in bound and "'it''s ?'" in bound


def test_a_negative_number_never_becomes_a_comment():
    sql = "SELECT 10 -? AS v"
    bound = bind(sql, find(sql), [pa.scalar(-5)])
    value = datafusion.SessionContext().sql(bound).to_arrow_table().column("v")[0].as_py()
    assert value == 15


def test_numbered_placeholders_take_their_columns():
    found = find("SELECT $2, $1, $2")
    assert found.columns == (1, 0, 1) and found.count == 2
    sql = "SELECT $2, $1"
    assert bind(sql, find(sql), [pa.scalar("a"), pa.scalar(7)]) == "SELECT  7 ,  'a' "


def test_mixed_or_missing_parameters_are_refused():
    with pytest.raises(QueryError, match="not both"):
        find("SELECT ?, $1")
    with pytest.raises(QueryError, match="takes 2 parameter"):
        bind("SELECT ?, ?", find("SELECT ?, ?"), [pa.scalar(1)])
    with pytest.raises(QueryError, match="cannot be bound"):
        literal(pa.scalar([1, 2]))
    with pytest.raises(QueryError, match="NUL"):
        literal(pa.scalar("a\x00b"))


TABLES = {
    "physics/particles": pa.schema([("id", pa.int64()), ("ke", pa.float64())]),
    "lab/runs": pa.schema([("run_id", pa.int64()), ("name", pa.utf8()), ("started", pa.date32())]),
}


@pytest.mark.parametrize(
    "sql, types",
    [
        ("SELECT count(*) FROM physics.particles WHERE ke > ?", [pa.float64()]),
        (
            "SELECT * FROM lab.runs WHERE name = ? AND started >= ? AND run_id BETWEEN ? AND ?",
            [pa.utf8(), pa.date32(), pa.int64(), pa.int64()],
        ),
        (
            "SELECT * FROM physics.particles p JOIN lab.runs r ON p.id = r.run_id "
            "WHERE r.name IN (?, ?) AND p.ke + ? > 1",
            [pa.utf8(), pa.utf8(), pa.float64()],
        ),
        ("SELECT $2, $1 FROM lab.runs WHERE name = $1", [pa.utf8(), pa.null()]),
        ("SELECT ?", [pa.null()]),  # nothing says: the client's value will
        ("SELECT * FROM nope WHERE x = ?", [pa.null()]),  # fails when it runs, with its message
    ],
)
def test_parameter_types_come_from_where_the_placeholders_stand(sql, types):
    assert parameter_types(sql, find(sql), TABLES) == types
