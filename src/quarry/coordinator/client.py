"""The coordinator's handle on one device: typed calls over Flight, typed errors back."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import protocol
from quarry.errors import DeviceUnavailable, QuarryError
from quarry.protocol import Action, Exchange, Get, Put

CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 120.0


class DeviceClient:
    def __init__(self, name: str, address: str, timeout_s: float = CALL_TIMEOUT_S):
        self.name = name
        self.address = address
        self.timeout_s = timeout_s
        self._client = flight.FlightClient(address)

    def __repr__(self) -> str:
        return f"DeviceClient({self.name!r}, {self.address!r})"

    def close(self) -> None:
        self._client.close()

    def _options(self, timeout_s: float | None = None) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(timeout=timeout_s or self.timeout_s)

    def translate(self, error: Exception) -> Exception:
        """A Flight error as the quarry error it carries, naming this device."""
        text = str(error)
        typed = protocol.decode_error(text)
        if typed is not None:
            return typed
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

    def action(
        self,
        kind: str,
        header: dict[str, Any] | None = None,
        payload: bytes = b"",
        timeout_s: float | None = None,
    ) -> bytes:
        body = protocol.encode(kind, header, payload)
        try:
            results = list(
                self._client.do_action(flight.Action(str(kind), body), self._options(timeout_s))
            )
        except (flight.FlightError, OSError) as error:
            raise self.translate(error) from None
        assert len(results) == 1, f"action {kind} answered {len(results)} messages"
        return results[0].body.to_pybytes()

    def action_json(
        self,
        kind: str,
        header: dict[str, Any] | None = None,
        payload: bytes = b"",
        timeout_s: float | None = None,
    ) -> Any:
        return protocol.decode_json(self.action(kind, header, payload, timeout_s))

    # ---- control -------------------------------------------------------------------------

    def hello(self, timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
        info = self.action_json(Action.HELLO, timeout_s=timeout_s)
        assert info["protocol"] == protocol.PROTOCOL_VERSION
        return info

    def inventory(self) -> list[dict[str, Any]]:
        return self.action_json(Action.INVENTORY)

    def describe(self, domain: str, dataset: str, partition: int) -> dict[str, Any]:
        return self.action_json(
            Action.DESCRIBE, {"domain": domain, "dataset": dataset, "partition": partition}
        )

    def commit(self, ingest_id: str) -> list[int]:
        return self.action_json(Action.COMMIT, {"ingest_id": ingest_id})["committed"]

    def abort(self, ingest_id: str) -> int:
        return self.action_json(Action.ABORT, {"ingest_id": ingest_id})["deleted"]

    def drop(self, domain: str, dataset: str) -> int:
        return self.action_json(Action.DROP, {"domain": domain, "dataset": dataset})["deleted"]

    def stats(self) -> dict[str, Any]:
        return self.action_json(Action.STATS)

    def kv_get(self, key: str) -> tuple[bytes, int]:
        _, header, payload = protocol.decode(self.action(Action.KV_GET, {"key": key}))
        return payload, header["version"]

    def kv_put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        return self.action_json(
            Action.KV_PUT, {"key": key, "expected_version": expected_version}, value
        )["version"]

    def kv_delete(self, key: str, expected_version: int | None = None) -> bool:
        return self.action_json(
            Action.KV_DELETE, {"key": key, "expected_version": expected_version}
        )["deleted"]

    def kv_list(self, prefix: str = "", limit: int = 1000) -> list[str]:
        return self.action_json(Action.KV_LIST, {"prefix": prefix, "limit": limit})["keys"]

    # ---- data ----------------------------------------------------------------------------

    def open_put(
        self, kind: str, header: dict[str, Any], schema: pa.Schema
    ) -> tuple[flight.FlightStreamWriter, flight.FlightMetadataReader]:
        descriptor = flight.FlightDescriptor.for_command(protocol.encode(kind, header))
        try:
            return self._client.do_put(descriptor, schema, self._options())
        except (flight.FlightError, OSError) as error:
            raise self.translate(error) from None

    def update_slice(
        self,
        domain: str,
        dataset: str,
        partition: int,
        number: int,
        batch: pa.RecordBatch,
        expected_version: int,
    ) -> int:
        header = {
            "domain": domain,
            "dataset": dataset,
            "partition": partition,
            "slice": number,
            "expected_version": expected_version,
        }
        writer, reader = self.open_put(Put.UPDATE_SLICE, header, batch.schema)
        return self.guard(lambda: _finish_put(writer, reader, [batch]))["version"]

    def scan(
        self,
        domain: str,
        dataset: str,
        partition: int,
        first: int = 0,
        end: int | None = None,
        columns: list[str] | None = None,
    ) -> flight.FlightStreamReader:
        ticket = flight.Ticket(
            protocol.encode(
                Get.SCAN,
                {
                    "domain": domain,
                    "dataset": dataset,
                    "partition": partition,
                    "first": first,
                    "end": end,
                    "columns": columns,
                },
            )
        )
        try:
            return self._client.do_get(ticket, self._options())
        except (flight.FlightError, OSError) as error:
            raise self.translate(error) from None

    def program(
        self, name: str, header: dict[str, Any] | None = None, payload: bytes = b""
    ) -> tuple[pa.Table, dict[str, Any]]:
        """Run a built-in device program; returns its output and its summary."""
        writer, reader = self.exchange(
            Exchange.PROGRAM, {"program": name, **(header or {})}, payload
        )
        batches: list[pa.RecordBatch] = []
        summary: dict[str, Any] = {}
        try:
            while True:
                try:
                    chunk = self.guard(reader.read_chunk)
                except StopIteration:
                    break
                if chunk.data is not None and chunk.data.num_rows:
                    batches.append(chunk.data)
                if chunk.app_metadata is not None:
                    message = protocol.decode_json(chunk.app_metadata.to_pybytes())
                    summary = message.get("summary", {})
        finally:  # also when the device raised: an unclosed exchange complains at exit
            with contextlib.suppress(flight.FlightError, OSError):
                writer.close()
        return pa.Table.from_batches(batches, schema=reader.schema), summary

    def get(self, kind: str, header: dict[str, Any], payload: bytes = b"") -> Any:
        """A do_get stream for any ticket kind (scan, slices, calibration)."""
        ticket = flight.Ticket(protocol.encode(kind, header, payload))
        return self.guard(lambda: self._client.do_get(ticket, self._options()))

    def exchange(self, kind: str, header: dict[str, Any], payload: bytes = b"") -> tuple[Any, Any]:
        """A do_exchange whose request is all in its descriptor: (writer, reader)."""
        descriptor = flight.FlightDescriptor.for_command(protocol.encode(kind, header, payload))
        writer, reader = self.guard(lambda: self._client.do_exchange(descriptor, self._options()))
        self.guard(writer.done_writing)
        return writer, reader

    def guard(self, call: Callable[[], Any]) -> Any:
        """Run a call on this device's streams, translating Flight errors."""
        try:
            return call()
        except (flight.FlightError, OSError) as error:
            raise self.translate(error) from None


def _finish_put(
    writer: flight.FlightStreamWriter,
    reader: flight.FlightMetadataReader,
    batches: list[pa.RecordBatch],
) -> Any:
    for batch in batches:
        writer.write_batch(batch)
    writer.done_writing()
    ack = reader.read()
    writer.close()
    assert ack is not None, "device closed the stream without an answer"
    return protocol.decode_json(ack.to_pybytes())


def finish_put(writer: flight.FlightStreamWriter, reader: flight.FlightMetadataReader) -> Any:
    return _finish_put(writer, reader, [])
