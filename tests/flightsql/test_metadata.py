"""The catalog as Flight SQL describes it (domains as schemas, datasets as tables), what the
endpoint says of itself, and the Flight SQL messages it reads, checked without a cluster."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.errors import ProtocolError
from quarry.flightsql import catalog, messages, sqlinfo

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("ke", pa.float64())])


def _entry(domain: str, name: str) -> DatasetEntry:
    return DatasetEntry(domain, name, SCHEMA, "none", {}, {}, [])


ENTRIES = [_entry("physics", "particles"), _entry("physics", "muons"), _entry("lab", "runs_2")]


def test_like_patterns_match_as_flight_sql_says():
    assert catalog.like("phys%").fullmatch("physics")
    assert catalog.like("r_ns").fullmatch("runs") and not catalog.like("r_ns").fullmatch("rns")
    assert catalog.like("runs\\_2").fullmatch("runs_2")
    assert not catalog.like("runs\\_2").fullmatch("runsx2")
    assert catalog.like("a.b").fullmatch("a.b") and not catalog.like("a.b").fullmatch("axb")
    assert catalog.like(None) is None


def test_tables_filter_by_domain_name_and_type_with_schemas_on_request():
    command = messages.CommandGetTables(db_schema_filter_pattern="phys%", include_schema=True)
    tables = catalog.tables(ENTRIES, command)
    assert tables.schema.equals(catalog.TABLES_WITH_SCHEMA_SCHEMA)
    assert tables.column("table_name").to_pylist() == ["muons", "particles"]
    assert tables.column("catalog_name").null_count == 2
    schema = pa.ipc.read_schema(pa.py_buffer(tables.column("table_schema")[0].as_py()))
    assert schema.equals(SCHEMA)
    plain = catalog.tables(ENTRIES, messages.CommandGetTables(table_name_filter_pattern="runs%"))
    assert plain.schema.equals(catalog.TABLES_SCHEMA) and plain.num_rows == 1
    views = catalog.tables(ENTRIES, messages.CommandGetTables(table_types=["VIEW"]))
    assert views.num_rows == 0
    named_catalog = catalog.tables(ENTRIES, messages.CommandGetTables(catalog="main"))
    assert named_catalog.num_rows == 0  # quarry has no catalogs: none is named
    no_catalog = catalog.tables(ENTRIES, messages.CommandGetTables(catalog=""))
    assert no_catalog.num_rows == 3  # "" asks for what has no catalog: everything


def test_domains_are_schemas():
    schemas = catalog.db_schemas(ENTRIES, messages.CommandGetDbSchemas())
    assert schemas.schema.equals(catalog.DB_SCHEMAS_SCHEMA)
    assert schemas.column("db_schema_name").to_pylist() == ["lab", "physics"]
    assert catalog.catalogs().num_rows == 0
    assert catalog.table_types().column("table_type").to_pylist() == ["TABLE"]


def test_sql_info_answers_what_was_asked_in_the_spec_schema():
    info = sqlinfo.table([sqlinfo.SqlInfo.SERVER_READ_ONLY, 0, 9_999], statement_timeout_ms=5)
    assert info.schema.equals(sqlinfo.SCHEMA)
    info.validate(full=True)
    assert info.to_pylist() == [
        {"info_name": 3, "value": True},
        {"info_name": 0, "value": "quarry"},
    ]
    everything = sqlinfo.table([], statement_timeout_ms=5)
    assert everything.num_rows == len(sqlinfo.SqlInfo)


def test_commands_round_trip_and_wrong_ones_are_named():
    command = messages.CommandStatementQuery(query="SELECT 1")
    assert messages.unpack(messages.pack(command)) == command
    tables = messages.unpack(messages.pack(messages.CommandGetTables(catalog="")))
    assert messages.optional(tables, "catalog") == ""
    assert messages.optional(tables, "db_schema_filter_pattern") is None
    with pytest.raises(ProtocolError, match="not a Flight SQL command"):
        messages.unpack(b"\xff\xff")
    update = messages.any_pb2.Any(
        type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementUpdate"
    )
    with pytest.raises(NotImplementedError, match="read-only"):
        messages.unpack(update.SerializeToString())
