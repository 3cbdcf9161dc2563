"""The storage server: one process in front of its drives (DESIGN §1, POLARDB §2, Skytether §4).

To its upstream (the host, or another server) it is a device: it answers the device protocol
(``docs/protocol.md``) over the union of its drives' partitions. To its drives it is a
coordinator: it holds their clients, sends each the share of a work request for the partitions
it holds (``quarry.server.work``), and completes what they hand back with its own CPU, under
its profile (this process's host profile: its cores, compute factor, and ingress from the
drives). Ingest passes through it: each partition it is sent lands on one of its drives (its
drives in turn, per ingest, so a dataset spreads over all of them), and commit, abort,
renew and drop go to all of them. A server keeps no data of its own: like a device it can be
asked for everything it serves, because its drives can.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import auth, tracing
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.membership.device_client import DeviceClient, _finish_put
from quarry.coordinator.membership.membership import Membership
from quarry.cost.model import DeviceFigures, HostFigures
from quarry.device import admission, calibration
from quarry.device.admission import Admission
from quarry.device.emulation import Emulator
from quarry.device.profile import Profile
from quarry.device.server import (
    Security,
    Service,
    _flight_errors,
    _typed_errors,
    heartbeats,
    write_ready,
)
from quarry.device.unit import set_host_profile
from quarry.errors import DeviceUnavailable, ProtocolError, QueryError
from quarry.plan.capabilities import Capabilities, of_profile
from quarry.protocol import control, frame, ingest, work
from quarry.protocol.control import SERVER_ROLE
from quarry.protocol.frame import Get, Put
from quarry.protocol.message import Message
from quarry.server import work as server_work

log = logging.getLogger("quarry.server")
INGESTS_REMEMBERED_MAX = 1024  # ingests whose next drive a server remembers
DRIVE_DOWN = "down"  # a drive's part of its server's generation while it does not answer


class StorageServer(Service):
    WHAT = SERVER_ROLE

    def __init__(
        self,
        data: Path,
        profile: Profile,
        location: str,
        drives: tuple[DeviceSpec, ...],
        name: str | None = None,
        security: Security = Security(),
    ):
        Path(data).mkdir(parents=True, exist_ok=True)
        super().__init__(data, profile, location, name, security)
        self.drives = Membership(drives)
        self.emulator = Emulator(profile)  # its own link to the host
        set_host_profile(profile)  # completions in its slots; drives' streams through its ingress
        self.admission = Admission(
            self.name, admission.exchanges_for(profile.cores), admission.queued_bytes_default()
        )
        self._holders: dict[tuple[str, str, int], str] = {}
        self._turns: dict[str, int] = {}  # per ingest, the partitions placed so far
        self._profiles: dict[str, control.ProfileInfo] = {}
        self._sizes: dict[tuple[str, str, int], int] = {}  # bytes stored per partition
        self._compressed: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()

    # ---- where a partition is -------------------------------------------------------------

    def ordered_drives(self) -> list[DeviceClient]:
        return [self.drives.devices[name] for name in sorted(self.drives.devices)]

    def holder(self, domain: str, dataset: str, partition: int) -> DeviceClient:
        """The drive that holds a committed partition (asked of the drives when not known)."""
        key = (domain, dataset, partition)
        with self._lock:
            name = self._holders.get(key)
        if name is None:
            self._learn()
            with self._lock:
                name = self._holders.get(key)
        if name is None:
            raise QueryError(
                f"storage server {self.name} has no drive holding partition {partition} of "
                f"{domain}/{dataset}"
            )
        return self.drives.devices[name]

    def compressed(self, domain: str, dataset: str) -> bool:
        """Whether a dataset's slices are compressed (its raw ranges then come as stored, and
        this server decompresses them)."""
        with self._lock:
            return self._compressed.get((domain, dataset), False)

    def drive_profile(self, drive: DeviceClient) -> control.ProfileInfo:
        """A drive's profile, as it reports it (asked once)."""
        with self._lock:
            known = self._profiles.get(drive.name)
        if known is None:
            known = drive.hello().profile
            with self._lock:
                self._profiles[drive.name] = known
        return known

    def capabilities(self, drive: DeviceClient) -> Capabilities:
        """What a drive evaluates of a sub-plan (its profile's class)."""
        return of_profile(self.drive_profile(drive).capabilities)

    def figures(self) -> HostFigures:
        """This server as the completer of its drives' work: its cores, compute factor and
        ingress from them (its profile's)."""
        return HostFigures(
            cores=self.profile.cores or 1,
            compute_factor=self.profile.compute_factor,
            link_bytes_per_s=self.profile.external_bytes_per_s,
        )

    def drive_figures(
        self, domain: str, dataset: str, partitions: tuple[int, ...]
    ) -> list[DeviceFigures]:
        """The drives holding ``partitions`` as the cost model sees them: the bytes they hold
        of these partitions, their profiles (drives are priced by profile one level down) and
        their load now."""
        stored: dict[str, int] = {}
        count: dict[str, int] = {}
        for partition in partitions:
            name = self.holder(domain, dataset, partition).name
            with self._lock:
                size = self._sizes.get((domain, dataset, partition), 0)
            stored[name] = stored.get(name, 0) + size
            count[name] = count.get(name, 0) + 1
        figures = []
        for name in sorted(stored):
            drive = self.drives.devices[name]
            profile = self.drive_profile(drive)
            figures.append(
                DeviceFigures(
                    name=name,
                    stored_bytes=stored[name],
                    partitions=count[name],
                    compute_factor=profile.compute_factor,
                    cores=profile.cores,
                    internal_bytes_per_s=profile.internal_bytes_per_s,
                    external_bytes_per_s=profile.external_bytes_per_s,
                    cpu_busy=drive.load_status().cpu_busy,
                    handbacks=count[name],  # at least a fetch per partition handed back
                )
            )
        return figures

    def _learn(self) -> tuple[list[control.PartitionSummary], list[str], str]:
        """Every live drive's partitions, the drives that do not answer, and the generation
        this holds under; remembers which drive holds which partition."""
        found: list[control.PartitionSummary] = []
        down: list[str] = []
        generations: dict[str, str] = {}
        holders: dict[tuple[str, str, int], str] = {}
        compressed: dict[tuple[str, str], bool] = {}
        sizes: dict[tuple[str, str, int], int] = {}
        for drive in self.ordered_drives():
            try:
                reply = drive.inventory_reply()
            except DeviceUnavailable as error:  # its partitions are served by replicas
                log.warning("storage server %s: %s", self.name, error)
                down.append(drive.name)
                generations[drive.name] = DRIVE_DOWN
                continue
            generations[drive.name] = reply.generation
            for summary in reply.partitions:
                key = (summary.domain, summary.dataset, summary.partition)
                holders[key] = drive.name
                sizes[key] = summary.bytes_stored
                compressed[(summary.domain, summary.dataset)] = summary.compression != "none"
                found.append(summary)
        with self._lock:
            self._holders = holders
            self._compressed = compressed
            self._sizes = sizes
        return found, down, self._generation(generations)

    def _generation(self, drives: dict[str, str]) -> str:
        """A server holds what its drives hold: its generation is theirs, each named ("" when
        one cannot tell)."""
        if any(generation == "" for generation in drives.values()):
            return ""
        return self.boot + "|" + ",".join(f"{name}={drives[name]}" for name in sorted(drives))

    def _pulse(self, request: control.Pulse, payload: bytes) -> control.PulseReply:
        generations: dict[str, str] = {}
        for name, answer in self.drives.each(_drive_pulse).items():
            generations[name] = DRIVE_DOWN if isinstance(answer, Exception) else answer
        load = control.LoadStatus(**self.emulator.load())
        return control.PulseReply(self._generation(generations), load)

    def _placed(self, request: ingest.PutPartition) -> DeviceClient:
        """Where a new partition goes: the drives of this server in turn, per ingest, so each
        ingest spreads over all of them whatever partition numbers the host deals this server."""
        drives = self.ordered_drives()
        with self._lock:
            turn = self._turns.get(request.ingest.id, 0)
            self._turns[request.ingest.id] = turn + 1
            while len(self._turns) > INGESTS_REMEMBERED_MAX:
                self._turns.pop(next(iter(self._turns)))
        return drives[turn % len(drives)]

    def _all(self, call: Callable[[DeviceClient], Any]) -> list[Any]:
        return [call(drive) for drive in self.ordered_drives()]

    # ---- actions ----------------------------------------------------------------------------

    def _hello_reply(self) -> control.HelloReply:
        """Its own, with the drives behind it (a drive that does not answer counts as one)."""
        info = self.drives.info
        drives = sum(info[name].drives if name in info else 1 for name in self.drives.devices)
        return replace(super()._hello_reply(), drives=max(1, drives))

    def _actions(self) -> dict[str, tuple[type[Message], Callable[[Any, bytes], Any]]]:
        first = self.ordered_drives()[0]  # the server's own keys live on its first drive
        return {
            control.Hello.KIND: (control.Hello, self._hello),
            control.Inventory.KIND: (control.Inventory, self._inventory),
            control.Pulse.KIND: (control.Pulse, self._pulse),
            control.PartitionRef.KIND: (control.PartitionRef, self._describe),
            ingest.Commit.KIND: (
                ingest.Commit,
                lambda r, p: ingest.Committed(
                    sorted(n for got in self._all(lambda d: d.commit(r.ingest_id)) for n in got)
                ),
            ),
            ingest.Abort.KIND: (
                ingest.Abort,
                lambda r, p: control.Deleted(sum(self._all(lambda d: d.abort(r.ingest_id)))),
            ),
            ingest.Renew.KIND: (ingest.Renew, self._renew),
            ingest.OutcomeRequest.KIND: (ingest.OutcomeRequest, self._outcome),
            ingest.Drop.KIND: (
                ingest.Drop,
                lambda r, p: control.Deleted(sum(self._all(lambda d: d.drop(r.domain, r.dataset)))),
            ),
            control.Stats.KIND: (control.Stats, self._stats),
            control.Load.KIND: (control.Load, self._load),
            control.LoadStatusRequest.KIND: (
                control.LoadStatusRequest,
                lambda r, p: control.LoadStatus(**self.emulator.load()),
            ),
            control.Calibrate.KIND: (control.Calibrate, self._calibrate),
            control.QuarantineClear.KIND: (  # its drives' quarantines: they run the stages
                control.QuarantineClear,
                lambda r, p: control.QuarantineCleared(
                    sum(self._all(lambda d: d.ask(r, control.QuarantineCleared).cleared))
                ),
            ),
            control.KvGet.KIND: (control.KvGet, lambda r, p: first.action(r)),
            control.KvPut.KIND: (control.KvPut, lambda r, p: first.action(r, p)),
            control.KvDelete.KIND: (control.KvDelete, lambda r, p: first.action(r)),
            control.KvList.KIND: (control.KvList, lambda r, p: first.action(r)),
        }

    def _inventory(self, request: control.Inventory, payload: bytes) -> control.InventoryReply:
        """The union of the drives' partitions, each as this server's to its upstream."""
        found, down, generation = self._learn()
        return control.InventoryReply(
            [replace(s, device=self.name) for s in found], tuple(down), generation
        )

    def _describe(
        self, request: control.PartitionRef, payload: bytes
    ) -> control.PartitionDescription:
        drive = self.holder(request.domain, request.dataset, request.partition)
        return drive.describe(request.domain, request.dataset, request.partition)

    def _renew(self, request: ingest.Renew, payload: bytes) -> ingest.Renewed:
        renewed = self._all(lambda d: d.ask(request, ingest.Renewed).partitions)
        return ingest.Renewed(sorted(n for got in renewed for n in got))

    def _outcome(self, request: ingest.OutcomeRequest, payload: bytes) -> ingest.OutcomeReply:
        """A drive that recorded the ingest's outcome decides; otherwise it is pending while any
        drive still holds it pending, and aborted once none does."""
        outcomes = self._all(lambda d: d.ask(request, ingest.OutcomeReply).outcome)
        for outcome in (ingest.Outcome.COMMIT, ingest.Outcome.PENDING):
            if outcome in outcomes:
                return ingest.OutcomeReply(outcome)
        return ingest.OutcomeReply(ingest.Outcome.ABORT)

    def _stats(self, request: control.Stats, payload: bytes) -> control.StatsReply:
        stats = self._all(lambda d: d.stats())
        return control.StatsReply(
            keys=sum(s.keys for s in stats),
            file_bytes=sum(s.file_bytes for s in stats),
            partitions=sum(s.partitions for s in stats),
            pending_partitions=sum(s.pending_partitions for s in stats),
            ingesting=sum(s.ingesting for s in stats),
            **self._admitted(),
            **self._totals(),
            quarantined=tuple(q for s in stats for q in s.quarantined)[: control.QUARANTINED_MAX],
        )

    def _calibrate(self, request: control.Calibrate, payload: bytes) -> control.CalibrateReply:
        """The kernel on the server's own CPU; reads are its first drive's."""
        if request.part is control.CalibratePart.KERNEL:
            return control.CalibrateReply(
                kernel_s=calibration.time_kernel(self.emulator, request.repeat)
            )
        return self.ordered_drives()[0].ask(request, control.CalibrateReply)

    # ---- streams ------------------------------------------------------------------------------

    @_flight_errors
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """A partition (or a slice update) passed on to the drive it belongs on, as it streams."""
        kind, header, _ = frame.decode(descriptor.command)
        auth.authorize(context, kind)
        request: ingest.PutPartition | ingest.UpdateSlice
        if kind == Put.PARTITION:
            request = ingest.PutPartition.from_json(header)
            drive = self._placed(request)
        elif kind == Put.UPDATE_SLICE:
            request = ingest.UpdateSlice.from_json(header)
            drive = self.holder(request.domain, request.dataset, request.partition)
        else:
            raise ProtocolError(f"unknown put {kind!r}")
        out, acks = drive.open_put(request, reader.schema)
        batches = (chunk.data for chunk in reader if chunk.data is not None)
        ack = drive.guard(lambda: _finish_put(out, acks, batches))
        writer.write(pa.py_buffer(ack))

    @_flight_errors
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        """Raw slices and pushed-back ranges from the drive that holds them, through this
        server's link to its upstream."""
        kind, header, payload = frame.decode(ticket.ticket)
        auth.authorize(context, kind)
        if kind == Get.HEARTBEAT:
            return heartbeats(context, control.Heartbeat.from_json(header))
        if kind == Get.CALIBRATION:
            request = work.CalibrationTransfer.from_json(header)
            schema, batches = calibration.calibration_stream(self.emulator, request.bytes)
            return flight.GeneratorStream(schema, _typed_errors(batches))
        span = tracing.served(context, "forward", process=self.name, call=kind)
        if kind == Get.SLICES:
            fetch = work.SliceRequest.from_json(header)
            drive = self.holder(fetch.domain, fetch.dataset, fetch.partition)
            reader = drive.get(fetch, payload, span)
        elif kind == Get.SCAN:
            scan = work.ScanRequest.from_json(header)
            drive = self.holder(scan.domain, scan.dataset, scan.partition)
            reader = drive.get(scan, span=span)
        else:
            raise ProtocolError(f"unknown ticket {kind!r}")
        schema = drive.guard(lambda: reader.schema)
        timed = self.metrics.timed_stream(kind, self._shipped(drive, reader))
        return flight.GeneratorStream(schema, _typed_errors(span.around(timed)))

    def _shipped(
        self, drive: DeviceClient, reader: flight.FlightStreamReader
    ) -> Iterator[pa.RecordBatch]:
        for batch in drive.batches(reader):
            self.emulator.ship(pa.ipc.get_record_batch_size(batch))
            yield batch

    def _work(
        self,
        request: work.WorkRequest,
        payload: bytes,
        writer: flight.MetadataRecordBatchWriter,
        span: tracing.Span,
    ) -> None:
        server_work.run_work(self, request, payload, writer, span)


def _drive_pulse(drive: DeviceClient) -> str:
    """A drive's generation ("" from a drive that predates pulses: never cached)."""
    try:
        return drive.pulse().generation
    except ProtocolError:
        return ""


def serve(
    data: str | Path,
    profile: Profile,
    drives: tuple[DeviceSpec, ...],
    host: str = "127.0.0.1",
    port: int = 0,
    name: str | None = None,
    ready_file: str | Path | None = None,
    security: Security = Security(),
    metrics_port: int | None = None,
) -> None:
    """Run a storage server until it is stopped; the ready file says where it listens (and,
    with ``metrics_port``, where its Prometheus metrics are)."""
    from quarry.device.server import LOOPBACK
    from quarry.errors import ClusterError

    if host not in LOOPBACK and security.tls is None:
        raise ClusterError(f"a storage server listening on {host} must use TLS")
    scheme = security.scheme
    server = StorageServer(Path(data), profile, f"{scheme}://{host}:{port}", drives, name, security)
    metrics = None if metrics_port is None else server.serve_metrics(host, metrics_port)
    if ready_file is not None:
        write_ready(
            ready_file, f"{scheme}://{host}:{server.port}", server.port, server.name, metrics
        )
    log.info(
        "storage server %s (%s) over %d drives on %s:%d",
        server.name,
        profile.name,
        len(drives),
        host,
        server.port,
    )
    server.serve()
