"""What each device did for one piece of work, as the host saw it: a row of EXPLAIN ANALYZE.

The device's own account (``PartitionReport``: its decisions and metrics over the work stream)
plus what the host added (pushed-back ranges it fetched, raw scans of ``pushdown="never"``, a
fallback when the device could not run the work). Each slice range is counted once: a range the
device filtered was read there; a raw range is read when the host fetches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import (
    Decision,
    LevelReport,
    PartitionReport,
    TraceEntry,
    WorkMetrics,
    WorkTimes,
)

# the counters of a partition's report, summed per device in EXPLAIN ANALYZE
COUNTERS = (
    "slices_pruned",
    "slices_cached",
    "slices_answered",
    "slices_elsewhere",
    "slices_scanned",
    "slices_executed",
    "slices_pushed_back",
    "rows_read",
    "bytes_read",
    "rows_shipped",
    "bytes_shipped",
    "device_cpu_s",
)


@dataclass
class WorkReport:
    """One device, one piece of work (a query fragment, a dataset), one partition."""

    device: str
    label: str  # the fragment (SQL) or dataset (genes) the work was for
    partition: int
    mode: str  # "subplan": the device ran the unit; "scan": raw slices, the host ran it
    decisions: list[Decision] = field(default_factory=list)
    slices_total: int = 0
    slices_pruned: int = 0
    slices_cached: int = 0
    slices_answered: int = 0  # from their statistics, unread
    slices_elsewhere: int = 0  # done by a replica that stopped answering (failover)
    slices_scanned: int = 0
    slices_executed: int = 0
    slices_pushed_back: int = 0
    rows_read: int = 0
    bytes_read: int = 0
    rows_shipped: int = 0  # everything this device sent the host for this work
    bytes_shipped: int = 0
    bytes_shipped_raw: int = 0  # of which slices shipped raw (pushed back, or a scan)
    slices_raw: int = 0  # slices the host completed from raw rows
    device_cpu_s: float = 0.0
    drive_s: float = 0.0
    wall_s: float = 0.0
    decode_s: float = 0.0  # CPU this side spent decompressing raw slices shipped as stored
    # where the device's time went (its own account, summed over its exchanges)
    times: WorkTimes = WorkTimes()
    fallback: str | None = None
    trace: list[TraceEntry] | None = None
    # this device stopped answering and the rest of the partition went to a replica
    failovers: list[dict[str, Any]] = field(default_factory=list)
    # when the device is a storage server: what the drive below it did (one level down)
    below: list[LevelReport] = field(default_factory=list)

    def add_device(self, report: PartitionReport, trace: list[TraceEntry] | None) -> None:
        """The device's own account of the partition (its ``WorkDone``)."""
        m: WorkMetrics = report.metrics
        self.decisions = list(report.decisions)
        self.below.extend(report.below)
        self.slices_total = m.slices_total
        for name in (
            "slices_pruned",
            "slices_cached",
            "slices_answered",
            "slices_elsewhere",
            "slices_scanned",
            "slices_executed",
        ):
            setattr(self, name, getattr(self, name) + getattr(m, name))
        self.slices_pushed_back += m.slices_pushed_back
        self.rows_read += m.rows_read
        self.bytes_read += m.bytes_read
        self.rows_shipped += m.rows_shipped
        self.bytes_shipped += m.bytes_shipped
        self.device_cpu_s += m.device_cpu_s
        self.drive_s += m.drive_s
        self.wall_s = max(self.wall_s, m.wall_s)
        self.times = self.times.plus(m.times)
        if trace is not None:
            self.trace = [t for t in trace if t.partition == self.partition]

    def add_raw(self, slices: int, rows_read: int, bytes_read: int) -> None:
        """Raw slices the host read through the device (a fetched push back, or a scan)."""
        self.slices_scanned += slices
        self.slices_raw += slices
        self.rows_read += rows_read
        self.bytes_read += bytes_read

    def add_shipped(self, rows: int, size_bytes: int, raw: bool) -> None:
        self.rows_shipped += rows
        self.bytes_shipped += size_bytes
        if raw:
            self.bytes_shipped_raw += size_bytes

    def ranges(self, stage: Stage | Skip) -> list[list[int]]:
        return [[d.first, d.end] for d in self.decisions if d.stage == stage]

    def to_json(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["fragment"] = body.pop("label")
        body["decisions"] = [d.to_json() for d in self.decisions]
        body["times"] = self.times.to_json()
        body["below"] = [level.to_json() for level in self.below]
        if not self.below:
            del body["below"]
        if self.trace is None:
            del body["trace"]
        else:
            body["trace"] = [t.to_json() for t in self.trace]
        return body


def per_device(reports: list[WorkReport]) -> list[dict[str, Any]]:
    """EXPLAIN ANALYZE's table: the partitions' counters summed per device."""
    devices: dict[str, dict[str, Any]] = {}
    for report in reports:
        row = devices.setdefault(
            report.device,
            {
                "device": report.device,
                "partitions": 0,
                **dict.fromkeys(COUNTERS, 0),
                "decode_s": 0.0,
                "fallbacks": [],
            },
        )
        row["partitions"] += 1
        for name in COUNTERS:
            row[name] += getattr(report, name)
        row["decode_s"] += report.decode_s
        if report.fallback:
            row["fallbacks"].append(report.fallback)
        for failover in report.failovers:
            row.setdefault("failovers", []).append({"partition": report.partition, **failover})
    return [devices[name] for name in sorted(devices)]


def per_level(
    reports: list[WorkReport], server_names: set[str] = frozenset()
) -> dict[str, Any] | None:
    """Through storage servers: bytes on each kind of link and CPU seconds at each level. The
    drives' links to their servers are "PCIe"; links out of servers (to the host, or to the
    server above) the "network". Raw slices the host fetched through a server (a scan without
    pushdown, a range passed on) crossed both as they are. ``drives`` lists every device below
    the host's, each naming the server above it, servers among them when there are three
    levels. None on a flat cluster."""
    servers = [r for r in reports if r.below or r.device in server_names]
    if not servers:
        return None
    below = [level for r in servers for level in r.below]
    inner = {level.above for level in below}  # servers with devices of their own below
    rows: dict[str, dict[str, Any]] = {}
    for level in below:
        row = rows.setdefault(
            level.device,
            {
                "device": level.device,
                "above": level.above,
                "server": level.device in inner,
                **dict.fromkeys(COUNTERS, 0),
            },
        )
        for name in COUNTERS:
            row[name] += getattr(level.metrics, name)
    drives = [level for level in below if level.device not in inner]
    middle = [level for level in below if level.device in inner]
    return {
        "drive_links_bytes": sum(level.metrics.bytes_shipped for level in drives)
        + sum(r.bytes_shipped_raw for r in servers),
        "network_bytes": sum(r.bytes_shipped for r in servers)
        + sum(level.metrics.bytes_shipped for level in middle),
        "drives_bytes_read": sum(r.bytes_read for r in servers),  # all read by drives
        "drives_cpu_s": sum(level.metrics.device_cpu_s for level in drives),
        "servers_cpu_s": sum(r.device_cpu_s for r in servers)
        + sum(level.metrics.device_cpu_s for level in middle),
        "drives": [rows[name] for name in sorted(rows)],
    }
