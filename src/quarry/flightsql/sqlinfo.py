"""What the endpoint tells a client about itself (``CommandGetSqlInfo``): its name and version,
that it is read-only, that it cancels, and the basics of the SQL it speaks (DataFusion's, as
quarry plans it).

Only what is true of quarry is listed; a client asking for an id not here gets no row for it,
which the spec allows ("servers may choose"), rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

import pyarrow as pa

import quarry

INFO_IDS_MAX = 10_000  # ids in one request: the spec reserves [0, 10000) for its own


class SqlInfo(IntEnum):
    """The ids of FlightSql.proto's ``SqlInfo`` that quarry answers."""

    SERVER_NAME = 0
    SERVER_VERSION = 1
    SERVER_ARROW_VERSION = 2
    SERVER_READ_ONLY = 3
    SERVER_SQL = 4
    SERVER_SUBSTRAIT = 5
    SERVER_TRANSACTION = 8
    SERVER_CANCEL = 9
    SERVER_BULK_INGESTION = 10
    SERVER_STATEMENT_TIMEOUT = 100
    DDL_CATALOG = 500
    DDL_SCHEMA = 501
    DDL_TABLE = 502
    IDENTIFIER_CASE = 503
    IDENTIFIER_QUOTE_CHAR = 504
    ALL_TABLES_ARE_SELECTABLE = 506
    NULL_ORDERING = 507
    SEARCH_STRING_ESCAPE = 513
    SUPPORTS_COLUMN_ALIASING = 515
    NULL_PLUS_NULL_IS_NULL = 516
    SUPPORTED_GRAMMAR = 525
    ANSI92_SUPPORTED_LEVEL = 526
    SCHEMA_TERM = 529
    CATALOG_TERM = 531
    TRANSACTIONS_SUPPORTED = 563


# The value union, member for member as the spec declares it.
STRING, BOOL, BIGINT, INT32, STRING_LIST, INT32_MAP = range(6)
VALUE_TYPE = pa.dense_union(
    [
        pa.field("string_value", pa.utf8(), nullable=False),
        pa.field("bool_value", pa.bool_(), nullable=False),
        pa.field("bigint_value", pa.int64(), nullable=False),
        pa.field("int32_bitmask", pa.int32(), nullable=False),
        pa.field("string_list", pa.list_(pa.utf8()), nullable=False),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32())), False),
    ]
)
SCHEMA = pa.schema(
    [pa.field("info_name", pa.uint32(), nullable=False), pa.field("value", VALUE_TYPE, False)]
)

# Unquoted names are folded to lower case (DataFusion); double quotes keep them as written.
CASE_LOWERCASE = 3
NULLS_SORTED_HIGH = 0  # NULLS LAST ascending, FIRST descending: nulls sort as the largest
GRAMMAR_MINIMUM_AND_CORE = 0b011
ANSI92_ENTRY = 0b001
TRANSACTION_NONE = 0


def values(statement_timeout_ms: int) -> dict[SqlInfo, tuple[int, object]]:
    """Every id quarry answers, with its union member and value."""
    return {
        SqlInfo.SERVER_NAME: (STRING, "quarry"),
        SqlInfo.SERVER_VERSION: (STRING, quarry.__version__),
        SqlInfo.SERVER_ARROW_VERSION: (STRING, pa.__version__),
        SqlInfo.SERVER_READ_ONLY: (BOOL, True),
        SqlInfo.SERVER_SQL: (BOOL, True),
        SqlInfo.SERVER_SUBSTRAIT: (BOOL, False),
        SqlInfo.SERVER_TRANSACTION: (INT32, TRANSACTION_NONE),
        SqlInfo.SERVER_CANCEL: (BOOL, True),
        SqlInfo.SERVER_BULK_INGESTION: (BOOL, False),
        SqlInfo.SERVER_STATEMENT_TIMEOUT: (INT32, statement_timeout_ms),
        SqlInfo.DDL_CATALOG: (BOOL, False),
        SqlInfo.DDL_SCHEMA: (BOOL, False),
        SqlInfo.DDL_TABLE: (BOOL, False),
        SqlInfo.IDENTIFIER_CASE: (INT32, CASE_LOWERCASE),
        SqlInfo.IDENTIFIER_QUOTE_CHAR: (STRING, '"'),
        SqlInfo.ALL_TABLES_ARE_SELECTABLE: (BOOL, True),
        SqlInfo.NULL_ORDERING: (INT32, NULLS_SORTED_HIGH),
        SqlInfo.SEARCH_STRING_ESCAPE: (STRING, "\\"),
        SqlInfo.SUPPORTS_COLUMN_ALIASING: (BOOL, True),
        SqlInfo.NULL_PLUS_NULL_IS_NULL: (BOOL, True),
        SqlInfo.SUPPORTED_GRAMMAR: (INT32, GRAMMAR_MINIMUM_AND_CORE),
        SqlInfo.ANSI92_SUPPORTED_LEVEL: (INT32, ANSI92_ENTRY),
        SqlInfo.SCHEMA_TERM: (STRING, "domain"),
        SqlInfo.CATALOG_TERM: (STRING, "catalog"),
        SqlInfo.TRANSACTIONS_SUPPORTED: (BOOL, False),
    }


def table(requested: Iterable[int], statement_timeout_ms: int) -> pa.Table:
    """One row per requested id quarry answers (every one, when none is requested), in the
    order asked."""
    known = values(statement_timeout_ms)
    asked = list(requested)
    if len(asked) > INFO_IDS_MAX:
        asked = asked[:INFO_IDS_MAX]
    ids = [SqlInfo(i) for i in asked if i in SqlInfo._value2member_map_] if asked else list(known)
    members: list[list[object]] = [[] for _ in range(6)]
    type_ids, offsets = [], []
    for info in ids:
        member, value = known[info]
        type_ids.append(member)
        offsets.append(len(members[member]))
        members[member].append(value)
    children = [pa.array(members[index], type=VALUE_TYPE.field(index).type) for index in range(6)]
    union = pa.Array.from_buffers(
        VALUE_TYPE,
        len(ids),
        [
            None,
            pa.array(type_ids, pa.int8()).buffers()[1],
            pa.array(offsets, pa.int32()).buffers()[1],
        ],
        children=children,
    )
    return pa.table([pa.array([int(i) for i in ids], pa.uint32()), union], schema=SCHEMA)
