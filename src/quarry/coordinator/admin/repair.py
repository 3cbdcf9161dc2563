"""Repair: partitions back at their replica count, copied from a surviving replica.

A partition is under-replicated when fewer devices that answer hold it than its ingest asked.
``repair`` copies each one from a replica that answers to the device that ranks highest for it
(rendezvous weight) among those that answer and do not hold it, slice by slice with the same
slice boundaries (so slice numbers name the same rows on every replica, as failover needs), at
a bounded rate so foreground queries keep their links. The copy is written pending under the
partition's ingest, its lease renewed while it streams (``QUARRY_INGEST_LEASE_S``), and
committed on the target alone: a copy cut short (the repair's process gone, or a link cut
silently) is settled by the target itself once its lease runs out (unfinished, it is dropped).
No central server: any coordinator computes the same deficits and targets from the devices'
own inventories.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry.coordinator.ingest.atomic import Renewer, lease_seconds
from quarry.coordinator.membership.device_client import DeviceClient, finish_put
from quarry.coordinator.membership.placement import weight
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

    def to_json(self) -> dict[str, Any]:
        return {
            "copied": self.copied,
            "failed": self.failed,
            "unavailable": self.unavailable,
            "bytes_copied": self.bytes_copied,
            "seconds": round(self.seconds, 3),
        }


def _record_of(entry: DatasetEntry, partition: int) -> IngestRecord:
    for record in entry.ingests:
        if record.first_partition <= partition < record.first_partition + record.partitions:
            return record
    raise AssertionError(f"partition {partition} of {entry.qualified} belongs to no ingest")


def deficits(cluster: Membership) -> list[Deficit]:
    """Every partition that answers from fewer devices than its ingest's replica count."""
    found = []
    for entry in cluster.catalog.values():
        for p in entry.partitions:
            wanted = _record_of(entry, p.partition).replicas
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
    bucket = _Bucket(bandwidth_bytes_per_s)
    for deficit in deficits(cluster):
        entry = cluster.entry(deficit.dataset)
        p = next(p for p in entry.partitions if p.partition == deficit.partition)
        for target in _targets(cluster, entry, p)[: deficit.replicas - len(deficit.holders)]:
            try:
                copied = _copy(cluster, entry, p, target, bucket)
            except QuarryError as error:
                report.failed.append({**deficit.to_json(), "to": target, "error": str(error)})
                continue
            report.bytes_copied += copied
            report.copied.append({**deficit.to_json(), "to": target, "bytes": copied})
    cluster.refresh()
    report.seconds = time.perf_counter() - started
    return report


def _targets(cluster: Membership, entry: DatasetEntry, p: PartitionEntry) -> list[str]:
    """Devices that answer and do not hold the partition, highest rendezvous weight first."""
    free = [c.name for c in cluster.live_devices() if c.name not in p.devices]
    return sorted(free, key=lambda name: -weight(entry.qualified, p.partition, name))


def _copy(
    cluster: Membership,
    entry: DatasetEntry,
    p: PartitionEntry,
    target: str,
    bucket: _Bucket,
) -> int:
    source = _source(cluster, p)
    description = source.describe(entry.domain, entry.name, p.partition)
    summary = description.summary
    # The target decides its own copy: pending until committed here, settled by itself if cut
    # short (it is the decider; an unfinished copy is dropped).
    target_client = cluster.devices[target]
    record = replace(summary.ingest, decider=target, addresses={target: target_client.address})
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
    )
    copied = 0
    with Renewer([target_client], record.id, lease_s):
        writer, reader = target_client.open_put(request, summary.schema)
        try:
            for batch in source.batches(source.scan(entry.domain, entry.name, p.partition)):
                size = pa.ipc.get_record_batch_size(batch)
                bucket.take(size)
                target_client.guard(lambda b=batch: writer.write_batch(b))
                copied += size
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


class _Bucket:
    """Bytes per second for the whole repair (a token bucket without burst)."""

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
