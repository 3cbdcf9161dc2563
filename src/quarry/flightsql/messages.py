"""The Flight SQL messages quarry reads and writes, as protobuf classes built here at import.

Flight SQL wraps every command in a ``google.protobuf.Any`` whose type URL names the message
(``type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery``), so a server must
know each message's full name and its fields' numbers and types, as the spec
(``format/FlightSql.proto`` in Apache Arrow) defines them. Rather than generate and commit a
``_pb2`` module (and a generator beside it), the descriptors are written out below from the
spec's field table and built with ``descriptor_pb2`` into a private descriptor pool, so they
can never clash with another library that registers the same names in the default pool.

Two simplifications, both wire-compatible: enums are read and written as ``int32`` (proto3 puts
both on the wire as the same varint), and a field whose type is another Flight message that
quarry never looks inside is declared as ``bytes`` (an embedded message and a byte string are the
same length-delimited field): ``CancelFlightInfoRequest.info`` holds a serialized ``FlightInfo``,
which pyarrow decodes. Commands quarry refuses (updates, ingest, Substrait plans, transactions)
need no fields: their type URL is enough to name them in the refusal.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from quarry.errors import ProtocolError

SQL_PACKAGE = "arrow.flight.protocol.sql"
FLIGHT_PACKAGE = "arrow.flight.protocol"
TYPE_URL_PREFIX = "type.googleapis.com/"
COMMAND_BYTES_MAX = 16 << 20  # a command is a query and a few names; parameters come by DoPut

_TYPES = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
}

# (message, [(field, number, type, "" | "optional" | "repeated")]), as FlightSql.proto has them.
_KEY_FIELDS = [
    ("catalog", 1, "string", "optional"),
    ("db_schema", 2, "string", "optional"),
    ("table", 3, "string", ""),
]
SQL_MESSAGES: list[tuple[str, list[tuple[str, int, str, str]]]] = [
    ("CommandGetSqlInfo", [("info", 1, "uint32", "repeated")]),
    ("CommandGetXdbcTypeInfo", [("data_type", 1, "int32", "optional")]),
    ("CommandGetCatalogs", []),
    (
        "CommandGetDbSchemas",
        [
            ("catalog", 1, "string", "optional"),
            ("db_schema_filter_pattern", 2, "string", "optional"),
        ],
    ),
    (
        "CommandGetTables",
        [
            ("catalog", 1, "string", "optional"),
            ("db_schema_filter_pattern", 2, "string", "optional"),
            ("table_name_filter_pattern", 3, "string", "optional"),
            ("table_types", 4, "string", "repeated"),
            ("include_schema", 5, "bool", ""),
        ],
    ),
    ("CommandGetTableTypes", []),
    ("CommandGetPrimaryKeys", _KEY_FIELDS),
    ("CommandGetExportedKeys", _KEY_FIELDS),
    ("CommandGetImportedKeys", _KEY_FIELDS),
    (
        "CommandGetCrossReference",
        [
            ("pk_catalog", 1, "string", "optional"),
            ("pk_db_schema", 2, "string", "optional"),
            ("pk_table", 3, "string", ""),
            ("fk_catalog", 4, "string", "optional"),
            ("fk_db_schema", 5, "string", "optional"),
            ("fk_table", 6, "string", ""),
        ],
    ),
    (
        "ActionCreatePreparedStatementRequest",
        [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    ),
    (
        "ActionCreatePreparedStatementResult",
        [
            ("prepared_statement_handle", 1, "bytes", ""),
            ("dataset_schema", 2, "bytes", ""),
            ("parameter_schema", 3, "bytes", ""),
            ("is_update", 4, "bool", "optional"),
        ],
    ),
    ("ActionClosePreparedStatementRequest", [("prepared_statement_handle", 1, "bytes", "")]),
    (
        "CommandStatementQuery",
        [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    ),
    ("TicketStatementQuery", [("statement_handle", 1, "bytes", "")]),
    ("CommandPreparedStatementQuery", [("prepared_statement_handle", 1, "bytes", "")]),
    ("DoPutPreparedStatementResult", [("prepared_statement_handle", 1, "bytes", "optional")]),
    ("ActionCancelQueryRequest", [("info", 1, "bytes", "")]),  # a serialized FlightInfo
    ("ActionCancelQueryResult", [("result", 1, "int32", "")]),  # CancelResult
]
FLIGHT_MESSAGES: list[tuple[str, list[tuple[str, int, str, str]]]] = [
    ("CancelFlightInfoRequest", [("info", 1, "bytes", "")]),  # a FlightInfo message
    ("CancelFlightInfoResult", [("status", 1, "int32", "")]),  # CancelStatus
]

# Commands of the spec quarry does not run: named so that the refusal says which.
REFUSED = {
    "CommandStatementUpdate": "updates",
    "CommandPreparedStatementUpdate": "updates",
    "CommandStatementIngest": "bulk ingestion (use quarry ingest)",
    "CommandStatementSubstraitPlan": "Substrait plans (send SQL)",
    "ActionCreatePreparedSubstraitPlanRequest": "Substrait plans (send SQL)",
}


class CancelStatus(IntEnum):
    """``CancelFlightInfoResult.status`` (Flight.proto) and, number for number, the legacy
    ``ActionCancelQueryResult.result``."""

    UNSPECIFIED = 0
    CANCELLED = 1
    CANCELLING = 2
    NOT_CANCELLABLE = 3


def _file(name: str, package: str, messages: Iterable[tuple[str, list]]) -> Any:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for message_name, fields in messages:
        message = proto.message_type.add(name=message_name)
        for field_name, number, kind, label in fields:
            field = message.field.add(name=field_name, number=number, type=_TYPES[kind])
            field.label = (
                descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                if label == "repeated"
                else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            )
            if label == "optional":  # proto3 `optional`: presence kept in a synthetic oneof
                field.proto3_optional = True
                field.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field_name}")
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file("quarry_flight_sql.proto", SQL_PACKAGE, SQL_MESSAGES))
_POOL.Add(_file("quarry_flight.proto", FLIGHT_PACKAGE, FLIGHT_MESSAGES))


def _class(package: str, name: str) -> type[Message]:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{package}.{name}"))


CLASSES: dict[str, type[Message]] = {name: _class(SQL_PACKAGE, name) for name, _ in SQL_MESSAGES}

CommandGetSqlInfo = CLASSES["CommandGetSqlInfo"]
CommandGetXdbcTypeInfo = CLASSES["CommandGetXdbcTypeInfo"]
CommandGetCatalogs = CLASSES["CommandGetCatalogs"]
CommandGetDbSchemas = CLASSES["CommandGetDbSchemas"]
CommandGetTables = CLASSES["CommandGetTables"]
CommandGetTableTypes = CLASSES["CommandGetTableTypes"]
CommandGetPrimaryKeys = CLASSES["CommandGetPrimaryKeys"]
CommandGetExportedKeys = CLASSES["CommandGetExportedKeys"]
CommandGetImportedKeys = CLASSES["CommandGetImportedKeys"]
CommandGetCrossReference = CLASSES["CommandGetCrossReference"]
ActionCreatePreparedStatementRequest = CLASSES["ActionCreatePreparedStatementRequest"]
ActionCreatePreparedStatementResult = CLASSES["ActionCreatePreparedStatementResult"]
ActionClosePreparedStatementRequest = CLASSES["ActionClosePreparedStatementRequest"]
CommandStatementQuery = CLASSES["CommandStatementQuery"]
TicketStatementQuery = CLASSES["TicketStatementQuery"]
CommandPreparedStatementQuery = CLASSES["CommandPreparedStatementQuery"]
DoPutPreparedStatementResult = CLASSES["DoPutPreparedStatementResult"]
ActionCancelQueryRequest = CLASSES["ActionCancelQueryRequest"]
ActionCancelQueryResult = CLASSES["ActionCancelQueryResult"]
CancelFlightInfoRequest = _class(FLIGHT_PACKAGE, "CancelFlightInfoRequest")
CancelFlightInfoResult = _class(FLIGHT_PACKAGE, "CancelFlightInfoResult")


def pack(message: Message) -> bytes:
    """``message`` inside an ``Any``: how Flight SQL sends commands, tickets and results."""
    wrapper = any_pb2.Any(
        type_url=TYPE_URL_PREFIX + message.DESCRIPTOR.full_name,
        value=message.SerializeToString(),
    )
    return wrapper.SerializeToString()


def unpack(data: bytes) -> Message:
    """The Flight SQL message inside an ``Any``; a ``ProtocolError`` names what was wrong (not
    an ``Any``, a message of another protocol, one quarry does not run, or a field that does
    not decode)."""
    if len(data) > COMMAND_BYTES_MAX:
        raise ProtocolError(f"a Flight SQL command of {len(data):,} bytes is over the bound")
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(bytes(data))
    except DecodeError:
        raise ProtocolError("not a Flight SQL command (no google.protobuf.Any)") from None
    package, _, name = wrapper.type_url.removeprefix(TYPE_URL_PREFIX).rpartition(".")
    if package != SQL_PACKAGE:
        raise ProtocolError(f"not a Flight SQL command: {wrapper.type_url or 'no type'}")
    if name in REFUSED:
        raise NotImplementedError(f"quarry's Flight SQL endpoint is read-only: no {REFUSED[name]}")
    if name not in CLASSES:
        raise NotImplementedError(f"quarry's Flight SQL endpoint does not run {name}")
    return parse(CLASSES[name], wrapper.value)


def parse(cls: type[Message], data: bytes) -> Any:
    message = cls()
    try:
        message.ParseFromString(bytes(data))
    except DecodeError as error:
        raise ProtocolError(f"{cls.DESCRIPTOR.name} does not decode: {error}") from None
    return message


def optional(message: Message, field: str) -> Any:
    """A proto3 ``optional`` field's value, or None when the client left it out (an empty
    string and an absent one mean different things in Flight SQL's catalog filters)."""
    return getattr(message, field) if message.HasField(field) else None
