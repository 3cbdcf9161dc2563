"""The device service: one process per emulated drive, an Arrow Flight server over its LMDB store.

It is autonomous: it can list and describe everything it holds (``inventory``, ``describe``)
without the coordinator, and on start it collects the debris of ingests that never committed.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import protocol
from quarry.device import calibration, programs, query
from quarry.device import identity as identity_file
from quarry.device.controller import Controllers
from quarry.device.emulation import Emulator
from quarry.device.profile import Profile
from quarry.errors import QuarryError
from quarry.protocol import Action, Exchange, Get, Put
from quarry.store import naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore

log = logging.getLogger("quarry.device")

KV_LIST_LIMIT_MAX = 100_000


def _flight_errors(method: Callable) -> Callable:
    """Turn every error into a Flight error carrying the typed quarry error on the wire."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except flight.FlightError:
            raise
        except QuarryError as error:
            raise flight.FlightServerError(protocol.encode_error(error)) from None
        except Exception as error:  # a bug: say so, with the type, rather than hang the client
            log.exception("device error")
            raise flight.FlightServerError(
                protocol.encode_error(QuarryError(f"device error: {type(error).__name__}: {error}"))
            ) from None

    return wrapper


class DeviceServer(flight.FlightServerBase):
    def __init__(self, data: Path, profile: Profile, location: str, name: str | None = None):
        super().__init__(location)
        self.data = Path(data)
        self.profile = profile
        self.identity = identity_file.load_or_create(self.data, name, profile.name)
        self.name = self.identity["name"]
        self.store = KeyValueStore(self.data / "kv", kv_bytes_max=profile.kv_bytes_max)
        self.emulator = Emulator(profile)
        self.controllers = Controllers()
        self.parked = query.Parked()
        collected = partitions.collect_debris(self.store)
        if collected:
            log.warning("%s: collected %d key-values of unfinished ingests", self.name, collected)
        self.started_at = time.time()

    # ---- actions -------------------------------------------------------------------------

    @_flight_errors
    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        kind, header, payload = protocol.decode(action.body.to_pybytes())
        if kind != action.type:
            raise QuarryError(f"action type {action.type!r} does not match its body ({kind!r})")
        handler = self._actions().get(kind)
        if handler is None:
            raise QuarryError(
                f"unknown action {kind!r}; this device knows {sorted(self._actions())}"
            )
        result = handler(header, payload)
        if isinstance(result, bytes):
            return iter([result])
        return iter([protocol.encode_json(result)])

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(str(a), "") for a in Action]

    def _actions(self) -> dict[str, Callable[[dict[str, Any], bytes], Any]]:
        return {
            Action.HELLO: self._hello,
            Action.INVENTORY: lambda h, p: partitions.inventory(self.store),
            Action.DESCRIBE: self._describe,
            Action.COMMIT: lambda h, p: {
                "committed": partitions.commit(self.store, h["ingest_id"], self.name)
            },
            Action.ABORT: lambda h, p: {"deleted": partitions.abort(self.store, h["ingest_id"])},
            Action.DROP: lambda h, p: {
                "deleted": partitions.drop(self.store, h["domain"], h["dataset"])
            },
            Action.STATS: self._stats,
            Action.LOAD: lambda h, p: {
                **self.emulator.start_load(float(h["cpu"]), float(h.get("seconds", 60.0))),
                "device": self.name,
            },
            Action.STATUS_LOAD: lambda h, p: self.emulator.load(),
            Action.CALIBRATE: lambda h, p: (
                {"kernel_s": calibration.time_kernel(self.emulator, int(h.get("repeat", 1)))}
                if h.get("part") == "kernel"
                else {
                    "internal_bytes_per_s": calibration.time_internal_reads(
                        self.store, self.emulator
                    )
                }
            ),
            Action.KV_GET: self._kv_get,
            Action.KV_PUT: self._kv_put,
            Action.KV_DELETE: lambda h, p: {
                "deleted": self.store.delete(h["key"], h.get("expected_version"))
            },
            Action.KV_LIST: lambda h, p: {
                "keys": self.store.list(
                    h.get("prefix", ""), min(int(h.get("limit", 1000)), KV_LIST_LIMIT_MAX)
                )
            },
        }

    def _hello(self, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "id": self.identity["id"],
            "name": self.name,
            "profile": self.profile.to_json(),
            "pid": os.getpid(),
            "data": str(self.data),
            "started_at": self.started_at,
        }

    def _describe(self, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        meta = partitions.read_meta(
            self.store, header["domain"], header["dataset"], int(header["partition"])
        )
        return meta.to_json()

    def _stats(self, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        stats = self.store.stats()
        stats["pending_partitions"] = sum(
            1 for k in self.store.list(naming.PENDING_PREFIX) if k.count("/") == 3
        )
        stats["partitions"] = len(self.store.list(partitions.CATALOG_PREFIX))
        return stats

    def _kv_get(self, header: dict[str, Any], payload: bytes) -> bytes:
        value, version = self.store.get(header["key"])
        return protocol.encode("kv_value", {"version": version}, value)

    def _kv_put(self, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        return {"version": self.store.put(header["key"], payload, header.get("expected_version"))}

    # ---- streams -------------------------------------------------------------------------

    @_flight_errors
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        kind, header, _ = protocol.decode(descriptor.command)
        if kind == Put.PARTITION:
            result = self._put_partition(header, reader)
        elif kind == Put.UPDATE_SLICE:
            table = reader.read_all()
            batch = (
                table.combine_chunks().to_batches()[0]
                if table.num_rows
                else pa.RecordBatch.from_pylist([], schema=table.schema)
            )
            version = partitions.update_slice(
                self.store,
                header["domain"],
                header["dataset"],
                int(header["partition"]),
                int(header["slice"]),
                batch,
                int(header["expected_version"]),
            )
            result = {"version": version}
        else:
            raise QuarryError(f"unknown put {kind!r}")
        writer.write(pa.py_buffer(protocol.encode_json(result)))

    def _put_partition(
        self, header: dict[str, Any], reader: flight.MetadataRecordBatchReader
    ) -> dict[str, Any]:
        meta = partitions.PartitionMeta(
            domain=naming.check_identifier("domain", header["domain"]),
            dataset=naming.check_identifier("dataset", header["dataset"]),
            partition=int(header["partition"]),
            ingest=header["ingest"],
            schema=reader.schema,
            compression=header.get("compression", "none"),
            metadata=header.get("metadata", {}),
            hints=header.get("hints", {}),
            device=self.name,
        )
        writer = partitions.PartitionWriter(self.store, meta)
        try:
            for chunk in reader:
                if chunk.data is not None and chunk.data.num_rows:
                    writer.write(chunk.data)
            written = writer.finish()
        except BaseException:
            # The stream broke (client gone) or the rows were bad: leave nothing pending behind.
            partitions.abort(self.store, meta.ingest["id"])
            raise
        return {
            "partition": written.partition,
            "rows": written.rows,
            "slices": len(written.slices),
            "bytes_stored": written.bytes_stored,
        }

    @_flight_errors
    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        kind, header, payload = protocol.decode(descriptor.command)
        if kind == Exchange.QUERY:
            query.run_query(
                self.store, self.emulator, header, payload, writer, self.controllers, self.parked
            )
        elif kind == Exchange.PROGRAM:
            self._run_program(header, payload, writer)
        else:
            raise QuarryError(f"unknown exchange {kind!r}")

    def _run_program(
        self, header: dict[str, Any], payload: bytes, writer: flight.MetadataRecordBatchWriter
    ) -> None:
        started, cpu_started = time.perf_counter(), query.cpu_seconds()
        context = programs.ProgramContext(self.store, self.emulator, self.name)
        result = programs.lookup(header["program"])(context, header, payload)
        writer.begin(result.schema)
        bytes_shipped = 0
        for batch in result.batches:
            size = pa.ipc.get_record_batch_size(batch)
            self.emulator.ship(size)
            bytes_shipped += size
            writer.write_batch(batch)
        summary = {
            **result.summary,
            "device": self.name,
            "bytes_read": context.bytes_read,
            "rows_read": context.rows_read,
            "bytes_shipped": bytes_shipped,
            "device_cpu_s": query.cpu_seconds() - cpu_started,
            "wall_s": time.perf_counter() - started,
        }
        writer.write_metadata(pa.py_buffer(protocol.encode_json({"summary": summary})))

    @_flight_errors
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        kind, header, payload = protocol.decode(ticket.ticket)
        if kind == Get.CALIBRATION:
            schema, batches = calibration.calibration_stream(self.emulator, int(header["bytes"]))
            return flight.GeneratorStream(schema, batches)
        if kind == Get.SLICES:
            schema, batches = query.scan_stage(
                self.store, self.emulator, header, payload, self.parked
            )
            return flight.GeneratorStream(schema, batches)
        if kind != Get.SCAN:
            raise QuarryError(f"unknown ticket {kind!r}")
        meta = partitions.read_meta(
            self.store, header["domain"], header["dataset"], int(header["partition"])
        )
        columns = header.get("columns")
        schema = (
            meta.schema if columns is None else pa.schema([meta.schema.field(c) for c in columns])
        )
        first, end = int(header.get("first", 0)), header.get("end")
        return flight.GeneratorStream(schema, self._scan(meta, first, end, columns))

    def _scan(
        self, meta: partitions.PartitionMeta, first: int, end: int | None, columns: list[str] | None
    ) -> Iterator[pa.RecordBatch]:
        """Raw slices, through the profile's internal and external bandwidth limits."""
        end = len(meta.slices) if end is None else min(int(end), len(meta.slices))
        for number in range(first, end):
            self.emulator.read(meta.slices[number].bytes_stored)
            batch = partitions.read_slice(self.store, meta, number, columns)
            self.emulator.ship(pa.ipc.get_record_batch_size(batch))
            yield batch


def serve(
    data: str | Path,
    profile: Profile,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str | None = None,
    ready_file: str | Path | None = None,
) -> None:
    """Run a device until it is stopped (SIGTERM / SIGINT)."""
    server = DeviceServer(Path(data), profile, f"grpc://{host}:{port}", name)
    if ready_file is not None:
        import json

        ready = Path(ready_file)
        tmp = ready.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "port": server.port,
                    "pid": os.getpid(),
                    "name": server.name,
                    "address": f"grpc://{host}:{server.port}",
                }
            )
        )
        tmp.replace(ready)
    log.info("device %s (%s) listening on %s:%d", server.name, profile.name, host, server.port)
    server.serve()
