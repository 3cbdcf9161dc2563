"""The device service: one process per emulated drive, an Arrow Flight server over its LMDB store.

It is autonomous: it can list and describe everything it holds (``inventory``, ``describe``)
without the coordinator, and on start it collects the debris of ingests that never committed.
Every request is decoded into its typed message (``quarry.protocol``) before anything runs, so
a malformed one is refused with the message and field named. Work near the data (SQL stages,
gene statistics, capacity kernels...) runs in the one loop of ``quarry.device.loop``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import auth
from quarry.auth.middleware import needed
from quarry.auth.tokens import Role, mint
from quarry.device import admission, calibration, faults, loop
from quarry.device import identity as identity_file
from quarry.device.admission import Admission
from quarry.device.janitor import Janitor
from quarry.device.peers import ask_outcome
from quarry.device.profile import Profile
from quarry.device.unit import lookup
from quarry.errors import CatalogChanged, ClusterError, ProtocolError, QuarryError, QueryError
from quarry.protocol import control, frame, ingest, work
from quarry.protocol.frame import Exchange, Get, Put
from quarry.protocol.message import Message
from quarry.store import naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore
from quarry.store.partition import PartitionMeta

log = logging.getLogger("quarry.device")


def _flight_errors(method: Callable) -> Callable:
    """Turn every error into a Flight error carrying the typed quarry error on the wire."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except flight.FlightError:
            raise
        except QuarryError as error:
            raise flight.FlightServerError(frame.encode_error(error)) from None
        except Exception as error:  # a bug: say so, with the type, rather than hang the client
            log.exception("device error")
            raise flight.FlightServerError(
                frame.encode_error(QuarryError(f"device error: {type(error).__name__}: {error}"))
            ) from None

    return wrapper


def _typed_errors(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A stream's batches; an error raised while they are made reaches the client typed, as
    one raised before the stream began does (``_flight_errors``)."""
    try:
        yield from batches
    except (flight.FlightError, GeneratorExit):
        raise
    except QuarryError as error:
        raise flight.FlightServerError(frame.encode_error(error)) from None
    except Exception as error:
        log.exception("device error in a stream")
        raise flight.FlightServerError(
            frame.encode_error(QuarryError(f"device error: {type(error).__name__}: {error}"))
        ) from None


def heartbeats(
    context: flight.ServerCallContext, request: control.Heartbeat
) -> flight.GeneratorStream:
    """An empty batch every ``period_s`` until the caller goes or ``lifetime_s`` is up (it opens
    another). Data written on a connection is what tells gRPC the caller's pings are not abuse:
    without it, a call that is silent for a few pings (a long computation, an ingest whose
    device answers only at the end) has its connection closed "too_many_pings"."""
    empty = pa.RecordBatch.from_pylist([], schema=control.HEARTBEAT_SCHEMA)

    def beats() -> Iterator[pa.RecordBatch]:
        ends = time.monotonic() + request.lifetime_s
        while time.monotonic() < ends and not context.is_cancelled():
            time.sleep(request.period_s)
            yield empty

    return flight.GeneratorStream(control.HEARTBEAT_SCHEMA, beats())


def summary_message(meta: PartitionMeta) -> control.PartitionSummary:
    return control.PartitionSummary.from_json(meta.summary())


def description_message(meta: PartitionMeta) -> control.PartitionDescription:
    body = meta.to_json()
    return control.PartitionDescription.from_json(
        {"summary": meta.summary(), "slices": body["slices"]}
    )


@dataclass(frozen=True)
class Security:
    """What a device checks callers with, and shows them: the cluster's token secret (None:
    ``--insecure``, nothing checked), its TLS certificate and key, and the CA it trusts when it
    calls another device."""

    secret: bytes | None = None
    tls: tuple[bytes, bytes] | None = None  # certificate, key (PEM)
    ca: bytes | None = None

    @property
    def scheme(self) -> str:
        return "grpc+tls" if self.tls else "grpc"


class Service(flight.FlightServerBase):
    """What every quarry server process shares, a device or a storage server: every call's
    token checked (and TLS), who it is (``hello``, from its identity file and profile), and
    typed actions dispatched to the handlers of ``_actions``."""

    WHAT = "device"  # how errors name it
    # whether it refuses work asked under another generation than its own (a storage
    # server's would need its drives' pulses first: it is pulsed instead)
    CHECKS_GENERATION = False

    def __init__(
        self,
        data: Path,
        profile: Profile,
        location: str,
        name: str | None,
        security: Security,
    ):
        middleware = {auth.NAME: auth.TokenCheck(security.secret)} if security.secret else None
        tls = [security.tls] if security.tls else None
        super().__init__(location, middleware=middleware, tls_certificates=tls)
        self.data = Path(data)
        self.profile = profile
        self.identity = identity_file.load_or_create(self.data, name, profile.name)
        self.name = self.identity["name"]
        self.started_at = time.time()
        # this process's own: a restart (new process) never repeats a generation it gave
        self.boot = uuid.uuid4().hex[:16]
        self._hello_bytes: bytes | None = None

    def _actions(self) -> dict[str, tuple[type[Message], Callable[[Any, bytes], Any]]]:
        raise NotImplementedError

    @_flight_errors
    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        kind, header, payload = frame.decode(action.body.to_pybytes())
        if kind != action.type:
            raise ProtocolError(f"action type {action.type!r} does not match its body ({kind!r})")
        auth.authorize(context, kind, needed(kind, header))
        handlers = self._actions()
        if kind not in handlers:
            raise ProtocolError(
                f"unknown action {kind!r}; this {self.WHAT} knows {sorted(handlers)}"
            )
        request_class, handler = handlers[kind]
        reply = handler(request_class.from_json(header), payload)
        return iter([reply if isinstance(reply, bytes) else reply.to_bytes()])

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(str(a), "") for a in frame.Action]

    @_flight_errors
    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        """A work request, decoded and authorized, run by ``_work``."""
        kind, header, payload = frame.decode(descriptor.command)
        if kind != Exchange.WORK:
            raise ProtocolError(f"unknown exchange {kind!r}")
        request = work.WorkRequest.from_json(header)
        auth.authorize(context, f"run {request.unit}", lookup(request.unit).ROLE)
        self._work(request, payload, writer)

    def _work(
        self, request: work.WorkRequest, payload: bytes, writer: flight.MetadataRecordBatchWriter
    ) -> None:
        raise NotImplementedError

    def _load(self, request: control.Load, payload: bytes) -> control.LoadStarted:
        started = self.emulator.start_load(request.cpu, request.seconds)
        return control.LoadStarted(started["cpu"], started["seconds"], self.name)

    def _admitted(self) -> dict[str, int]:
        """``StatsReply``'s account of the exchanges it admits (``admission``)."""
        admitted = self.admission.status()
        return {
            "running": admitted["running"] + admitted["running_small"],
            "exchanges_max": admitted["exchanges_max"],
            "admitted": admitted["admitted"],
            "refused": admitted["refused"],
        }

    def _hello(self, request: control.Hello, payload: bytes) -> bytes:
        if self._hello_bytes is None:  # who it is does not change while it runs
            self._hello_bytes = self._hello_reply().to_bytes()
        return self._hello_bytes

    def _hello_reply(self) -> control.HelloReply:
        return control.HelloReply(
            protocol=frame.PROTOCOL_VERSION,
            id=self.identity["id"],
            name=self.name,
            profile=control.ProfileInfo.from_json(self.profile.to_json()),
            pid=os.getpid(),
            data=str(self.data),
            started_at=self.started_at,
            role=self.WHAT,
            checks_generation=self.CHECKS_GENERATION,
        )


def write_ready(ready_file: str | Path, address: str, port: int, name: str) -> None:
    """Say where a server process listens, atomically (its starter waits for the file)."""
    import json

    ready = Path(ready_file)
    tmp = ready.with_suffix(".tmp")
    body = {"port": port, "pid": os.getpid(), "name": name, "address": address}
    tmp.write_text(json.dumps(body))
    tmp.replace(ready)


class DeviceServer(Service):
    CHECKS_GENERATION = True

    def __init__(
        self,
        data: Path,
        profile: Profile,
        location: str,
        name: str | None = None,
        security: Security = Security(),
    ):
        super().__init__(data, profile, location, name, security)
        self.store = KeyValueStore(self.data / "kv", kv_bytes_max=profile.kv_bytes_max)
        from quarry.device.emulation import Emulator

        self.admission = Admission(
            self.name, admission.exchanges_for(profile.cores), admission.queued_bytes_default()
        )
        self.runtime = loop.Runtime(self.store, Emulator(profile), self.name, self.admission)
        self._ingesting = 0  # ingest streams open now (``StatsReply.ingesting``)
        self._ingesting_lock = threading.Lock()
        # Pending ingests it took part in before it stopped: committed or aborted as their
        # deciders say, then watched while their coordinators renew them.
        peer_token = mint(security.secret, Role.DEVICE) if security.secret else None
        self.janitor = Janitor(
            self.store,
            self.name,
            ask=functools.partial(ask_outcome, token=peer_token, root_ca=security.ca),
        )
        self.janitor.start()
        self._inventory_cache: tuple[int, bytes] | None = None

    @property
    def emulator(self):
        return self.runtime.emulator

    # ---- actions -------------------------------------------------------------------------

    def _actions(self) -> dict[str, tuple[type[Message], Callable[[Any, bytes], Any]]]:
        return {
            control.Hello.KIND: (control.Hello, self._hello),
            control.Inventory.KIND: (control.Inventory, self._inventory),
            control.Pulse.KIND: (control.Pulse, self._pulse),
            control.PartitionRef.KIND: (control.PartitionRef, self._describe),
            ingest.Commit.KIND: (ingest.Commit, self._commit),
            ingest.Abort.KIND: (
                ingest.Abort,
                lambda r, p: control.Deleted(partitions.abort(self.store, r.ingest_id)),
            ),
            ingest.Renew.KIND: (
                ingest.Renew,
                lambda r, p: ingest.Renewed(partitions.renew(self.store, r.ingest_id, r.lease_s)),
            ),
            ingest.OutcomeRequest.KIND: (
                ingest.OutcomeRequest,
                lambda r, p: ingest.OutcomeReply(
                    ingest.Outcome(partitions.outcome(self.store, r.ingest_id, time.time()))
                ),
            ),
            ingest.Drop.KIND: (
                ingest.Drop,
                lambda r, p: control.Deleted(partitions.drop(self.store, r.domain, r.dataset)),
            ),
            control.Stats.KIND: (control.Stats, self._stats),
            control.Load.KIND: (control.Load, self._load),
            control.LoadStatusRequest.KIND: (
                control.LoadStatusRequest,
                lambda r, p: control.LoadStatus(**self.emulator.load()),
            ),
            control.Calibrate.KIND: (control.Calibrate, self._calibrate),
            control.KvGet.KIND: (control.KvGet, self._kv_get),
            control.KvPut.KIND: (
                control.KvPut,
                lambda r, p: control.Version(self.store.put(r.key, p, r.expected_version)),
            ),
            control.KvDelete.KIND: (
                control.KvDelete,
                lambda r, p: control.Deleted(int(self.store.delete(r.key, r.expected_version))),
            ),
            control.KvList.KIND: (
                control.KvList,
                lambda r, p: control.KvKeys(self.store.list(r.prefix, r.limit)),
            ),
        }

    def _inventory(self, request: control.Inventory, payload: bytes) -> bytes:
        """Every committed partition, and the generation it holds under. Changed only by
        commit and drop: the encoded answer is kept until the store's catalog changes."""
        before = self.store.writes()
        cached = self._inventory_cache
        if cached is not None and cached[0] == before:
            return cached[1]
        summaries = [
            control.PartitionSummary.from_json(s) for s in partitions.inventory(self.store)
        ]
        whole = self.store.writes() == before and before % 2 == 0  # no write began or was under way
        generation = self._generation(before) if whole else ""
        encoded = control.InventoryReply(summaries, generation=generation).to_bytes()
        if whole:
            self._inventory_cache = (before, encoded)
        return encoded

    def _generation(self, writes: int) -> str:
        """Equal twice only if the store saw no write in between, in this same process."""
        return f"{self.boot}:{writes}"

    def _pulse(self, request: control.Pulse, payload: bytes) -> control.PulseReply:
        load = control.LoadStatus(**self.emulator.load())
        return control.PulseReply(self._generation(self.store.writes()), load)

    def _commit(self, request: ingest.Commit, payload: bytes) -> ingest.Committed:
        faults.hit(self.name, "commit")
        return ingest.Committed(partitions.commit(self.store, request.ingest_id, self.name))

    def _describe(
        self, request: control.PartitionRef, payload: bytes
    ) -> control.PartitionDescription:
        meta = partitions.read_meta(self.store, request.domain, request.dataset, request.partition)
        return description_message(meta)

    def _stats(self, request: control.Stats, payload: bytes) -> control.StatsReply:
        stats = self.store.stats()
        return control.StatsReply(
            keys=stats["keys"],
            file_bytes=stats["file_bytes"],
            partitions=len(self.store.list(partitions.CATALOG_PREFIX)),
            pending_partitions=sum(
                1 for k in self.store.list(naming.PENDING_PREFIX) if k.count("/") == 3
            ),
            ingesting=self._ingesting,
            **self._admitted(),
        )

    def _calibrate(self, request: control.Calibrate, payload: bytes) -> control.CalibrateReply:
        if request.part is control.CalibratePart.KERNEL:
            return control.CalibrateReply(
                kernel_s=calibration.time_kernel(self.emulator, request.repeat)
            )
        return control.CalibrateReply(
            internal_bytes_per_s=calibration.time_internal_reads(self.store, self.emulator)
        )

    def _kv_get(self, request: control.KvGet, payload: bytes) -> bytes:
        value, version = self.store.get(request.key)
        return control.KvValue(version).encode(value)

    # ---- streams -------------------------------------------------------------------------

    @_flight_errors
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        kind, header, _ = frame.decode(descriptor.command)
        auth.authorize(context, kind)
        if kind == Put.PARTITION:
            with self._ingesting_lock:
                self._ingesting += 1
            try:
                reply: Message = self._put_partition(ingest.PutPartition.from_json(header), reader)
            finally:
                with self._ingesting_lock:
                    self._ingesting -= 1
        elif kind == Put.UPDATE_SLICE:
            reply = self._update_slice(ingest.UpdateSlice.from_json(header), reader)
        else:
            raise ProtocolError(f"unknown put {kind!r}")
        writer.write(pa.py_buffer(reply.to_bytes()))

    def _put_partition(
        self, request: ingest.PutPartition, reader: flight.MetadataRecordBatchReader
    ) -> ingest.PartitionWritten:
        meta = partitions.PartitionMeta(
            domain=naming.check_identifier("domain", request.domain),
            dataset=naming.check_identifier("dataset", request.dataset),
            partition=request.partition,
            ingest=request.ingest.to_json(),
            schema=reader.schema,
            compression=request.compression,
            metadata=request.metadata,
            hints=request.hints,
            device=self.name,
        )
        writer = partitions.PartitionWriter(
            self.store, meta, slice_rows=request.slice_rows, lease_s=request.lease_s
        )
        try:
            for chunk in reader:
                if chunk.data is not None and chunk.data.num_rows:
                    writer.write(chunk.data)
            written = writer.finish()
            faults.hit(self.name, "prepare")
        except BaseException:
            # The stream broke (client gone) or the rows were bad: leave nothing pending behind.
            partitions.abort(self.store, request.ingest.id)
            raise
        return ingest.PartitionWritten(
            written.partition, written.rows, len(written.slices), written.bytes_stored
        )

    def _update_slice(
        self, request: ingest.UpdateSlice, reader: flight.MetadataRecordBatchReader
    ) -> control.Version:
        table = reader.read_all()
        batch = (
            table.combine_chunks().to_batches()[0]
            if table.num_rows
            else pa.RecordBatch.from_pylist([], schema=table.schema)
        )
        version = partitions.update_slice(
            self.store,
            request.domain,
            request.dataset,
            request.partition,
            request.slice,
            batch,
            request.expected_version,
        )
        return control.Version(version)

    def _work(
        self, request: work.WorkRequest, payload: bytes, writer: flight.MetadataRecordBatchWriter
    ) -> None:
        self._check_generation(request.generation)
        loop.run_work(self.runtime, request, payload, writer)  # admitted inside, once pruned

    def _check_generation(self, expected: str) -> None:
        """Refuse work planned on a catalog this device no longer matches, before any of it."""
        if expected and expected != self._generation(self.store.writes()):
            raise CatalogChanged(
                f"device {self.name}: what it holds changed since the coordinator read its "
                "catalog; read it again and run the query again"
            )

    @_flight_errors
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        kind, header, payload = frame.decode(ticket.ticket)
        auth.authorize(context, kind)
        if kind == Get.HEARTBEAT:
            return heartbeats(context, control.Heartbeat.from_json(header))
        if kind == Get.CALIBRATION:
            request = work.CalibrationTransfer.from_json(header)
            schema, batches = calibration.calibration_stream(self.emulator, request.bytes)
        elif kind == Get.SLICES:
            request = work.SliceRequest.from_json(header)
            schema, batches = loop.fetch_slices(self.runtime, request, payload)
        elif kind == Get.SCAN:
            scan = work.ScanRequest.from_json(header)
            self._check_generation(scan.generation)
            schema, scanned, small = self._scan(scan)  # nothing read yet
            batches = self.admission.stream(scanned, self.admission.enter(small), small)
        else:
            raise ProtocolError(f"unknown ticket {kind!r}")
        return flight.GeneratorStream(schema, _typed_errors(batches))

    def _scan(self, request: work.ScanRequest) -> tuple[pa.Schema, Iterable[pa.RecordBatch], bool]:
        """Raw slices, through the profile's internal and external bandwidth limits, read as
        they are taken; and whether they are small work (admission's small lane: a nation
        table does not wait behind lineitem's streams)."""
        meta = self.runtime.metas.read(
            self.store, request.domain, request.dataset, request.partition
        )
        columns = list(request.columns) if request.columns is not None else None
        unknown = sorted(set(columns or ()) - set(meta.schema.names))
        if unknown:
            raise QueryError(
                f"{request.domain}/{request.dataset} has no column {', '.join(unknown)} "
                f"(its columns: {', '.join(meta.schema.names)})"
            )
        schema = (
            meta.schema if columns is None else pa.schema([meta.schema.field(c) for c in columns])
        )
        end = len(meta.slices) if request.end is None else min(request.end, len(meta.slices))
        numbers = range(request.first, end)
        small = _at_most(meta, numbers, columns, admission.SMALL_BYTES_MAX)
        if request.stored and all(meta.slices[n].columns is not None for n in numbers):
            return (*loop.stored_slices(self.runtime, meta, numbers, schema.names), small)

        def batches() -> Iterator[pa.RecordBatch]:
            for number in range(request.first, end):
                self.emulator.read(partitions.read_bytes(meta, number, columns))
                batch = partitions.read_slice(self.store, meta, number, columns)
                self.emulator.ship(pa.ipc.get_record_batch_size(batch))
                yield batch

        return schema, batches(), small


def _at_most(meta: PartitionMeta, numbers: range, columns: list[str] | None, limit: int) -> bool:
    """Whether slices ``numbers`` hold at most ``limit`` stored bytes of ``columns`` (counted
    until they pass it: a partition of lineitem has thousands of slices)."""
    read = 0
    for number in numbers:
        read += partitions.read_bytes(meta, number, columns)
        if read > limit:
            return False
    return True


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve_with(
    data: str | Path,
    port: int = 0,
    profile: str = "host",
    host: str = "127.0.0.1",
    name: str | None = None,
    ready_file: str | Path | None = None,
    profiles: str | None = None,
    credentials: str | Path | None = None,
    tls: bool = False,
    insecure: bool = False,
) -> None:
    """``quarry device serve``'s options: the credentials read, the profile found, then
    ``serve``. Shared by the CLI and ``python -m quarry.device`` (the lean entry point local
    clusters start, which imports no coordinator)."""
    import logging

    from quarry.device.profile import get_profile

    security = security_of(credentials, tls, insecure)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(data, get_profile(profile, profiles), host, port, name, ready_file, security)


def security_of(credentials: str | Path | None, tls: bool, insecure: bool) -> Security:
    """What a server (device or storage server) checks callers with, from its options."""
    from quarry.auth.credentials import Credentials, read_private

    if credentials is None and not insecure:
        raise ClusterError(
            "a device checks every call's token: give --credentials FOLDER (made by quarry up), "
            "or --insecure for a loopback experiment"
        )
    if credentials is None:
        if tls:
            raise ClusterError("--tls needs --credentials FOLDER (its certificate and key)")
        return Security()
    found = Credentials(Path(credentials))
    return Security(
        secret=found.secret(),
        tls=(read_private(found.cert_file), read_private(found.key_file)) if tls else None,
        ca=read_private(found.ca_file) if tls else None,
    )


def serve(
    data: str | Path,
    profile: Profile,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str | None = None,
    ready_file: str | Path | None = None,
    security: Security = Security(),
) -> None:
    """Run a device until it is stopped (SIGTERM / SIGINT). Anywhere but loopback it needs
    TLS: tokens must not cross a network in the clear."""
    if host not in LOOPBACK and security.tls is None:
        raise ClusterError(
            f"a device listening on {host} must use TLS (--tls-cert, --tls-key): only loopback "
            "may be plain"
        )
    scheme = security.scheme
    server = DeviceServer(Path(data), profile, f"{scheme}://{host}:{port}", name, security)
    if ready_file is not None:
        write_ready(ready_file, f"{scheme}://{host}:{server.port}", server.port, server.name)
    log.info("device %s (%s) listening on %s:%d", server.name, profile.name, host, server.port)
    server.serve()
