"""quarry's catalog as Flight SQL describes a database: domains are schemas, datasets tables.

A dataset ``domain/name`` is queried as ``domain.name``, which is exactly a table ``name`` in a
schema ``domain``; there is no catalog level above domains, so catalogs are listed as none and
every row's ``catalog_name`` is null (clients then show schemas at the top, as they do for other
servers without catalogs). Every dataset is a ``TABLE``: quarry has no views.

The result schemas are the spec's to the letter (names, types, nullability): clients compare
them field by field before they read a row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pyarrow as pa

from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.errors import QueryError
from quarry.flightsql import messages
from quarry.flightsql.messages import optional

TABLE_TYPE = "TABLE"
PATTERN_CHARS_MAX = 1024

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False)]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), nullable=False),
        pa.field("table_type", pa.utf8(), nullable=False),
    ]
)
TABLES_WITH_SCHEMA_SCHEMA = TABLES_SCHEMA.append(
    pa.field("table_schema", pa.binary(), nullable=False)
)
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), nullable=False),
        pa.field("column_name", pa.utf8(), nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("key_name", pa.utf8()),
    ]
)
FOREIGN_KEYS_SCHEMA = pa.schema(
    [
        pa.field("pk_catalog_name", pa.utf8()),
        pa.field("pk_db_schema_name", pa.utf8()),
        pa.field("pk_table_name", pa.utf8(), nullable=False),
        pa.field("pk_column_name", pa.utf8(), nullable=False),
        pa.field("fk_catalog_name", pa.utf8()),
        pa.field("fk_db_schema_name", pa.utf8()),
        pa.field("fk_table_name", pa.utf8(), nullable=False),
        pa.field("fk_column_name", pa.utf8(), nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("fk_key_name", pa.utf8()),
        pa.field("pk_key_name", pa.utf8()),
        pa.field("update_rule", pa.uint8(), nullable=False),
        pa.field("delete_rule", pa.uint8(), nullable=False),
    ]
)

XDBC_TYPE_INFO_SCHEMA = pa.schema(
    [
        pa.field("type_name", pa.utf8(), nullable=False),
        pa.field("data_type", pa.int32(), nullable=False),
        pa.field("column_size", pa.int32()),
        pa.field("literal_prefix", pa.utf8()),
        pa.field("literal_suffix", pa.utf8()),
        pa.field("create_params", pa.list_(pa.field("item", pa.utf8(), nullable=False))),
        pa.field("nullable", pa.int32(), nullable=False),
        pa.field("case_sensitive", pa.bool_(), nullable=False),
        pa.field("searchable", pa.int32(), nullable=False),
        pa.field("unsigned_attribute", pa.bool_()),
        pa.field("fixed_prec_scale", pa.bool_(), nullable=False),
        pa.field("auto_increment", pa.bool_()),
        pa.field("local_type_name", pa.utf8()),
        pa.field("minimum_scale", pa.int32()),
        pa.field("maximum_scale", pa.int32()),
        pa.field("sql_data_type", pa.int32(), nullable=False),
        pa.field("datetime_subcode", pa.int32()),
        pa.field("num_prec_radix", pa.int32()),
        pa.field("interval_precision", pa.int32()),
    ]
)


def like(pattern: str | None) -> re.Pattern[str] | None:
    """A Flight SQL filter pattern (``%`` any run, ``_`` one character, ``\\`` escapes the
    next) as a regular expression; None matches everything."""
    if pattern is None:
        return None
    if len(pattern) > PATTERN_CHARS_MAX:
        raise QueryError(f"a filter pattern of {len(pattern):,} characters is over the bound")
    pieces = []
    escaped = False
    for char in pattern:
        if escaped:
            pieces.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            pieces.append(".*")
        elif char == "_":
            pieces.append(".")
        else:
            pieces.append(re.escape(char))
    return re.compile("".join(pieces), re.DOTALL)


def _matches(pattern: re.Pattern[str] | None, name: str) -> bool:
    return pattern is None or pattern.fullmatch(name) is not None


def _in_catalog(catalog: str | None) -> bool:
    """Whether a catalog filter lets quarry's datasets through: none given, or the empty
    name (the spec's "those without a catalog")."""
    return catalog is None or catalog == ""


def catalogs() -> pa.Table:
    return CATALOGS_SCHEMA.empty_table()


def db_schemas(entries: Iterable[DatasetEntry], command: messages.Message) -> pa.Table:
    if not _in_catalog(optional(command, "catalog")):
        return DB_SCHEMAS_SCHEMA.empty_table()
    pattern = like(optional(command, "db_schema_filter_pattern"))
    domains = sorted({e.domain for e in entries if _matches(pattern, e.domain)})
    return pa.table([pa.nulls(len(domains), pa.utf8()), domains], schema=DB_SCHEMAS_SCHEMA)


def tables(entries: Iterable[DatasetEntry], command: messages.Message) -> pa.Table:
    include_schema = bool(command.include_schema)
    schema = TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA
    types = list(command.table_types)
    if not _in_catalog(optional(command, "catalog")) or (types and TABLE_TYPE not in types):
        return schema.empty_table()
    domain_pattern = like(optional(command, "db_schema_filter_pattern"))
    name_pattern = like(optional(command, "table_name_filter_pattern"))
    chosen = sorted(
        (
            e
            for e in entries
            if _matches(domain_pattern, e.domain) and _matches(name_pattern, e.name)
        ),
        key=lambda e: (e.domain, e.name),
    )
    columns = [
        pa.nulls(len(chosen), pa.utf8()),
        [e.domain for e in chosen],
        [e.name for e in chosen],
        [TABLE_TYPE] * len(chosen),
    ]
    if include_schema:
        columns.append([e.schema.serialize().to_pybytes() for e in chosen])
    return pa.table(columns, schema=schema)


def table_types() -> pa.Table:
    return pa.table([[TABLE_TYPE]], schema=TABLE_TYPES_SCHEMA)


def primary_keys() -> pa.Table:
    """None: quarry's datasets have no keys (clients such as DBeaver still ask)."""
    return PRIMARY_KEYS_SCHEMA.empty_table()


def foreign_keys() -> pa.Table:
    return FOREIGN_KEYS_SCHEMA.empty_table()


def xdbc_type_info() -> pa.Table:
    """None listed: a column's type is its Arrow type, in the table's schema (``GetTables``
    with ``include_schema``); JDBC and ODBC clients ask, and take an empty answer."""
    return XDBC_TYPE_INFO_SCHEMA.empty_table()
