"""``quarry scrub``: every slice of every device read and checked, and what is damaged mended
from a good copy (DESIGN §2a, "Integrity"; docs/integrity.md).

Each device scrubs its own slices (``Scrub``, run on the device: only the findings cross the
network), a partition at a time in ranges of slices sized so each call reads about
``SCRUB_CALL_S`` worth at the rate allowed; the devices go at once, each at most
``bytes_per_s`` off its store, so foreground queries keep their drives. Then ``repair`` mends
what any device found (and any deficit), and each device keeps a summary of its scrub for
``quarry status`` (``Scrubbed``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quarry import threads
from quarry.coordinator.admin.repair import BANDWIDTH_BYTES_PER_S_DEFAULT, RepairReport, repair
from quarry.errors import DeviceUnavailable, QuarryError
from quarry.protocol.integrity import (
    SCRUB_BYTES_PER_S_MAX,
    CorruptCopy,
    IntegrityReply,
    Scrub,
    Scrubbed,
    ScrubReply,
    ScrubSummary,
)
from quarry.records import Record

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry, PartitionEntry
    from quarry.coordinator.membership.device_client import DeviceClient
    from quarry.coordinator.membership.membership import Membership

SCRUB_CALL_S = 5.0  # each call to a device reads about this long at the allowed rate
SLICES_PER_CALL_MAX = 4096
DEVICES_AT_ONCE_MAX = 64
Progress = Callable[[int, int], None]  # slices scrubbed so far, of how many


@dataclass(frozen=True)
class DeviceScrub(Record):
    """What scrubbing one device read and found."""

    device: str
    partitions: int = 0
    slices: int = 0
    rows: int = 0
    bytes_read: int = 0
    unverified: int = 0  # slices written before checksums: decoded and checked, not verified
    corrupt: tuple[CorruptCopy, ...] = ()
    zone_maps_fixed: int = 0
    catalogs_fixed: int = 0
    seconds: float = 0.0
    error: str | None = None  # why it could not be scrubbed (down, a storage server)


@dataclass
class ScrubReport(Record):
    """``quarry scrub --json``: each device's scrub, then the repair of what they found."""

    devices: list[DeviceScrub] = field(default_factory=list)
    repair: RepairReport | None = None
    seconds: float = 0.0

    @property
    def corrupt(self) -> int:
        return sum(len(d.corrupt) for d in self.devices)

    @property
    def clean(self) -> bool:
        """Nothing damaged found, nothing left unmended, every device scrubbed."""
        unmended = self.repair.unmended if self.repair is not None else []
        return not self.corrupt and not unmended and all(d.error is None for d in self.devices)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "corrupt": self.corrupt, "clean": self.clean}


def scrub(
    cluster: Membership,
    bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT,
    progress: Progress | None = None,
    mend: bool = True,
) -> ScrubReport:
    """Scrub every device that answers, at most ``bytes_per_s`` each, then (``mend``) repair
    what they found from good copies."""
    started = time.perf_counter()
    cluster.refresh()
    plans = {name: _held(cluster, name) for name in sorted(cluster.devices)}
    total = sum(p.slices or 1 for plan in plans.values() for _, p in plan)
    counted = _Counted(total, progress)
    futures: dict[str, Future[DeviceScrub]] = {name: Future() for name in plans}

    def run(name: str) -> None:
        futures[name].set_result(_device(cluster, name, plans[name], bytes_per_s, counted))

    width = max(1, min(len(plans), DEVICES_AT_ONCE_MAX))
    threads.lanes([(lambda name=name: run(name)) for name in plans], width, "quarry-scrub")
    report = ScrubReport([futures[name].result() for name in plans])
    if mend:
        report.repair = repair(cluster, bytes_per_s)
    report.seconds = time.perf_counter() - started
    _remember(cluster, report, started_at=time.time() - report.seconds)
    return report


def _held(cluster: Membership, device: str) -> list[tuple[DatasetEntry, PartitionEntry]]:
    return [
        (entry, p)
        for entry in cluster.catalog.values()
        for p in entry.partitions
        if device in p.devices
    ]


class _Counted:
    """Slices scrubbed over every device, told to ``progress`` as they go."""

    def __init__(self, total: int, progress: Progress | None):
        self.total = total
        self.done = 0
        self.progress = progress
        self._lock = threading.Lock()

    def add(self, slices: int) -> None:
        with self._lock:
            self.done += slices
            if self.progress is not None:
                self.progress(self.done, self.total)


def _device(
    cluster: Membership,
    name: str,
    held: list[tuple[DatasetEntry, PartitionEntry]],
    bytes_per_s: float,
    counted: _Counted,
) -> DeviceScrub:
    """Scrub one device, partition by partition, a bounded range of slices per call."""
    started = time.perf_counter()
    if name in cluster.down:
        counted.add(sum(p.slices or 1 for _, p in held))
        return DeviceScrub(name, error=f"does not answer: {cluster.down[name]}")
    client = cluster.devices[name]
    replies: list[ScrubReply] = []
    try:
        for entry, p in held:
            replies.extend(_partition(client, entry, p, bytes_per_s, counted))
    except QuarryError as error:  # down meanwhile, or a storage server (its drives scrub)
        return DeviceScrub(name, error=str(error), seconds=time.perf_counter() - started)
    return DeviceScrub(
        name,
        partitions=len(held),
        slices=sum(r.slices for r in replies),
        rows=sum(r.rows for r in replies),
        bytes_read=sum(r.bytes_read for r in replies),
        unverified=sum(r.unverified for r in replies),
        corrupt=tuple(c for r in replies for c in r.corrupt),
        zone_maps_fixed=sum(r.zone_maps_fixed for r in replies),
        catalogs_fixed=sum(r.catalog_fixed for r in replies),
        seconds=time.perf_counter() - started,
    )


def _partition(
    client: DeviceClient,
    entry: DatasetEntry,
    p: PartitionEntry,
    bytes_per_s: float,
    counted: _Counted,
) -> list[ScrubReply]:
    slice_bytes = max(1, p.bytes_stored // max(1, p.slices))
    per_call = max(1, min(SLICES_PER_CALL_MAX, int(bytes_per_s * SCRUB_CALL_S / slice_bytes)))
    replies: list[ScrubReply] = []
    whole, told, first = max(1, p.slices), 0, 0
    while True:  # once at least: a partition of no slices still has its metadata checked
        end = min(first + per_call, p.slices)
        rate = min(bytes_per_s, SCRUB_BYTES_PER_S_MAX)
        request = Scrub(entry.domain, entry.name, p.partition, first, end, rate)
        reply = client.ask(request, ScrubReply)
        replies.append(reply)
        damaged = not reply.slices_total and p.slices  # its metadata slice: nothing more
        done = whole if damaged else min(whole, max(1, end))
        counted.add(done - told)
        told, first = done, end
        if first >= p.slices or damaged:
            return replies


def _remember(cluster: Membership, report: ScrubReport, started_at: float) -> None:
    """Each device scrubbed keeps the summary of its scrub (``quarry status`` shows it)."""
    mended = report.repair.mended if report.repair is not None else []
    for scrubbed in report.devices:
        if scrubbed.error is not None:
            continue
        summary = ScrubSummary(
            started_at=started_at,
            finished_at=time.time(),
            partitions=scrubbed.partitions,
            slices=scrubbed.slices,
            bytes_read=scrubbed.bytes_read,
            corrupt=len(scrubbed.corrupt),
            repaired=sum(1 for m in mended if m.copy.device == scrubbed.device),
            zone_maps_fixed=scrubbed.zone_maps_fixed,
            unverified=scrubbed.unverified,
        )
        try:
            cluster.devices[scrubbed.device].ask(Scrubbed(summary), IntegrityReply)
        except (DeviceUnavailable, QuarryError):
            continue  # its next scrub says it again
