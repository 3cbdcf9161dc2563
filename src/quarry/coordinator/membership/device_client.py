"""The coordinator's handle on one device: typed calls over Flight, typed errors back.

Every request is a message of ``quarry.protocol``; every answer is decoded into its message
before it is returned, so a device that answers nonsense fails here, by name.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import tracing
from quarry.auth.middleware import bearer
from quarry.coordinator.membership.backoff import BusyCounter, retrying
from quarry.coordinator.membership.liveness import (
    HEARTBEAT_LIFETIME_S,
    Heartbeat,
    Liveness,
    is_silence,
)
from quarry.device.unit import host_emulator
from quarry.errors import DeviceUnavailable, ProtocolError, QuarryError, Unauthenticated
from quarry.protocol import control, frame, ingest, work
from quarry.protocol.counters import WorkCounters
from quarry.protocol.message import Message

CALL_TIMEOUT_S = 120.0  # an action's deadline (hello and pulse: the silence bound)
# A stream lives as long as its work takes (a scan of a slow drive, a put fed by a slow source),
# which no deadline can know: its liveness is checked instead (a device silent for
# the silence bound is lost: ``liveness``), and this bounds a stream that stays alive.
STREAM_TIMEOUT_S = 24 * 3600.0


class DeviceClient:
    def __init__(
        self,
        name: str,
        address: str,
        timeout_s: float = CALL_TIMEOUT_S,
        token: str | None = None,
        root_ca: bytes | None = None,
        identity: tuple[bytes, bytes] | None = None,
    ):
        self.name = name
        self.address = address
        self.timeout_s = timeout_s
        self.liveness = Liveness.configured()
        # every call carries the token; over TLS the device must show a certificate the
        # cluster's CA signed, and this side shows ``identity`` (certificate, key) if it has
        # one, which a device that verifies its clients requires
        self._headers = bearer(token) if token else []
        tls: dict[str, Any] = {}
        if root_ca is not None and identity is not None:
            tls["cert_chain"], tls["private_key"] = identity
        self._client = flight.FlightClient(
            address,
            tls_root_certs=root_ca,
            generic_options=self.liveness.channel_options(),
            **tls,
        )
        self.busy = BusyCounter()  # what this device's admission held back
        self.heartbeat = Heartbeat(name, self._heartbeat_stream(), self.liveness)
        weakref.finalize(self, self.heartbeat.stop)  # a client dropped unclosed

    def __repr__(self) -> str:
        return f"DeviceClient({self.name!r}, {self.address!r})"

    def close(self) -> None:
        self.heartbeat.stop()
        self._client.close()

    def _options(
        self, timeout_s: float | None = None, span: tracing.Span = tracing.NO_SPAN
    ) -> flight.FlightCallOptions:
        """A call's deadline and headers: its token, and with a ``span`` (a traced query's)
        the trace the device's own spans join (``traceparent``)."""
        self.heartbeat.ensure()  # every call: the device's heartbeats keep its pings welcome
        headers = self._headers + span.headers() if span.recording else self._headers
        return flight.FlightCallOptions(timeout=timeout_s or self.timeout_s, headers=headers)

    def _heartbeat_stream(self) -> Callable[[], flight.FlightStreamReader]:
        """How ``Heartbeat`` opens its stream: bound to the Flight client, not to this object."""
        client, headers = self._client, self._headers
        request = control.Heartbeat(self.liveness.heartbeat_period_s, HEARTBEAT_LIFETIME_S)
        ticket = flight.Ticket(request.encode())
        timeout_s = HEARTBEAT_LIFETIME_S + self.liveness.silence_s
        return lambda: client.do_get(
            ticket, flight.FlightCallOptions(timeout=timeout_s, headers=headers)
        )

    def translate(self, error: Exception) -> Exception:
        """A Flight error as the quarry error it carries, naming this device."""
        text = str(error)
        typed = frame.decode_error(text)
        if typed is not None:
            return typed
        if isinstance(error, flight.FlightUnauthenticatedError):
            return Unauthenticated(f"device {self.name} refused the call: {text.splitlines()[0]}")
        if is_silence(error):
            self.heartbeat.went_silent()
            return self.liveness.silent(self.name, self.address)
        if (
            isinstance(
                error,
                (
                    flight.FlightUnavailableError,
                    flight.FlightTimedOutError,
                    ConnectionError,
                    OSError,
                ),
            )
            or "unavailable" in text.lower()
            or "failed to connect" in text.lower()
            or "connection refused" in text.lower()
        ):
            return DeviceUnavailable(
                f"device {self.name} at {self.address} does not answer "
                f"({type(error).__name__}): is it running? Check `quarry status`."
            )
        return QuarryError(f"device {self.name} at {self.address}: {text.splitlines()[0]}")

    def guard(self, call: Callable[[], Any]) -> Any:
        """Run a call on this device's streams, translating Flight errors."""
        try:
            return call()
        except (flight.FlightError, OSError) as error:
            raise self.translate(error) from None

    # ---- actions -------------------------------------------------------------------------

    def action(
        self, request: Message, payload: bytes = b"", timeout_s: float | None = None
    ) -> bytes:
        body = request.encode(payload)
        action = flight.Action(str(request.KIND), body)
        results = self.guard(lambda: list(self._client.do_action(action, self._options(timeout_s))))
        if len(results) != 1:
            raise ProtocolError(
                f"device {self.name}: action {request.KIND} answered {len(results)} messages"
            )
        return results[0].body.to_pybytes()

    def ask(
        self,
        request: Message,
        reply: type[Any],
        payload: bytes = b"",
        timeout_s: float | None = None,
    ) -> Any:
        """An action and its typed reply."""
        return reply.from_bytes(self.action(request, payload, timeout_s))

    def hello(self, timeout_s: float | None = None) -> control.HelloReply:
        timeout_s = timeout_s or self.liveness.silence_s  # a quick answer, or it is silent
        info = self.ask(control.Hello(), control.HelloReply, timeout_s=timeout_s)
        assert info.protocol == frame.PROTOCOL_VERSION
        return info

    def inventory(self) -> list[control.PartitionSummary]:
        return self.inventory_reply().partitions

    def inventory_reply(self) -> control.InventoryReply:
        return self.ask(control.Inventory(), control.InventoryReply)

    def pulse(self, timeout_s: float | None = None) -> control.PulseReply:
        """Its catalog generation and its load, in one call (``Membership.pulse``)."""
        timeout_s = timeout_s or self.liveness.silence_s
        return self.ask(control.Pulse(), control.PulseReply, timeout_s=timeout_s)

    def push_revocations(self, push: control.RevocationPush) -> control.RevocationsHeld:
        """Hand the device the cluster's signed revocation list, and the peers it asks for
        newer ones (admin role)."""
        return self.ask(push, control.RevocationsHeld, timeout_s=self.liveness.silence_s)

    def describe(self, domain: str, dataset: str, partition: int) -> control.PartitionDescription:
        request = control.PartitionRef(domain, dataset, partition)
        return self.ask(request, control.PartitionDescription)

    def commit(self, ingest_id: str) -> list[int]:
        return self.ask(ingest.Commit(ingest_id), ingest.Committed).committed

    def abort(self, ingest_id: str) -> int:
        return self.ask(ingest.Abort(ingest_id), control.Deleted).deleted

    def drop(self, domain: str, dataset: str) -> int:
        return self.ask(ingest.Drop(domain, dataset), control.Deleted).deleted

    def retire(self, domain: str, dataset: str, partition: int, ingest_id: str) -> bool:
        """A partition moved elsewhere leaves this device (whether it held it)."""
        request = ingest.Retire(domain, dataset, partition, ingest_id)
        return self.ask(request, ingest.Applied).applied

    def holders(
        self, domain: str, dataset: str, partition: int, ingest_id: str, devices: list[str]
    ) -> bool:
        """Tell this device's copy of a partition which devices hold it now; whether it holds
        that ingest's partition, committed."""
        request = ingest.Holders(domain, dataset, partition, ingest_id, tuple(devices))
        return self.ask(request, ingest.Applied).applied

    def stats(self) -> control.StatsReply:
        return self.ask(control.Stats(), control.StatsReply)

    def load(self, cpu: float, seconds: float) -> control.LoadStarted:
        return self.ask(control.Load(cpu, seconds), control.LoadStarted)

    def load_status(self) -> control.LoadStatus:
        return self.ask(control.LoadStatusRequest(), control.LoadStatus)

    def quarantine_clear(self) -> int:
        """Lift every sub-plan shape the device quarantined; how many there were."""
        return self.ask(control.QuarantineClear(), control.QuarantineCleared).cleared

    def calibrate(
        self, part: control.CalibratePart, repeat: int = 1, timeout_s: float | None = None
    ) -> control.CalibrateReply:
        return self.ask(
            control.Calibrate(part, repeat), control.CalibrateReply, timeout_s=timeout_s
        )

    def kv_get(self, key: str) -> tuple[bytes, int]:
        value, payload = control.KvValue.decode(self.action(control.KvGet(key)))
        return payload, value.version

    def kv_put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        return self.ask(control.KvPut(key, expected_version), control.Version, value).version

    def kv_delete(self, key: str, expected_version: int | None = None) -> bool:
        return bool(self.ask(control.KvDelete(key, expected_version), control.Deleted).deleted)

    def kv_list(self, prefix: str = "", limit: int = 1000) -> list[str]:
        return self.ask(control.KvList(prefix, limit), control.KvKeys).keys

    # ---- writes --------------------------------------------------------------------------

    def open_put(
        self, request: ingest.PutPartition | ingest.UpdateSlice, schema: pa.Schema
    ) -> tuple[flight.FlightStreamWriter, flight.FlightMetadataReader]:
        descriptor = flight.FlightDescriptor.for_command(request.encode())
        options = self._options(STREAM_TIMEOUT_S)
        return self.guard(lambda: self._client.do_put(descriptor, schema, options))

    def update_slice(
        self,
        domain: str,
        dataset: str,
        partition: int,
        number: int,
        batch: pa.RecordBatch,
        expected_version: int,
    ) -> int:
        request = ingest.UpdateSlice(domain, dataset, partition, number, expected_version)
        writer, reader = self.open_put(request, batch.schema)
        ack = self.guard(lambda: _finish_put(writer, reader, [batch]))
        return control.Version.from_bytes(ack).version

    # ---- reads ---------------------------------------------------------------------------

    def get(
        self, request: Message, payload: bytes = b"", span: tracing.Span = tracing.NO_SPAN
    ) -> flight.FlightStreamReader:
        """A do_get stream for a ticket (scan, pushed-back slices, calibration), once the
        device has admitted it (a busy device is retried after the wait it asks for)."""
        ticket = flight.Ticket(request.encode(payload))

        def admitted() -> flight.FlightStreamReader:
            options = self._options(STREAM_TIMEOUT_S, span)
            reader = self.guard(lambda: self._client.do_get(ticket, options))
            self.guard(lambda: reader.schema)  # the device's first answer: admitted, or busy
            return reader

        return retrying(admitted, self.busy)

    def scan(
        self,
        domain: str,
        dataset: str,
        partition: int,
        first: int = 0,
        end: int | None = None,
        columns: list[str] | None = None,
        stored: bool = False,
        generation: str = "",
        span: tracing.Span = tracing.NO_SPAN,
    ) -> flight.FlightStreamReader:
        columns_ = tuple(columns) if columns is not None else None
        request = work.ScanRequest(
            domain, dataset, partition, first, end, columns_, stored, generation
        )
        return self.get(request, span=span)

    def batches(self, reader: flight.FlightStreamReader) -> Iterator[pa.RecordBatch]:
        """A stream's batches, its errors translated."""
        while (chunk := self.guard(lambda: _next(reader))) is not None:
            if chunk.data is not None:
                host_emulator().ship(chunk.data.nbytes)  # the host's ingress, when it has one
                yield chunk.data

    # ---- work near the data ----------------------------------------------------------------

    def work(
        self, request: work.WorkRequest, payload: bytes = b"", span: tracing.Span = tracing.NO_SPAN
    ) -> WorkStream:
        """Run a unit of work; iterate the stream for its batches and, in stream order, the
        device's notices (``PushedBack``) and its last word (``WorkDone``). Under a ``span``
        the device's spans join its trace."""
        descriptor = flight.FlightDescriptor.for_command(request.encode(payload))

        def admitted() -> WorkStream:
            options = self._options(STREAM_TIMEOUT_S, span)
            exchange = self.guard(lambda: self._client.do_exchange(descriptor, options))
            stream = WorkStream(self, *exchange)
            try:
                stream.schema  # noqa: B018 - the device's first answer: admitted, or busy
            except BaseException:
                stream.close()
                raise
            return stream

        return retrying(admitted, self.busy)

    def program(
        self, unit: str, header: dict[str, Any] | None = None, payload: bytes = b""
    ) -> tuple[pa.Table, dict[str, Any]]:
        """Run a unit of work on this device alone, nothing pushed back: its output, and its
        summary with the loop's figures (bytes and rows read, bytes shipped, CPU and wall
        seconds). ``header`` names ``domain``, ``dataset``, ``partition`` or ``partitions``; the
        rest are the unit's arguments."""
        args = dict(header or {})
        domain, dataset = args.pop("domain", ""), args.pop("dataset", "")
        if "partitions" in args:
            partitions = tuple(args.pop("partitions"))
        elif "partition" in args:
            partitions = (args.pop("partition"),)
        else:
            raise ProtocolError(f"unit {unit}: give 'partition' (a number) or 'partitions'")
        request = work.WorkRequest.from_json(
            {
                "unit": unit,
                "domain": domain,
                "dataset": dataset,
                "partitions": partitions,
                "args": args,
            }
        )
        batches: list[pa.RecordBatch] = []
        done: work.WorkDone | None = None
        stream = self.work(request, payload)
        for item in stream:
            if isinstance(item, pa.RecordBatch):
                batches.append(item)
            elif isinstance(item, work.WorkDone):
                done = item
            elif isinstance(item, work.PushedBack):
                raise ProtocolError(f"unit {unit} pushed back work to a caller that takes none")
        if done is None:
            raise ProtocolError(f"device {self.name}: unit {unit} ended without its last message")
        return pa.Table.from_batches(batches, schema=stream.schema), _summary(done)


class WorkStream:
    """A work exchange's answer: batches, ``PushedBack`` notices and ``WorkDone``, in order."""

    def __init__(self, client: DeviceClient, writer: Any, reader: Any):
        self.client = client
        self.writer = writer
        self.reader = reader

    @property
    def schema(self) -> pa.Schema:
        return self.client.guard(lambda: self.reader.schema)

    def __iter__(self) -> Iterator[pa.RecordBatch | work.PushedBack | work.WorkDone]:
        guard = self.client.guard
        try:
            guard(self.writer.done_writing)
            while (chunk := guard(lambda: _next(self.reader))) is not None:
                if chunk.data is not None and chunk.data.num_rows:
                    host_emulator().ship(chunk.data.nbytes)  # the host's ingress
                    yield chunk.data
                if chunk.app_metadata is not None:
                    yield work.decode_stream_message(chunk.app_metadata.to_pybytes())
        finally:  # also when the device raised: an unclosed exchange complains at exit
            self.close()

    def close(self) -> None:
        with contextlib.suppress(flight.FlightError, OSError):
            self.writer.close()


def _summary(done: work.WorkDone) -> dict[str, Any]:
    """The unit's summary, every work counter over its partitions (the device's CPU as it
    counted it for the whole request) and its wall seconds."""
    counted = WorkCounters.sum(p.metrics.counters for p in done.partitions)
    counted = replace(counted, device_cpu_s=done.device_cpu_s)
    return {**done.summary, **counted.to_json(), "wall_s": done.wall_s}


def _next(reader: Any) -> Any:
    try:
        return reader.read_chunk()
    except StopIteration:
        return None


def _finish_put(
    writer: flight.FlightStreamWriter,
    reader: flight.FlightMetadataReader,
    batches: list[pa.RecordBatch],
) -> bytes:
    for batch in batches:
        writer.write_batch(batch)
    writer.done_writing()
    ack = reader.read()
    writer.close()
    if ack is None:
        raise ProtocolError("the device closed the stream without an answer")
    return ack.to_pybytes()


def finish_put(writer: flight.FlightStreamWriter, reader: flight.FlightMetadataReader) -> bytes:
    return _finish_put(writer, reader, [])
