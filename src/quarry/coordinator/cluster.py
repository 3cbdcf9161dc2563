"""``Cluster``: what a user holds after ``quarry.local(...)`` or ``quarry.connect(file)``.

Membership and catalog live in ``Membership``; ingest, SQL and calibration are functions over
it in their own modules, which this handle only calls (so none of them imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

import pyarrow as pa

from quarry.coordinator.admin.calibrate import calibrate, calibrate_host
from quarry.coordinator.admin.rebalance import RebalanceReport, rebalance
from quarry.coordinator.admin.repair import (
    BANDWIDTH_BYTES_PER_S_DEFAULT,
    Deficit,
    RepairReport,
    deficits,
    record_of,
    repair,
)
from quarry.coordinator.admin.scrub import Progress, ScrubReport, scrub
from quarry.coordinator.dispatch.streams import merge
from quarry.coordinator.ingest.atomic import ingest
from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.coordinator.membership.cluster_file import ClusterFile, DeviceSpec
from quarry.coordinator.membership.joining import introduce
from quarry.coordinator.membership.listing import DatasetDescription, DatasetSummary, DeviceStatus
from quarry.coordinator.membership.membership import Membership
from quarry.coordinator.membership.placement import Shared, shared_domains
from quarry.coordinator.query.explain import Explain
from quarry.coordinator.query.fragments import Forced
from quarry.coordinator.query.run import Query
from quarry.coordinator.reads.degraded import Rebuilder
from quarry.coordinator.reads.sample import Sample, sample
from quarry.coordinator.reads.source_order import source_order
from quarry.errors import ClusterError, CorruptSlice, DatasetNotFound, DeviceUnavailable
from quarry.protocol.control import CalibrationReport, LoadStarted, LoadStatus
from quarry.pushdown import Pushdown

SCAN_QUEUE_BATCHES_MAX = 16  # batches waiting for the reader of a parallel scan
# a scan whose replicas all lost a partition (moved since) reads the catalog again this often
SCAN_CATALOG_READS_MAX = 2


class Cluster(Membership):
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> list[DeviceStatus]:
        """Every device, by name: up (its profile, process and counts, the copies coming into
        it: moves in flight) or down (why); and its failure domain."""
        rows = []
        stats = self.each(lambda c: c.stats())
        domains = self.domains()
        for name in sorted(self.devices):
            address = self.devices[name].address
            result = stats[name]
            where = {
                "host": domains[name].host,
                "rack": domains[name].rack,
                "drained": name in self.drained,
            }
            if isinstance(result, Exception) or name in self.down:
                error = result if isinstance(result, Exception) else self.down[name]
                rows.append(DeviceStatus(name, address, False, error=str(error), **where))
            else:
                info = self.info[name]
                up = DeviceStatus(
                    name,
                    address,
                    True,
                    profile=info.profile.name,
                    pid=info.pid,
                    stats=result,
                    **where,
                )
                rows.append(up)
        return rows

    def placement_warnings(self) -> list[Shared]:
        """Partitions whose replicas share a host (or rack), and why: too few of them, or a
        rebalance would set them apart."""
        held = (
            (record_of(entry, p.partition).replicas, p.devices)
            for entry in self.catalog.values()
            for p in entry.partitions
        )
        return shared_domains(held, self.domains())

    # ---- datasets -----------------------------------------------------------------------------

    def ingest(self, source: Any, dataset: str, **options: Any) -> DatasetEntry:
        """Store a file, table or DataFrame as ``domain/name``; all or nothing."""
        return ingest(self, source, dataset, **options)

    def datasets(self) -> list[DatasetSummary]:
        return [DatasetSummary.of(entry) for entry in self.catalog.values()]

    def describe(self, dataset: str) -> DatasetDescription:
        """Schema, partitions, slices and placement of one dataset."""
        return DatasetDescription.of(self.entry(dataset))

    def drop(self, dataset: str) -> int:
        entry = self.entry(dataset)
        holders = sorted(
            {d for p in [*entry.partitions, *entry.parity] if not p.lost for d in p.devices}
            | {d for ds in entry.unavailable.values() for d in ds}
        )
        # every holder must answer before any drops: one cut off would keep its part, and
        # the dataset would come back half (a device that goes silent between this and its
        # drop still can: the window is one call)
        down = [name for name in holders if name in self.down]
        if not down:
            answers = self.each_started(lambda c: c.pulse(), holders)
            down = [n for n in holders if isinstance(answers[n].result(), DeviceUnavailable)]
        if down:
            raise DeviceUnavailable(
                f"cannot drop {dataset}: device {down[0]} holding part of it does not answer; "
                "start it (or wait for its link) and try again"
            )
        deleted = 0
        for name in holders:
            deleted += self.devices[name].drop(entry.domain, entry.name)
        self.refresh()
        return deleted

    def scan(
        self, dataset: str, columns: list[str] | None = None, ordered: bool = False
    ) -> pa.RecordBatchReader:
        """Every row of a dataset, streamed from a replica of each partition that answers.

        Devices stream in parallel, so batches of different partitions interleave;
        ``ordered=True`` gives the rows in the order of the source they were ingested from
        (``reads.source_order``), as a program reading that file would see them.
        """
        entry = self.entry(dataset)
        if entry.unavailable:
            raise DeviceUnavailable(entry.unavailable_message())
        schema = (
            entry.schema if columns is None else pa.schema([entry.schema.field(c) for c in columns])
        )
        batches = (
            self._scan_batches(entry, columns) if ordered else self._scan_parallel(entry, columns)
        )
        return pa.RecordBatchReader.from_batches(schema, batches)

    def _scan_batches(
        self, entry: DatasetEntry, columns: list[str] | None
    ) -> Iterator[pa.RecordBatch]:
        devices = {p.partition: p.devices for p in entry.partitions}

        def fetch(partition: int, first: int, end: int) -> Iterator[pa.RecordBatch]:
            return self._scan_partition(entry, partition, devices[partition], columns, first, end)

        return source_order(entry, fetch)

    def _scan_parallel(
        self, entry: DatasetEntry, columns: list[str] | None
    ) -> Iterator[pa.RecordBatch]:
        """One stream per device at a time, through a bounded queue."""
        partitions = [p for p in entry.partitions if p.rows]
        producers = [
            (lambda p=p: self._scan_partition(entry, p.partition, p.devices, columns))
            for p in partitions
        ]
        workers = max(1, min(len(self.live_devices()), len(partitions)))
        return merge(producers, workers, SCAN_QUEUE_BATCHES_MAX, "quarry-scan")

    def _scan_partition(
        self,
        entry: DatasetEntry,
        partition: int,
        devices: list[str],
        columns: list[str] | None,
        first: int = 0,
        end: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream one partition's slices ``first`` to ``end``, a batch per slice; a replica
        that stops answering, or reads a damaged copy, is left for the next, which goes on
        from the first slice not yet received (none twice). A replica the partition moved away
        from (a rebalance, since the catalog was read) is left too, and once none is left the
        catalog is read again for where it went: every replica keeps the same slice
        boundaries."""
        errors: list[str] = []
        received, damaged = first, False
        tried: set[str] = set()
        for _ in range(SCAN_CATALOG_READS_MAX):
            for device in devices:
                if device in tried:
                    continue
                tried.add(device)
                if device in self.down:
                    errors.append(f"{device} is down")
                    continue
                client = self.devices[device]
                try:
                    reader = client.scan(
                        entry.domain, entry.name, partition, received, end, columns
                    )
                    for batch in client.batches(reader):
                        received += 1
                        yield batch
                    return
                except (DeviceUnavailable, DatasetNotFound) as error:
                    errors.append(str(error))
                    damaged = False
                except CorruptSlice as error:
                    errors.append(str(error.on(device)))
                    damaged = True
            if damaged:
                break  # the catalog holds: no replica has a good copy of that slice
            self.refresh()
            moved = self.catalog.get(entry.qualified)
            now = (
                next((p for p in moved.partitions if p.partition == partition), None)
                if moved
                else None
            )
            if now is None or not set(now.devices) - tried:
                break
            devices = now.devices
        coded = next((p for p in entry.partitions if p.partition == partition), None)
        if coded is not None and coded.stripe is not None:  # erasure coded: from its stripe
            yield from Rebuilder.of(self, coded).scan(
                entry.domain, entry.name, partition, received, end, columns
            )
            return
        if damaged:
            raise CorruptSlice(
                f"no replica of partition {partition} of {entry.qualified} holds a good copy "
                f"from slice {received}: " + "; ".join(errors)
            )
        raise DeviceUnavailable(
            f"no replica of partition {partition} of {entry.qualified} answers from "
            f"slice {received}: " + "; ".join(errors)
        )

    def sample(
        self,
        dataset: str,
        every: int,
        pushdown: Pushdown | str = Pushdown.ALWAYS,
        decisions: Forced | None = None,
    ) -> Sample:
        """Every ``every``-th row of every slice, drawn on the devices (``Sample.table``)."""
        return sample(self, dataset, every, pushdown, decisions)

    # ---- replicas ------------------------------------------------------------------------

    def deficits(self) -> list[Deficit]:
        """Partitions held by fewer devices that answer than their ingest asked."""
        self.refresh()
        return deficits(self)

    def repair(self, bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT) -> RepairReport:
        """Copy under-replicated partitions from a replica that answers to devices that do
        not hold them, until each is back at its replica count (bounded bandwidth)."""
        return repair(self, bandwidth_bytes_per_s)

    def scrub(
        self,
        bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT,
        progress: Progress | None = None,
        mend: bool = True,
    ) -> ScrubReport:
        """Read every slice of every device on the device itself, at most ``bytes_per_s``
        each, checking checksums and zone maps; then (``mend``) mend what is damaged from
        good copies (docs/integrity.md). ``progress(done, total)`` counts slices."""
        return scrub(self, bytes_per_s, progress, mend)

    # ---- growing and draining ---------------------------------------------------------------

    def rebalance(
        self,
        bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT,
        dry_run: bool = False,
        progress: bool | None = None,
    ) -> RebalanceReport:
        """Move partitions, online and at a bounded rate, to where placement puts them now (a
        device added, one drained, hosts relabelled): each copied, committed, then let go of;
        never on fewer devices than its replicas. ``dry_run``: only plan."""
        return rebalance(self, bandwidth_bytes_per_s, dry_run, progress)

    def drain(
        self,
        name: str,
        bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT,
        progress: bool | None = None,
        undo: bool = False,
    ) -> RebalanceReport:
        """Move a device's partitions to where placement without it puts them, and keep new
        ones off it (the cluster file says it is drained), so that removing it then needs no
        repair. ``undo``: take it back (a rebalance then fills it again)."""
        self.device(name)
        self._replace_spec(replace(self._spec(name), drained=not undo))
        return self.rebalance(bandwidth_bytes_per_s, progress=progress)

    def add_device(self, address: str, name: str | None = None) -> DeviceSpec:
        """Introduce a running device: its identity checked both ways (its certificate against
        the cluster's CA, this cluster's token by it), then named in the cluster file. Its
        entry; ``rebalance()`` then gives it its share."""
        spec = introduce(self.specs, address, name, self.info)
        if spec.name in self.devices:
            raise ClusterError(f"the cluster already has a device named {spec.name!r}")
        if self.source is not None:
            ClusterFile.read(self.source).with_added(spec).write(self.source)
        self.specs = (*self.specs, spec)
        self.devices[spec.name] = self._client(spec)
        self.refresh()
        return spec

    def remove_device(self, name: str, force: bool = False) -> DeviceSpec:
        """Take a device out of the cluster (and its file); its entry. Refused while it holds
        the only replica of a partition (drain it first), unless ``force``."""
        self.refresh()
        only = sorted(
            f"{entry.qualified} partition {p.partition}"
            for entry in self.catalog.values()
            for p in entry.partitions
            if p.devices == [name]
        )
        if only and not force:
            raise ClusterError(
                f"{name} holds the only replica of {len(only)} partition(s) "
                f"({', '.join(only[:3])}{' ...' if len(only) > 3 else ''}): drain it first "
                "(quarry device drain), or --force to lose them"
            )
        spec = self._spec(name)
        if len(self.specs) == 1:
            raise ClusterError(f"{name} is the cluster's only device")
        if self.source is not None:
            ClusterFile.read(self.source).without(name).write(self.source)
        self.specs = tuple(s for s in self.specs if s.name != name)
        self.devices.pop(name).close()
        self.refresh()
        return spec

    def _spec(self, name: str) -> DeviceSpec:
        self.device(name)
        return next(s for s in self.specs if s.name == name)

    def _replace_spec(self, spec: DeviceSpec) -> None:
        """A member's entry changed: in memory and in the cluster file."""
        if self.source is not None:
            ClusterFile.read(self.source).with_device(spec).write(self.source)
        self.specs = tuple(spec if s.name == spec.name else s for s in self.specs)

    # ---- devices as drives --------------------------------------------------------------------

    def calibrate(self) -> list[CalibrationReport]:
        """Measure each device's compute factor and bandwidths beside its profile's figures."""
        reports = calibrate(self)
        self.calibration_cache = {r.device: r for r in reports}
        return reports

    def calibrate_host(self) -> CalibrationReport:
        """Measure this host's own profile (``host_profile``) as a device's is: its compute
        factor and its ingress link, beside the profile's figures."""
        return calibrate_host(self)

    def load(self, device: str, cpu: float, seconds: float = 60.0) -> LoadStarted:
        """Emulated background CPU load on one device, ending by itself after ``seconds``."""
        started = self.device(device).load(cpu, seconds)
        self.forget_loads()  # the next query's cost model sees it
        return started

    def device_load(self, device: str) -> LoadStatus:
        return self.device(device).load_status()

    def clear_quarantine(self, devices: Iterable[str] | None = None) -> dict[str, int]:
        """Lift the quarantined sub-plan shapes of ``devices`` (every device by default): the
        next work of those shapes runs on them again (docs/operations.md, "Quarantine"). How
        many each held; a device that does not answer raises ``DeviceUnavailable``."""
        names = sorted(self.devices) if devices is None else list(devices)
        return {name: self.device(name).quarantine_clear() for name in names}

    # ---- queries ------------------------------------------------------------------------------

    def query(
        self,
        sql: str,
        pushdown: Pushdown | str = Pushdown.AUTO,
        decisions: Forced | None = None,
        **options: Any,
    ) -> Query:
        """A planned query (``quarry.coordinator.query.run.Query``): ``execute()``, ``explain()``.
        Whatever fails, here or reading its answer, is a ``QuarryError``: the query's own
        (``QueryError``, with a hint) or quarry's (``InternalError``, naming the query).

        ``decisions`` forces device decisions per (dataset, partition), e.g.
        ``{("physics/particles", 0): [{"first": 0, "end": 3, "stage": "raw"}]}``.
        """
        return Query(self, sql, pushdown, decisions, **options)

    def sql(
        self,
        sql: str,
        pushdown: Pushdown | str = Pushdown.AUTO,
        decisions: Forced | None = None,
    ) -> pa.RecordBatchReader:
        """Run SQL; tables are named ``domain.dataset`` (or the bare name when unambiguous)."""
        return self.query(sql, pushdown, decisions).execute()

    def explain(
        self,
        sql: str,
        analyze: bool = False,
        pushdown: Pushdown | str = Pushdown.AUTO,
        decisions: Forced | None = None,
        verbose: bool = False,
    ) -> Explain:
        """The cut (super-plan and sub-plans); with ``analyze``, what each device did; with
        ``verbose``, the rules that fired, in order, each with the cut after it (``rules``).
        ``to_json()`` gives its JSON: docs/explain.md."""
        planned = self.query(sql, pushdown, decisions)
        if analyze:
            planned.execute().read_all()
        return planned.explain(analyze, verbose)


def connect(cluster_file: str | Path) -> Cluster:
    """A Cluster over the devices a cluster file lists (written by ``quarry up`` or by hand).
    A host profile the file names holds this process to it (``device.unit.set_host_profile``)."""
    file = ClusterFile.read(cluster_file)
    if file.host is not None:
        from quarry.device.profile import get_profile
        from quarry.device.unit import set_host_profile

        set_host_profile(get_profile(file.host.profile, file.host.profiles_file))
    return Cluster(file.devices, source=str(cluster_file))
