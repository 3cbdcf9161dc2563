"""Repair: partitions back at their replica count, copied from a surviving replica.

A partition is under-replicated when fewer devices that answer hold it than its ingest asked.
``repair`` copies each one from a replica that answers to the device that ranks highest for it
(rendezvous weight) among those that answer, do not hold it and are not drained, in a rack
(then on a host) none of its replicas is in while one exists, slice by slice with the same
slice boundaries (so slice numbers name the same rows on every replica, as failover needs), at
a bounded rate so foreground queries keep their links. The copy is written pending under the
partition's ingest, its lease renewed while it streams (``QUARRY_INGEST_LEASE_S``), and
committed on the target alone: a copy cut short (the repair's process gone, or a link cut
silently) is settled by the target itself once its lease runs out (unfinished, it is dropped).
No central server: any coordinator computes the same deficits and targets from the devices'
own inventories. A move (``rebalance``) copies the same way.

Damaged copies the devices remember (a slice or metadata slice that failed its checksum) are
mended first, each from a good copy on another replica (``mend``): one slice, or one metadata
slice, rewritten in place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry.coordinator.admin.mend import Mended, Unmended, damaged_copies, mend
from quarry.coordinator.ingest.atomic import Renewer, lease_seconds
from quarry.coordinator.membership.device_client import DeviceClient, finish_put
from quarry.coordinator.membership.placement import apart, weight
from quarry.errors import DeviceUnavailable, QuarryError
from quarry.protocol.control import IngestRecord
from quarry.protocol.ingest import PutPartition

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry, PartitionEntry
    from quarry.coordinator.membership.membership import Membership

BANDWIDTH_BYTES_PER_S_DEFAULT = 200e6  # a repair's share of the links; foreground keeps the rest


@dataclass(frozen=True)
class Deficit:
    """A partition held by fewer devices that answer than its ingest asked."""

    dataset: str
    partition: int
    holders: tuple[str, ...]
    replicas: int

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "partition": self.partition,
            "holders": list(self.holders),
            "replicas": self.replicas,
        }


@dataclass
class RepairReport:
    copied: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    unavailable: list[dict[str, Any]] = field(default_factory=list)  # no replica answers
    bytes_copied: int = 0
    seconds: float = 0.0
    mended: list[Mended] = field(default_factory=list)  # damaged copies made good
    unmended: list[Unmended] = field(default_factory=list)  # and those left as they are

    def to_json(self) -> dict[str, Any]:
        return {
            "copied": self.copied,
            "failed": self.failed,
            "unavailable": self.unavailable,
            "bytes_copied": self.bytes_copied,
            "seconds": round(self.seconds, 3),
            "mended": [m.to_json() for m in self.mended],
            "unmended": [u.to_json() for u in self.unmended],
        }


def record_of(entry: DatasetEntry, partition: int) -> IngestRecord:
    for record in entry.ingests:
        if record.first_partition <= partition < record.first_partition + record.partitions:
            return record
    raise AssertionError(f"partition {partition} of {entry.qualified} belongs to no ingest")


def deficits(cluster: Membership) -> list[Deficit]:
    """Every partition that answers from fewer devices than its ingest's replica count."""
    found = []
    for entry in cluster.catalog.values():
        for p in entry.partitions:
            wanted = record_of(entry, p.partition).replicas
            if len(p.devices) < wanted:
                found.append(Deficit(entry.qualified, p.partition, tuple(p.devices), wanted))
    return found


def repair(
    cluster: Membership, bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S_DEFAULT
) -> RepairReport:
    """Copy every under-replicated partition until it is back at its replica count."""
    started = time.perf_counter()
    cluster.refresh()
    report = RepairReport()
    for entry in cluster.catalog.values():
        for partition in sorted(entry.unavailable):
            report.unavailable.append({"dataset": entry.qualified, "partition": partition})
    bucket = Bucket(bandwidth_bytes_per_s)
    report.mended, report.unmended = mend(cluster, damaged_copies(cluster), bucket.take)
    for deficit in deficits(cluster):
        entry = cluster.entry(deficit.dataset)
        p = next(p for p in entry.partitions if p.partition == deficit.partition)
        for target in _targets(cluster, entry, p)[: deficit.replicas - len(deficit.holders)]:
            try:
                copied = copy_partition(cluster, entry, p, target, bucket)
            except QuarryError as error:
                report.failed.append({**deficit.to_json(), "to": target, "error": str(error)})
                continue
            report.bytes_copied += copied
            report.copied.append({**deficit.to_json(), "to": target, "bytes": copied})
    cluster.refresh()
    report.seconds = time.perf_counter() - started
    return report


def _targets(cluster: Membership, entry: DatasetEntry, p: PartitionEntry) -> list[str]:
    """Devices that answer, are not drained and do not hold the partition: those in a rack,
    then on a host, that none of its replicas is in first; within each, highest rendezvous
    weight first."""
    domains = cluster.domains()
    live = [c.name for c in cluster.placing_devices() if c.name not in p.devices]
    held = [d for d in p.devices if d in domains]
    return sorted(
        live,
        key=lambda name: (
            -apart(name, held, domains),
            -weight(entry.qualified, p.partition, name),
        ),
    )


def copy_partition(
    cluster: Membership,
    entry: DatasetEntry,
    p: PartitionEntry,
    target: str,
    bucket: Bucket,
    source: str | None = None,
    holders: list[str] | None = None,
    copied_bytes: Callable[[int], None] | None = None,
) -> int:
    """Copy partition ``p`` from ``source`` (a replica that answers, by default) to ``target``,
    slice by slice at the bucket's rate, and commit it there; the bytes it carried. The copy
    remembers ``holders`` as the devices that hold the partition (a move's new set), and says
    where it comes from so ``quarry status`` lists it in flight; ``copied_bytes`` hears each
    batch (a progress bar)."""
    reader_client = cluster.devices[source] if source is not None else _source(cluster, p)
    description = reader_client.describe(entry.domain, entry.name, p.partition)
    summary = description.summary
    # The target decides its own copy: pending until committed here, settled by itself if cut
    # short (it is the decider; an unfinished copy is dropped).
    target_client = cluster.devices[target]
    record = replace(summary.ingest, decider=target, addresses={target: target_client.address})
    if holders is not None:
        record = replace(record, placement={**record.placement, str(p.partition): holders})
    lease_s = lease_seconds()
    request = PutPartition(
        domain=entry.domain,
        dataset=entry.name,
        partition=p.partition,
        ingest=record,
        compression=summary.compression,
        metadata=summary.metadata,
        hints=summary.hints,
        lease_s=lease_s,
        slice_rows=description.slices[0].rows if description.slices else None,
        copy_from=reader_client.name,
        copy_bytes=summary.bytes_arrow,
    )
    copied = 0
    # renewed while the rows stream (a copy at a bounded rate may outlast one lease)
    with Renewer([target_client], record.id, lease_s):
        writer, reader = target_client.open_put(request, summary.schema)
        try:
            scan = reader_client.scan(entry.domain, entry.name, p.partition)
            for batch in reader_client.batches(scan):
                size = pa.ipc.get_record_batch_size(batch)
                bucket.take(size)
                target_client.guard(lambda b=batch: writer.write_batch(b))
                copied += size
                if copied_bytes is not None:
                    copied_bytes(batch.nbytes)
            target_client.guard(lambda: finish_put(writer, reader))
        except BaseException:
            with contextlib.suppress(QuarryError):  # else the target drops it when its lease ends
                target_client.abort(record.id)
            raise
        if p.partition not in target_client.commit(record.id):
            raise QuarryError(f"device {target} did not commit its copy of partition {p.partition}")
    return copied


def _source(cluster: Membership, p: PartitionEntry) -> DeviceClient:
    for name in p.devices:
        if name not in cluster.down:
            return cluster.devices[name]
    raise DeviceUnavailable(f"no replica of partition {p.partition} answers")


class Bucket:
    """Bytes per second for a whole repair or rebalance (a token bucket without burst)."""

    def __init__(self, bytes_per_s: float):
        assert bytes_per_s > 0
        self.bytes_per_s = bytes_per_s
        self.next_free = time.monotonic()

    def take(self, size_bytes: int) -> None:
        now = time.monotonic()
        start = max(now, self.next_free)
        self.next_free = start + size_bytes / self.bytes_per_s
        if start > now:
            time.sleep(start - now)
