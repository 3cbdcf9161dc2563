"""The Flight SQL endpoint: a Flight server in front of a quarry cluster (docs/flightsql.md).

How a Flight SQL call maps onto the cluster:

- ``GetFlightInfo(CommandStatementQuery)`` plans the SQL with the caller's token
  (``cluster.query``): a wrong query fails here with quarry's message; otherwise the plan waits
  as a ``Result`` and the answer is a ticket and the plan's output schema.
- ``DoGet(ticket)`` runs the plan (``Query.execute``, the same path as ``cluster.sql``) and
  streams its batches as they come, checking between batches for a cancel.
- A prepared statement is its SQL and placeholders; ``DoPut`` binds a parameter batch and
  ``GetFlightInfo(CommandPreparedStatementQuery)`` plans the statement with each row bound as
  typed literals (``parameters``), one query per row, their answers in one stream.
- ``GetCatalogs`` / ``GetDbSchemas`` / ``GetTables`` / ``GetTableTypes`` describe the catalog
  (``catalog``); ``GetSqlInfo`` the endpoint (``sqlinfo``).
- ``CancelFlightInfo`` and the legacy ``CancelQuery`` action stop a result, waiting or running.

Everything else (updates, ingest, Substrait, transactions) is refused as unimplemented: the
endpoint is read-only.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry.auth.revocation import Verifier
from quarry.coordinator.query.run import Query
from quarry.errors import ProtocolError, QueryCancelled, QueryError
from quarry.flightsql import auth, catalog, messages, parameters, sqlinfo
from quarry.flightsql.errors import mapped, mapped_stream
from quarry.flightsql.handles import Handle
from quarry.flightsql.messages import CancelStatus
from quarry.flightsql.parameter_types import parameter_types
from quarry.flightsql.sessions import Session, Sessions
from quarry.flightsql.statements import (
    PARAMETER_BYTES_MAX,
    PARAMETER_ROWS_MAX,
    PREPARED_IDLE_S_MAX,
    Prepared,
    Result,
    Statements,
)
from quarry.pushdown import Pushdown

log = logging.getLogger("quarry.flightsql")
REAP_PERIOD_S = 0.5  # how often waiting and running work is checked against its time bounds

ACTIONS = {
    "CreatePreparedStatement": "prepare a statement (its placeholders are ? or $1, $2 ...)",
    "ClosePreparedStatement": "close a prepared statement",
    "CancelFlightInfo": "cancel a query, waiting or running",
    "CancelQuery": "cancel a query (the legacy Flight SQL action)",
}
# Commands answered the same whatever the catalog holds (quarry has no catalogs, keys, views).
FIXED = {
    messages.CommandGetCatalogs: catalog.catalogs,
    messages.CommandGetTableTypes: catalog.table_types,
    messages.CommandGetPrimaryKeys: catalog.primary_keys,
    messages.CommandGetExportedKeys: catalog.foreign_keys,
    messages.CommandGetImportedKeys: catalog.foreign_keys,
    messages.CommandGetCrossReference: catalog.foreign_keys,
    messages.CommandGetXdbcTypeInfo: catalog.xdbc_type_info,
}
# Commands answered from the catalog or the endpoint itself: their ticket is the command.
METADATA = (
    *FIXED,
    messages.CommandGetDbSchemas,
    messages.CommandGetTables,
    messages.CommandGetSqlInfo,
)


class FlightSqlServer(flight.FlightServerBase):
    def __init__(
        self,
        location: str,
        sessions: Sessions,
        verifier: Verifier | None,
        statements: Statements | None = None,
        pushdown: Pushdown | str = Pushdown.AUTO,
        tls: tuple[bytes, bytes] | None = None,
    ):
        super().__init__(
            location,
            auth_handler=auth.HeaderHandshake(),
            middleware={auth.NAME: auth.TokenGate(verifier)},
            tls_certificates=[tls] if tls else None,
        )
        self.scheme = "grpc+tls" if tls else "grpc"
        self.sessions = sessions
        self.statements = statements or Statements()
        self.pushdown = Pushdown.parse(pushdown)
        self._stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="quarry-flightsql-reaper")
        self._reaper.daemon = True
        self._reaper.start()

    def shutdown(self) -> None:
        self._stopping.set()
        super().shutdown()
        self.sessions.close()

    def _reap(self) -> None:
        while not self._stopping.wait(REAP_PERIOD_S):
            try:
                self.statements.reap()
                self.sessions.reap()
            except Exception:  # the reaper must outlive a bug in one pass
                log.exception("flight sql reaper")

    # ---- GetFlightInfo / GetSchema ------------------------------------------------------------

    @mapped
    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        command = _command(descriptor)
        caller = auth.caller(context)
        if isinstance(command, METADATA):
            table = self._metadata(caller, command)
            endpoint = flight.FlightEndpoint(descriptor.command, [])
            return flight.FlightInfo(table.schema, descriptor, [endpoint], table.num_rows, -1)
        result = self._plan(caller, command)
        ticket = messages.pack(
            messages.TicketStatementQuery(statement_handle=result.handle.to_bytes())
        )
        endpoint = flight.FlightEndpoint(ticket, [])
        return flight.FlightInfo(result.schema, descriptor, [endpoint], -1, -1)

    @mapped
    def get_schema(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.SchemaResult:
        command = _command(descriptor)
        caller = auth.caller(context)
        if isinstance(command, METADATA):
            return flight.SchemaResult(self._metadata(caller, command).schema)
        statements, _ = self._statements(caller, command, take_plan=False)
        planned = self._with_session(caller, lambda s: self._query(s, statements[0]))
        return flight.SchemaResult(planned.decomposition.output_schema)

    def _plan(self, caller: auth.Caller, command: Any) -> Result:
        """A query planned for a ticket, holding its caller's session until it is read."""
        statements, planned = self._statements(caller, command, take_plan=True)
        session = self.sessions.acquire(caller.owner, caller.token)
        try:
            if planned is None or planned.cluster is not session.cluster:
                planned = self._query(session, statements[0])
            return self.statements.add_result(
                caller.owner, statements, planned, lambda: self.sessions.release(session)
            )
        except BaseException:
            self.sessions.release(session)
            raise

    def _statements(
        self, caller: auth.Caller, command: Any, take_plan: bool
    ) -> tuple[tuple[str, ...], Query | None]:
        """What a command runs: its statement, or a prepared one once per parameter row; and
        the plan made when it was prepared, if any is left (``take_plan``)."""
        if isinstance(command, messages.CommandStatementQuery):
            return (command.query,), None
        if not isinstance(command, messages.CommandPreparedStatementQuery):
            raise QueryError(f"quarry's Flight SQL endpoint does not run {type(command).__name__}")
        prepared = self.statements.prepared(
            caller.owner, _handle(command.prepared_statement_handle)
        )
        planned = self.statements.take_planned(prepared) if take_plan else None
        return self._bound(prepared), planned

    def _query(self, session: Session, sql: str) -> Query:
        if not sql.strip():
            raise QueryError("the statement is empty: send one SELECT")
        return session.cluster.query(sql, self.pushdown)

    def _bound(self, prepared: Prepared) -> tuple[str, ...]:
        """A prepared statement's SQL, once per bound parameter row (or as it is)."""
        found = prepared.placeholders
        if found.count == 0:
            return (prepared.sql,)
        rows = prepared.parameters
        if rows is None or rows.num_rows == 0:
            raise QueryError(
                f"the statement takes {found.count} parameter(s): bind them before running it"
            )
        columns = [
            column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            for column in rows.columns
        ]
        return tuple(
            parameters.bind(prepared.sql, found, [column[row] for column in columns])
            for row in range(rows.num_rows)
        )

    def _with_session(self, caller: auth.Caller, work: Any) -> Any:
        session = self.sessions.acquire(caller.owner, caller.token)
        try:
            return work(session)
        finally:
            self.sessions.release(session)

    def _metadata(self, caller: auth.Caller, command: Any) -> pa.Table:
        """A catalog or endpoint answer. It too opens the caller's session: without the
        cluster's public key that is where the devices check the token, and a forged one must not
        learn even what the endpoint is."""
        return self._with_session(caller, lambda session: _metadata_of(session, command))

    # ---- DoGet --------------------------------------------------------------------------------

    @mapped
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        command = messages.unpack(ticket.ticket)
        caller = auth.caller(context)
        if isinstance(command, METADATA):
            return flight.RecordBatchStream(self._metadata(caller, command))
        if not isinstance(command, messages.TicketStatementQuery):
            raise QueryError(f"{type(command).__name__} is not a ticket")
        result = self.statements.claim(caller.owner, _handle(command.statement_handle))
        stream = self._batches(result, context)
        # a stream the client never pulls never runs its ``finally``: finish it when it goes
        weakref.finalize(stream, self.statements.finish, result)
        return flight.GeneratorStream(result.schema, mapped_stream(stream))

    def _batches(
        self, result: Result, context: flight.ServerCallContext
    ) -> Iterator[pa.RecordBatch]:
        """A result's answer as it streams, each statement of it in turn; a cancel (or the
        client going away) stops it at the next batch, and its queries' streams are closed."""
        try:
            for index, sql in enumerate(result.statements):
                query = (
                    result.first if index == 0 else result.first.cluster.query(sql, self.pushdown)
                )
                result.running = query
                result.check()
                reader = query.execute()
                try:
                    for batch in reader:
                        result.check()
                        if context.is_cancelled():
                            raise QueryCancelled("the client went away")
                        yield _conform(batch, result.schema)
                finally:
                    reader.close()
                    del reader  # its Python iterator goes with it: the query's streams close
        except QueryCancelled:
            result.check()  # say why: the client's cancel, or the endpoint's time bound
            raise
        finally:
            self.statements.finish(result)

    # ---- DoPut: a prepared statement's parameters ---------------------------------------------

    @mapped
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        command = _command(descriptor)
        if not isinstance(command, messages.CommandPreparedStatementQuery):
            raise NotImplementedError(
                "quarry's Flight SQL endpoint is read-only: it does not take "
                f"{type(command).__name__}"
            )
        caller = auth.caller(context)
        handle = _handle(command.prepared_statement_handle)
        self.statements.bind(caller.owner, handle, _parameter_rows(reader))
        reply = messages.DoPutPreparedStatementResult(prepared_statement_handle=handle.to_bytes())
        writer.write(pa.py_buffer(reply.SerializeToString()))

    # ---- actions ------------------------------------------------------------------------------

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    @mapped
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[bytes]:
        caller = auth.caller(context)
        body = action.body.to_pybytes()
        if action.type == "CancelFlightInfo":
            request = messages.parse(messages.CancelFlightInfoRequest, body)
            status = self._cancel(caller, request.info)
            return [messages.CancelFlightInfoResult(status=status).SerializeToString()]
        command = messages.unpack(body)
        if action.type == "CreatePreparedStatement":
            return [messages.pack(self._prepare(caller, command))]
        if action.type == "ClosePreparedStatement":
            self.statements.close_prepared(caller.owner, _handle(command.prepared_statement_handle))
            return []
        if action.type == "CancelQuery":
            status = self._cancel(caller, command.info)
            return [messages.pack(messages.ActionCancelQueryResult(result=status))]
        raise NotImplementedError(
            f"quarry's Flight SQL endpoint has no action {action.type!r}: it has "
            f"{', '.join(ACTIONS)}"
        )

    def _prepare(self, caller: auth.Caller, command: Any) -> Any:
        if not isinstance(command, messages.ActionCreatePreparedStatementRequest):
            raise QueryError(
                f"CreatePreparedStatement takes a request, not {type(command).__name__}"
            )
        if command.HasField("transaction_id"):
            raise NotImplementedError("quarry's Flight SQL endpoint has no transactions")
        found = parameters.find(command.query)
        planned, types = self._with_session(
            caller, lambda s: self._prepared(s, command.query, found)
        )
        prepared = self.statements.prepare(caller.owner, command.query, found, planned)
        dataset_schema = planned.decomposition.output_schema if planned else None
        parameter_schema = pa.schema([pa.field(f"${i + 1}", t) for i, t in enumerate(types)])
        return messages.ActionCreatePreparedStatementResult(
            prepared_statement_handle=prepared.handle.to_bytes(),
            dataset_schema=dataset_schema.serialize().to_pybytes() if dataset_schema else b"",
            parameter_schema=parameter_schema.serialize().to_pybytes() if types else b"",
        )

    def _prepared(
        self, session: Session, sql: str, found: parameters.Placeholders
    ) -> tuple[Query | None, list[pa.DataType]]:
        """A statement without parameters is planned now: a wrong one fails at prepare, and its
        schema comes back. One with parameters cannot be planned without their values; their
        types are inferred instead (for clients that bind by them, as JDBC does)."""
        if found.count == 0:
            return self._query(session, sql), []
        tables = {name: entry.schema for name, entry in session.cluster.catalog.items()}
        return None, parameter_types(sql, found, tables)

    def _cancel(self, caller: auth.Caller, info_bytes: bytes) -> CancelStatus:
        """Cancel every result a FlightInfo's tickets name (quarry's infos have one)."""
        try:
            info = flight.FlightInfo.deserialize(info_bytes)
        except Exception:
            raise ProtocolError("the cancel request holds no FlightInfo") from None
        statuses = []
        for endpoint in info.endpoints:
            try:
                ticket = messages.unpack(endpoint.ticket.ticket)
            except (ProtocolError, NotImplementedError):
                statuses.append(CancelStatus.NOT_CANCELLABLE)
                continue
            if not isinstance(ticket, messages.TicketStatementQuery):
                statuses.append(CancelStatus.NOT_CANCELLABLE)  # a catalog answer: nothing runs
                continue
            statuses.append(self.statements.cancel(caller.owner, _handle(ticket.statement_handle)))
        if statuses and all(s is CancelStatus.CANCELLED for s in statuses):
            return CancelStatus.CANCELLED
        return CancelStatus.NOT_CANCELLABLE


def _command(descriptor: flight.FlightDescriptor) -> Any:
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise QueryError("a Flight SQL descriptor is a command, not a path")
    return messages.unpack(descriptor.command)


def _handle(data: bytes) -> Handle:
    return Handle.from_bytes(data)


def _metadata_of(session: Session, command: Any) -> pa.Table:
    if type(command) in FIXED:
        return FIXED[type(command)]()
    if isinstance(command, messages.CommandGetSqlInfo):
        return sqlinfo.table(command.info, int(PREPARED_IDLE_S_MAX * 1000))
    session.cluster.refresh()  # what the devices hold now, as this token sees it
    entries = list(session.cluster.catalog.values())
    if isinstance(command, messages.CommandGetDbSchemas):
        return catalog.db_schemas(entries, command)
    return catalog.tables(entries, command)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch in the result's schema: a later parameter row's query may name a column after
    its literal, or bind a typed null where the first bound a value."""
    if batch.schema.equals(schema):
        return batch
    columns = [column.cast(field.type) for column, field in zip(batch.columns, schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _parameter_rows(reader: flight.MetadataRecordBatchReader) -> pa.Table:
    """The parameter batch a client bound, within its bounds."""
    batches: list[pa.RecordBatch] = []
    rows = size = 0
    for chunk in reader:
        batch = chunk.data
        if batch is None:
            continue
        rows += batch.num_rows
        size += batch.nbytes
        if rows > PARAMETER_ROWS_MAX or size > PARAMETER_BYTES_MAX:
            raise QueryError(
                f"bind at most {PARAMETER_ROWS_MAX:,} parameter rows "
                f"({PARAMETER_BYTES_MAX >> 20} MiB) at once: each row is one query"
            )
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)
