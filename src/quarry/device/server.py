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
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry import auth, tracing
from quarry.auth.enrollment import DeviceLabels
from quarry.auth.middleware import needed
from quarry.auth.revocation import Verifier
from quarry.device import admission, calibration, column_cache, faults, loop
from quarry.device import identity as identity_file
from quarry.device.admission import Admission
from quarry.device.column_cache import ColumnCache
from quarry.device.integrity import IntegrityLog
from quarry.device.janitor import Janitor
from quarry.device.metrics import (
    Gauge,
    ServerMetrics,
    admission_figures,
    link_figures,
    space_figures,
)
from quarry.device.peers import PeerCredentials, ask_outcome
from quarry.device.profile import Profile
from quarry.device.quarantine import Quarantine
from quarry.device.revocation_sync import RevocationSync
from quarry.device.scrub import scrub
from quarry.device.unit import lookup
from quarry.errors import (
    CatalogChanged,
    ClusterError,
    CorruptSlice,
    ProtocolError,
    QuarryError,
    QueryError,
)
from quarry.protocol import control, frame, ingest, integrity, work
from quarry.protocol.frame import Exchange, Get, Put
from quarry.protocol.message import Message
from quarry.store import codec, mend, naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore
from quarry.store.partition import PartitionMeta

log = logging.getLogger("quarry.device")


def _flight_errors(method: Callable) -> Callable:
    """Turn every error into a Flight error carrying the typed quarry error on the wire (a
    damaged copy of its own the service remembers first: ``Service.damaged``)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except flight.FlightError:
            raise
        except QuarryError as error:
            if isinstance(error, CorruptSlice) and args and isinstance(args[0], Service):
                error = args[0].damaged(error)
            raise flight.FlightServerError(frame.encode_error(error)) from None
        except Exception as error:  # a bug: say so, with the type, rather than hang the client
            log.exception("device error")
            raise flight.FlightServerError(
                frame.encode_error(QuarryError(f"device error: {type(error).__name__}: {error}"))
            ) from None

    return wrapper


def _typed_errors(
    batches: Iterable[pa.RecordBatch],
    damaged: Callable[[CorruptSlice], CorruptSlice] = lambda error: error,
) -> Iterator[pa.RecordBatch]:
    """A stream's batches; an error raised while they are made reaches the client typed, as
    one raised before the stream began does (``_flight_errors``), a damaged copy remembered
    by ``damaged`` first."""
    try:
        yield from batches
    except (flight.FlightError, GeneratorExit):
        raise
    except QuarryError as error:
        if isinstance(error, CorruptSlice):
            error = damaged(error)
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
    empty = codec.empty_batch(control.HEARTBEAT_SCHEMA)

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
class Labels:
    """A device's failure domain, said in its hello: the host it runs on (the machine's name
    unless told otherwise: ``quarry up --hosts`` emulates several on one machine) and its rack
    ("": none). Placement keeps a partition's replicas on distinct ones."""

    host: str
    rack: str = ""

    @classmethod
    def of(cls, host: str | None = None, rack: str | None = None) -> Labels:
        return cls(host or socket.gethostname(), rack or "")


@dataclass(frozen=True)
class Security:
    """What a server checks callers with, and shows them, from its enrolled folder: the
    cluster's public key and the revocation list it holds (``verifier``; None: ``--insecure``,
    nothing checked), its own TLS certificate and key, the CA it trusts, its credential (a
    token of role ``device``) for the devices it asks, its labels, and whether it requires a
    certificate the CA signed of every caller (``--verify-clients``: mutual TLS on every
    call, not only between devices)."""

    verifier: Verifier | None = None
    tls: tuple[bytes, bytes] | None = None  # certificate, key (PEM)
    ca: bytes | None = None
    credential: str | None = None
    labels: DeviceLabels | None = None
    verify_clients: bool = False

    @property
    def scheme(self) -> str:
        return "grpc+tls" if self.tls else "grpc"

    @property
    def peer(self) -> PeerCredentials:
        """How it calls another device: its credential, and under TLS its own certificate."""
        return PeerCredentials(self.credential, self.ca if self.tls else None, self.tls)


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
        labels: Labels | None = None,
    ):
        verifier = security.verifier
        middleware = {auth.NAME: auth.TokenCheck(verifier)} if verifier else {}
        middleware.update(tracing.server_middleware())  # none unless it traces
        tls = [security.tls] if security.tls else None
        super().__init__(
            location,
            middleware=middleware or None,
            tls_certificates=tls,
            verify_client=security.verify_clients,
            root_certificates=security.ca if security.verify_clients else None,
        )
        self.data = Path(data)
        self.profile = profile
        self.security = security
        self.identity = identity_file.load_or_create(self.data, name, profile.name)
        self.name = self.identity["name"]
        tracing.name_process(f"quarry-{self.WHAT}", self.name)
        self.labels = labels or Labels.of()
        self.started_at = time.time()
        # this process's own: a restart (new process) never repeats a generation it gave
        self.boot = uuid.uuid4().hex[:16]
        self._hello_bytes: tuple[tuple[int, int], bytes] | None = None
        self.revocations = verifier.revocations if verifier else None
        if self.revocations is not None:  # learns what the admin revoked while it was away
            RevocationSync(self.revocations, security.peer, self.name).start()
        self.metrics = ServerMetrics(self._metric_figures)

    def _metric_figures(self) -> list[Gauge]:
        """What a scrape reads of its state now (``quarry.device.metrics``)."""
        emulator = self.emulator
        return [
            *admission_figures(self.admission.status()),
            *link_figures(emulator.read_bytes_total, emulator.shipped_bytes_total),
        ]

    def serve_metrics(self, host: str, port: int) -> int:
        """Prometheus's endpoint, where this server listens and as securely (its TLS, and its
        demand of a client certificate); the port it took."""
        security = self.security
        ca = security.ca if security.verify_clients else None
        port = self.metrics.serve(host, port, security.tls, ca, self.data / "metrics")
        log.info("%s %s: metrics on %s:%d", self.WHAT, self.name, host, port)
        return port

    def _actions(self) -> dict[str, tuple[type[Message], Callable[[Any, bytes], Any]]]:
        raise NotImplementedError

    def damaged(self, error: CorruptSlice) -> CorruptSlice:
        """A damaged copy met while serving a call, on its way to the caller: a device
        remembers its own (a server passes on its drives' as they named them)."""
        return error

    @_flight_errors
    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        kind, header, payload = frame.decode(action.body.to_pybytes())
        if kind != action.type:
            raise ProtocolError(f"action type {action.type!r} does not match its body ({kind!r})")
        auth.authorize(context, kind, needed(kind, header))
        handlers = {**self._actions(), **self._credential_actions()}
        if kind not in handlers:
            raise ProtocolError(
                f"unknown action {kind!r}; this {self.WHAT} knows {sorted(handlers)}"
            )
        request_class, handler = handlers[kind]
        with self.metrics.timed(kind):
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
        span = tracing.served(
            context,
            "work",
            process=self.name,
            unit=request.unit,
            dataset=f"{request.domain}/{request.dataset}",
            partitions=len(request.partitions),
        )
        with self.metrics.timed(Exchange.WORK), span:
            self._work(request, payload, writer, span)

    def _work(
        self,
        request: work.WorkRequest,
        payload: bytes,
        writer: flight.MetadataRecordBatchWriter,
        span: tracing.Span,
    ) -> None:
        raise NotImplementedError

    def _load(self, request: control.Load, payload: bytes) -> control.LoadStarted:
        started = self.emulator.start_load(request.cpu, request.seconds)
        return control.LoadStarted(started["cpu"], started["seconds"], self.name)

    def _totals(self) -> dict[str, Any]:
        """``StatsReply``'s figures since start, for rates: bytes through its links, its work
        counters, and the free space where it stores."""
        return {
            "read_bytes": self.emulator.read_bytes_total,
            "shipped_bytes": self.emulator.shipped_bytes_total,
            "work": self.metrics.work_total(),
            "free_bytes": shutil.disk_usage(self.data).free,
        }

    def _admitted(self) -> dict[str, int]:
        """``StatsReply``'s account of the exchanges it admits (``admission``)."""
        admitted = self.admission.status()
        return {
            "running": admitted["running"] + admitted["running_small"],
            "exchanges_max": admitted["exchanges_max"],
            "admitted": admitted["admitted"],
            "refused": admitted["refused"],
            "queued_bytes": admitted["queued_bytes"],
        }

    def _credential_actions(
        self,
    ) -> dict[str, tuple[type[Message], Callable[[Any, bytes], Any]]]:
        """The revocation list: the admin pushes it, peers ask for it (none under
        ``--insecure``: nothing is checked)."""
        if self.revocations is None:
            return {}
        return {
            control.RevocationPush.KIND: (control.RevocationPush, self._take_revocations),
            control.RevocationsAsk.KIND: (control.RevocationsAsk, self._held_revocations),
        }

    def _take_revocations(
        self, request: control.RevocationPush, payload: bytes
    ) -> control.RevocationsHeld:
        assert self.revocations is not None
        self.revocations.take(request.revocations, request.peers)  # refused if not signed
        return control.RevocationsHeld(self.revocations.version, len(self.revocations.peers))

    def _held_revocations(
        self, request: control.RevocationsAsk, payload: bytes
    ) -> control.RevocationsReply:
        assert self.revocations is not None
        held = self.revocations.held
        return control.RevocationsReply(
            held.version, held if held.version > request.version else None
        )

    def _revocation_state(self) -> tuple[int, int]:
        held = self.revocations
        return (0, 0) if held is None else (held.version, len(held.peers))

    def _hello(self, request: control.Hello, payload: bytes) -> bytes:
        state = self._revocation_state()  # the rest of who it is does not change while it runs
        if self._hello_bytes is None or self._hello_bytes[0] != state:
            self._hello_bytes = (state, self._hello_reply().to_bytes())
        return self._hello_bytes[1]

    def _hello_reply(self) -> control.HelloReply:
        version, peers = self._revocation_state()
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
            host=self.labels.host,
            rack=self.labels.rack,
            revocations=version,
            peers=peers,
        )


def write_ready(
    ready_file: str | Path, address: str, port: int, name: str, metrics_port: int | None = None
) -> None:
    """Say where a server process listens, atomically (its starter waits for the file), and
    where its metrics are (None: nowhere)."""
    import json

    ready = Path(ready_file)
    tmp = ready.with_suffix(".tmp")
    body = {"port": port, "pid": os.getpid(), "name": name, "address": address}
    body["metrics_port"] = metrics_port
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
        labels: Labels | None = None,
    ):
        super().__init__(data, profile, location, name, security, labels)
        self.store = KeyValueStore(self.data / "kv", kv_bytes_max=profile.kv_bytes_max)
        from quarry.device.emulation import Emulator

        self.admission = Admission(
            self.name, admission.exchanges_for(profile.cores), admission.queued_bytes_default()
        )
        self.quarantine = Quarantine(self.data, self.name)
        self.runtime = loop.Runtime(
            self.store,
            Emulator(profile),
            self.name,
            self.admission,
            on_work_done=self.metrics.work_done,
            quarantine=self.quarantine,
            cache=ColumnCache(profile.cache_bytes(column_cache.setting_bytes())),
        )
        self._ingesting = 0  # ingest streams open now (``StatsReply.ingesting``)
        self._ingesting_lock = threading.Lock()
        self._copies: dict[int, control.CopyInFlight] = {}  # by stream, as far as they came
        # Pending ingests it took part in before it stopped: committed or aborted as their
        # deciders say (asked with its own credential), then watched while their coordinators
        # renew them.
        self.janitor = Janitor(
            self.store, self.name, ask=functools.partial(ask_outcome, peer=security.peer)
        )
        self.janitor.start()
        self._inventory_cache: tuple[int, bytes] | None = None
        self.integrity = IntegrityLog(self.data, self.name)
        self._copies_received = 0  # copies of partitions streamed in whole (moves, repairs)

    def _metric_figures(self) -> list[Gauge]:
        stats = self.store.stats()
        return [
            *super()._metric_figures(),
            *space_figures(self.data, stats["file_bytes"]),
            Gauge("store_keys", "Keys in the key-value store", stats["keys"]),
            Gauge(
                "store_partitions",
                "Committed partitions it holds",
                len(self.store.list(partitions.CATALOG_PREFIX)),
            ),
            Gauge("ingest_streams", "Ingest streams open now", self._ingesting),
            Gauge("copy_streams", "Copies of partitions streaming in now", len(self._copies)),
            Gauge(
                "copies_received_partitions",
                "Copies of partitions received whole from another device (moves and repairs)",
                self._copies_received,
                True,
            ),
            Gauge(
                "integrity_corrupt_copies",
                "Damaged copies of partitions it holds, found and not yet mended",
                len(self.integrity.held().corrupt),
            ),
            Gauge(
                "quarantined_plans",
                "Sub-plan shapes it declines for now because their stage failed here",
                len(self.quarantine.held()),
            ),
        ]

    def damaged(self, error: CorruptSlice) -> CorruptSlice:
        return self.integrity.found(error)

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
            ingest.Drop.KIND: (ingest.Drop, self._drop),
            ingest.Retire.KIND: (
                ingest.Retire,
                lambda r, p: ingest.Applied(
                    partitions.retire(
                        self.store, r.domain, r.dataset, r.partition, r.ingest_id, time.time()
                    )
                ),
            ),
            ingest.Holders.KIND: (
                ingest.Holders,
                lambda r, p: ingest.Applied(
                    partitions.set_holders(
                        self.store, r.domain, r.dataset, r.partition, r.ingest_id, list(r.devices)
                    )
                ),
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
            integrity.Integrity.KIND: (integrity.Integrity, lambda r, p: self.integrity.held()),
            integrity.Scrub.KIND: (
                integrity.Scrub,
                lambda r, p: scrub(self.store, self.emulator, r, self.integrity),
            ),
            integrity.Scrubbed.KIND: (integrity.Scrubbed, self._scrubbed),
            integrity.RepairMeta.KIND: (integrity.RepairMeta, self._repair_meta),
            control.QuarantineClear.KIND: (
                control.QuarantineClear,
                lambda r, p: control.QuarantineCleared(self.quarantine.clear()),
            ),
        }

    def _drop(self, request: ingest.Drop, payload: bytes) -> control.Deleted:
        deleted = partitions.drop(self.store, request.domain, request.dataset)
        self.integrity.dropped(request.domain, request.dataset)
        return control.Deleted(deleted)

    def _scrubbed(self, request: integrity.Scrubbed, payload: bytes) -> integrity.IntegrityReply:
        self.integrity.scrubbed(request.summary)
        return self.integrity.held()

    def _repair_meta(self, request: integrity.RepairMeta, payload: bytes) -> integrity.ScrubReply:
        """A good copy's metadata slice in place of the damaged one, then its own slices
        checked against it (one that does not check is reported, to be mended in turn)."""
        d, n, p = request.domain, request.dataset, request.partition
        mend.install_meta(self.store, d, n, p, payload, self.name)
        parts = frozenset({integrity.CopyPart.METADATA, integrity.CopyPart.CATALOG})
        self.integrity.mended(d, n, p, parts)
        return scrub(self.store, self.emulator, integrity.Scrub(d, n, p), self.integrity)

    def _inventory(self, request: control.Inventory, payload: bytes) -> bytes:
        """Every committed partition, and the generation it holds under. Changed only by
        commit and drop: the encoded answer is kept until the store's catalog changes."""
        before = self.store.writes()
        visible = self.store.visible_writes()
        cached = self._inventory_cache
        if cached is not None and cached[0] == before:
            return cached[1]
        damaged: list[CorruptSlice] = []
        summaries = [
            control.PartitionSummary.from_json(s) for s in partitions.inventory(self.store, damaged)
        ]
        for error in damaged:  # served from the metadata slice, or not at all
            self.integrity.found(error)
        # no write of what queries read began or was under way: the generation holds for it
        settled = self.store.visible_writes() == visible and visible % 2 == 0
        generation = self._generation(visible) if settled else ""
        encoded = control.InventoryReply(summaries, generation=generation).to_bytes()
        if settled and self.store.writes() == before and before % 2 == 0:  # nor any other
            self._inventory_cache = (before, encoded)
        return encoded

    def _generation(self, visible_writes: int) -> str:
        """Equal twice only if the store saw no write of what is committed in between (a copy
        streaming in, a lease renewed, are not: ``KeyValueStore.visible_writes``), in this same
        process."""
        return f"{self.boot}:{visible_writes}"

    def _pulse(self, request: control.Pulse, payload: bytes) -> control.PulseReply:
        load = control.LoadStatus(**self.emulator.load())
        return control.PulseReply(self._generation(self.store.visible_writes()), load)

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
        held = self.integrity.held()
        unverified = sum(1 for s in partitions.inventory(self.store) if not s.get("verified"))
        return control.StatsReply(
            keys=stats["keys"],
            file_bytes=stats["file_bytes"],
            partitions=len(self.store.list(partitions.CATALOG_PREFIX)),
            pending_partitions=sum(
                1 for k in self.store.list(naming.PENDING_PREFIX) if k.count("/") == 3
            ),
            ingesting=self._ingesting,
            copies=tuple(self._copies.values())[: control.COPIES_MAX],
            **self._admitted(),
            corrupt_copies=len(held.corrupt),
            unverified_partitions=unverified,
            last_scrub=held.last_scrub,
            quarantined=self.quarantine.held(),
            **self._totals(),
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
        if kind not in tuple(Put):  # before it names a latency series of its own
            raise ProtocolError(f"unknown put {kind!r}")
        with self.metrics.timed(kind):
            self._put(kind, header, reader, writer)

    def _put(
        self,
        kind: str,
        header: dict[str, Any],
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
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
        elif kind == Put.REPAIR_SLICE:
            reply = self._repair_slice(integrity.RepairSlice.from_json(header), reader)
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
            self.store,
            meta,
            slice_rows=request.slice_rows,
            lease_s=request.lease_s,
            copy=bool(request.copy_from),
        )
        copy = self._copy_started(request)
        try:
            for chunk in reader:
                if chunk.data is not None and chunk.data.num_rows:
                    writer.write(chunk.data)
                    if copy is not None:
                        self._copy_advanced(copy, chunk.data.nbytes)
            written = writer.finish()
            faults.hit(self.name, "prepare")
        except BaseException:
            # The stream broke (client gone) or the rows were bad: leave nothing pending behind.
            partitions.abort(self.store, request.ingest.id)
            raise
        finally:
            if copy is not None:
                self._copies.pop(copy, None)
        if copy is not None:
            self._copies_received += 1
        return ingest.PartitionWritten(
            written.partition, written.rows, len(written.slices), written.bytes_stored
        )

    def _repair_slice(
        self, request: integrity.RepairSlice, reader: flight.MetadataRecordBatchReader
    ) -> control.Version:
        d, n, p = request.domain, request.dataset, request.partition
        batch = _one_batch(reader)
        version = mend.rewrite_slice(self.store, d, n, p, request.slice, batch, request.version)
        slices = range(request.slice, request.slice + 1)
        self.integrity.mended(d, n, p, frozenset({integrity.CopyPart.SLICE}), slices)
        return control.Version(version)

    def _copy_started(self, request: ingest.PutPartition) -> int | None:
        """A copy of a partition committed elsewhere (a move, a repair) begins: listed in the
        device's stats (``quarry status``: moves in flight) until its stream ends."""
        if not request.copy_from:
            return None
        key = id(request)
        self._copies[key] = control.CopyInFlight(
            f"{request.domain}/{request.dataset}",
            request.partition,
            request.copy_from,
            0,
            request.copy_bytes,
        )
        return key

    def _copy_advanced(self, key: int, size_bytes: int) -> None:
        copy = self._copies.get(key)
        if copy is not None:
            self._copies[key] = replace(copy, bytes_received=copy.bytes_received + size_bytes)

    def _update_slice(
        self, request: ingest.UpdateSlice, reader: flight.MetadataRecordBatchReader
    ) -> control.Version:
        batch = _one_batch(reader)
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
        self,
        request: work.WorkRequest,
        payload: bytes,
        writer: flight.MetadataRecordBatchWriter,
        span: tracing.Span,
    ) -> None:
        self._check_generation(request.generation)
        loop.run_work(self.runtime, request, payload, writer, span)  # admitted inside, once pruned

    def _check_generation(self, expected: str) -> None:
        """Refuse work planned on a catalog this device no longer matches, before any of it."""
        if expected and expected != self._generation(self.store.visible_writes()):
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
        timed = self.metrics.timed_stream(kind, batches)
        span = tracing.served(context, "fetch" if kind == Get.SLICES else kind, process=self.name)
        return flight.GeneratorStream(schema, _typed_errors(span.around(timed), self.damaged))

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


def _one_batch(reader: flight.MetadataRecordBatchReader) -> pa.RecordBatch:
    """A put stream's rows as one batch (a slice's)."""
    table = reader.read_all()
    if not table.num_rows:
        return codec.empty_batch(table.schema)
    return table.combine_chunks().to_batches()[0]


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
    verify_clients: bool = False,
    host_label: str | None = None,
    rack: str | None = None,
    metrics_port: int | None = None,
) -> None:
    """``quarry device serve``'s options: the credentials read, the profile found, then
    ``serve``. Shared by the CLI and ``python -m quarry.device`` (the lean entry point local
    clusters start, which imports no coordinator)."""
    import logging

    from quarry.device.profile import get_profile

    security = security_of(credentials, tls, insecure, data, verify_clients)
    name = enrolled_name(security, name)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # the flags say where it runs when given (``quarry up --hosts`` emulates several hosts on
    # one machine), else its enrollment does, else this machine's name
    enrolled = security.labels
    labels = Labels.of(
        host_label or (enrolled.host if enrolled else None),
        rack or (enrolled.rack if enrolled else None),
    )
    serve(
        data,
        get_profile(profile, profiles),
        host,
        port,
        name,
        ready_file,
        security,
        labels,
        metrics_port,
    )


def enrolled_name(security: Security, name: str | None) -> str | None:
    """The name a server runs under: the one its folder was enrolled for (``--name`` may
    repeat it, not change it: its certificate and credential name it)."""
    labels = security.labels
    if labels is None:
        return name
    if name is not None and name != labels.name:
        raise ClusterError(
            f"these credentials were enrolled for device {labels.name!r}, not {name!r}: drop "
            f"--name, or enroll {name} (quarry device enroll {name} --host ADDR --output DIR)"
        )
    return labels.name


def security_of(
    credentials: str | Path | None,
    tls: bool,
    insecure: bool,
    data: str | Path | None = None,
    verify_clients: bool = False,
) -> Security:
    """What a server (device or storage server) checks callers with, from its options: its
    enrolled folder (``credentials``), and the revocation list it took since, kept in its
    ``data`` folder."""
    from quarry.auth.credentials import read_private
    from quarry.auth.enrollment import DeviceFolder
    from quarry.auth.revocation import HELD_FILE

    if verify_clients and not tls:
        raise ClusterError("--verify-clients checks the callers' TLS certificates: add --tls")
    if credentials is None and not insecure:
        raise ClusterError(
            "a device checks every call's token: give --credentials FOLDER (its own, from "
            "quarry device enroll; quarry up makes one per device), or --insecure for a "
            "loopback experiment"
        )
    if credentials is None:
        if tls:
            raise ClusterError("--tls needs --credentials FOLDER (its certificate and key)")
        return Security()
    folder = DeviceFolder(Path(credentials))
    folder.check()
    verifier = folder.verifier(None if data is None else Path(data) / HELD_FILE)
    credential = folder.token()
    _check_own(verifier, credential, folder.folder)
    return Security(
        verifier,
        tls=folder.identity() if tls else None,
        ca=read_private(folder.ca_file) if tls else None,
        credential=credential,
        labels=folder.labels(),
        verify_clients=verify_clients,
    )


def _check_own(verifier: Verifier, credential: str, folder: Path) -> None:
    """A folder whose credential its own key does not verify is not one enrollment's: refuse
    it. One that expired or was revoked still serves, but cannot ask its peers: say so."""
    from quarry.auth.tokens import verify
    from quarry.errors import Unauthenticated

    try:
        verify(verifier.public_key, credential, now=0.0)  # the signature alone
    except Unauthenticated:
        raise ClusterError(
            f"{folder}: its device.token was not signed by the key in its verify.pem; enroll "
            "the device again (quarry device enroll)"
        ) from None
    try:
        verifier.check(credential)
    except Unauthenticated as error:
        log.warning("%s: the device's own credential: %s; enroll it again", folder, error)


def serve(
    data: str | Path,
    profile: Profile,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str | None = None,
    ready_file: str | Path | None = None,
    security: Security = Security(),
    labels: Labels | None = None,
    metrics_port: int | None = None,
) -> None:
    """Run a device until it is stopped (SIGTERM / SIGINT). Anywhere but loopback it needs
    TLS: tokens must not cross a network in the clear. With ``metrics_port`` (0: any free
    port) it serves Prometheus metrics there too, on the same address and as securely."""
    if host not in LOOPBACK and security.tls is None:
        raise ClusterError(
            f"a device listening on {host} must use TLS (--tls, with its enrolled "
            "--credentials): only loopback may be plain"
        )
    scheme = security.scheme
    server = DeviceServer(Path(data), profile, f"{scheme}://{host}:{port}", name, security, labels)
    metrics = None if metrics_port is None else server.serve_metrics(host, metrics_port)
    if ready_file is not None:
        write_ready(
            ready_file, f"{scheme}://{host}:{server.port}", server.port, server.name, metrics
        )
    log.info("device %s (%s) listening on %s:%d", server.name, profile.name, host, server.port)
    server.serve()
