"""What each device did for one piece of work, as the host saw it: a row of EXPLAIN ANALYZE.

The device's own account (``PartitionReport``: its decisions and metrics over the work stream)
plus what the host added (pushed-back ranges it fetched, raw scans of ``pushdown="never"``, a
fallback when the device could not run the work). Each slice range is counted once: a range the
device filtered was read there; a raw range is read when the host fetches it.

The counts are the one declaration of the work counters (``protocol.counters.WorkCounters``),
summed per device (``DeviceRow``) and per level below a storage server (``LevelRow``) the same
way, so a counter added there shows in every row here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from quarry.protocol.counters import WorkCounters, pushed_back
from quarry.protocol.stage import PushBack, Skip, Stage
from quarry.protocol.work import (
    Decision,
    LevelReport,
    PartitionReport,
    TraceEntry,
    WorkTimes,
)
from quarry.records import Record, record_json, spread, unless_empty


@dataclass
class WorkReport(Record):
    """One device, one piece of work (a query fragment, a dataset), one partition: filled in as
    the work goes (the device's account, and what the host fetched and completed), under the
    dispatch's lock: a partition's pushed-back ranges are fetched and counted at once, and each
    count replaces the counters whole."""

    device: str
    label: str  # the fragment (SQL) or dataset (genes) the work was for
    partition: int
    mode: str  # "subplan": the device ran the unit; "scan": raw slices, the host ran it
    decisions: list[Decision] = field(default_factory=list)
    counters: WorkCounters = spread(WorkCounters())
    bytes_shipped_raw: int = 0  # of which slices shipped raw (pushed back, or a scan)
    slices_raw: int = 0  # slices the host completed from raw rows
    wall_s: float = 0.0  # the longest of the device's accounts of the partition
    decode_s: float = 0.0  # CPU this side spent decompressing raw slices shipped as stored
    # where the device's time went (its own account, summed over its exchanges)
    times: WorkTimes = WorkTimes()
    fallback: str | None = None
    trace: list[TraceEntry] | None = None
    # this device stopped answering and the rest of the partition went to a replica
    failovers: list[dict[str, Any]] = field(default_factory=list)
    # when the device is a storage server: what the drive below it did (one level down)
    below: list[LevelReport] = field(default_factory=list)

    def count(self, **counts: float) -> None:
        """Add to counters by name (a name not declared fails here)."""
        self.counters = self.counters.plus(WorkCounters(**counts))

    def push_back(self, why: PushBack, slices: int) -> None:
        """Slices that came back to the host without a device's word for it (the host fell
        back to reading them raw), counted in the total and under ``why``."""
        self.counters = self.counters.plus(pushed_back(why, slices))

    def add_device(self, report: PartitionReport, trace: list[TraceEntry] | None) -> None:
        """The device's own account of the partition (its ``WorkDone``)."""
        self.decisions = list(report.decisions)
        self.below.extend(report.below)
        self.counters = self.counters.plus(report.metrics.counters)
        self.wall_s = max(self.wall_s, report.metrics.wall_s)
        self.times = self.times.plus(report.metrics.times)
        if trace is not None:
            self.trace = [t for t in trace if t.partition == self.partition]

    def add_raw(self, slices: int, rows_read: int, bytes_read: int) -> None:
        """Raw slices the host read through the device (a fetched push back, or a scan)."""
        self.count(slices_scanned=slices, rows_read=rows_read, bytes_read=bytes_read)
        self.slices_raw += slices

    def add_shipped(self, rows: int, size_bytes: int, raw: bool) -> None:
        self.count(rows_shipped=rows, bytes_shipped=size_bytes)
        if raw:
            self.bytes_shipped_raw += size_bytes

    def ranges(self, stage: Stage | Skip) -> list[list[int]]:
        return [[d.first, d.end] for d in self.decisions if d.stage == stage]

    def to_json(self) -> dict[str, Any]:
        """EXPLAIN ANALYZE's ``partitions`` row: the counters beside the rest, the levels
        below (their metrics flat too) only through a server, the trace only when asked."""
        body = record_json(self)
        body["fragment"] = body.pop("label")
        body["below"] = [
            {**level.to_json(), "metrics": level.metrics.flat_json()} for level in self.below
        ]
        if not self.below:
            del body["below"]
        if self.trace is None:
            del body["trace"]
        return body


@dataclass(frozen=True)
class DeviceRow(Record):
    """EXPLAIN ANALYZE's table: one device's partitions, their counters summed."""

    device: str
    partitions: int
    counters: WorkCounters = spread()
    decode_s: float = 0.0  # the host's CPU decompressing what it shipped as stored
    fallbacks: tuple[str, ...] = ()
    failovers: tuple[dict[str, Any], ...] = unless_empty(())

    @classmethod
    def of(cls, device: str, reports: list[WorkReport]) -> DeviceRow:
        return cls(
            device=device,
            partitions=len(reports),
            counters=WorkCounters.sum(r.counters for r in reports),
            decode_s=sum(r.decode_s for r in reports),
            fallbacks=tuple(r.fallback for r in reports if r.fallback),
            failovers=tuple(
                {"partition": r.partition, **failover} for r in reports for failover in r.failovers
            ),
        )


def per_device(reports: Iterable[WorkReport]) -> tuple[DeviceRow, ...]:
    """EXPLAIN ANALYZE's table: the partitions' counters summed per device."""
    devices: dict[str, list[WorkReport]] = {}
    for report in reports:
        devices.setdefault(report.device, []).append(report)
    return tuple(DeviceRow.of(name, devices[name]) for name in sorted(devices))


@dataclass(frozen=True)
class LevelRow(Record):
    """A device below a storage server (a drive, or a server with its own below it), its
    partitions' counters summed, naming the server it answered to."""

    device: str
    above: str
    server: bool  # it has devices of its own below it
    counters: WorkCounters = spread()


@dataclass(frozen=True)
class Levels(Record):
    """Through storage servers: bytes on each kind of link and CPU seconds at each level."""

    drive_links_bytes: int
    network_bytes: int
    drives_bytes_read: int
    drives_cpu_s: float
    servers_cpu_s: float
    drives: tuple[LevelRow, ...]


def per_level(reports: list[WorkReport], server_names: Iterable[str] = ()) -> Levels | None:
    """Through storage servers: bytes on each kind of link and CPU seconds at each level. The
    drives' links to their servers are "PCIe"; links out of servers (to the host, or to the
    server above) the "network". Raw slices the host fetched through a server (a scan without
    pushdown, a range passed on) crossed both as they are. ``drives`` lists every device below
    the host's, each naming the server above it, servers among them when there are three
    levels. None on a flat cluster."""
    named = set(server_names)
    servers = [r for r in reports if r.below or r.device in named]
    if not servers:
        return None
    below = [level for r in servers for level in r.below]
    inner = {level.above for level in below}  # servers with devices of their own below
    counted: dict[str, WorkCounters] = {}
    above: dict[str, str] = {}
    for level in below:
        counted[level.device] = counted.get(level.device, WorkCounters()).plus(
            level.metrics.counters
        )
        above.setdefault(level.device, level.above)
    drives = [level.metrics.counters for level in below if level.device not in inner]
    middle = [level.metrics.counters for level in below if level.device in inner]
    at_servers = WorkCounters.sum(r.counters for r in servers)
    return Levels(
        drive_links_bytes=sum(c.bytes_shipped for c in drives)
        + sum(r.bytes_shipped_raw for r in servers),
        network_bytes=at_servers.bytes_shipped + sum(c.bytes_shipped for c in middle),
        drives_bytes_read=at_servers.bytes_read,  # all read by drives
        drives_cpu_s=sum(c.device_cpu_s for c in drives),
        servers_cpu_s=at_servers.device_cpu_s + sum(c.device_cpu_s for c in middle),
        drives=tuple(
            LevelRow(name, above[name], name in inner, counted[name]) for name in sorted(counted)
        ),
    )
