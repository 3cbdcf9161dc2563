"""The coordinator's catalog: a cache rebuilt from what the devices say they hold.

A dataset is listed only when every partition of its creating ingest is committed on as many
devices as it asked replicas; an append shows only once it is whole too. There is no central
metadata server: ask the devices again and the same catalog comes back.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from quarry.protocol.control import IngestRecord, PartitionSummary


@dataclass
class PartitionEntry:
    partition: int
    rows: int
    slices: int
    bytes_stored: int
    bytes_arrow: int
    devices: list[str]  # replicas that hold it, in placement order
    verified: bool = False  # every copy's slices carry checksums (checked on every read)


@dataclass
class DatasetEntry:
    domain: str
    name: str
    schema: pa.Schema
    compression: str
    metadata: dict[str, str]
    hints: dict[str, Any]
    ingests: list[IngestRecord]
    partitions: list[PartitionEntry] = field(default_factory=list)
    # Partitions whose every replica sits on a device that does not answer right now.
    unavailable: dict[int, list[str]] = field(default_factory=dict)
    # what the ingest that returned it has to say (replicas that must share a host...)
    warnings: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.domain}/{self.name}"

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def bytes_stored(self) -> int:
        return sum(p.bytes_stored for p in self.partitions)

    @property
    def bytes_arrow(self) -> int:
        return sum(p.bytes_arrow for p in self.partitions)

    @property
    def version(self) -> str:
        """Changes whenever the dataset is re-ingested or appended to (cache keys use it)."""
        ids = ",".join(sorted(i.id for i in self.ingests))
        return hashlib.blake2b(ids.encode(), digest_size=8).hexdigest()

    def unavailable_message(self) -> str:
        devices = sorted({d for ds in self.unavailable.values() for d in ds})
        return (
            f"dataset {self.qualified} is unavailable: partitions "
            f"{sorted(self.unavailable)} are only on device(s) {', '.join(devices)}, which do "
            "not answer. Start them (quarry status shows which) and try again."
        )

    def partitions_by_device(self) -> dict[str, list[int]]:
        placement: dict[str, list[int]] = defaultdict(list)
        for p in self.partitions:
            for device in p.devices:
                placement[device].append(p.partition)
        return dict(placement)


@dataclass
class _Ingest:
    """One ingest of a dataset as the devices report it: its record, and per partition the
    devices holding it (with their summaries)."""

    record: IngestRecord
    parts: dict[int, list[tuple[str, PartitionSummary]]] = field(default_factory=dict)


def build(
    inventories: dict[str, list[PartitionSummary]],
    down: frozenset[str] = frozenset(),
    members: frozenset[str] | None = None,
) -> dict[str, DatasetEntry]:
    """Assemble datasets from each device's inventory (device name -> partition summaries).

    ``down`` names devices that did not answer, and a device placement names that is not one
    of ``members`` (removed from the cluster) counts as down: a partition missing only because
    its devices are gone keeps its dataset listed, marked unavailable (or under-replicated,
    for repair), rather than making it vanish.
    """
    if members is not None:
        placed = {
            device
            for summaries in inventories.values()
            for summary in summaries
            for devices in summary.ingest.placement.values()
            for device in devices
        }
        down = down | frozenset(placed - members)
    by_dataset: dict[tuple[str, str], dict[str, _Ingest]] = defaultdict(dict)
    for device, summaries in inventories.items():
        for summary in summaries:
            ingests = by_dataset[(summary.domain, summary.dataset)]
            ingest = ingests.setdefault(summary.ingest.id, _Ingest(summary.ingest))
            ingest.parts.setdefault(summary.partition, []).append((device, summary))

    catalog: dict[str, DatasetEntry] = {}
    for (domain, dataset), ingests in by_dataset.items():
        complete = [i for i in ingests.values() if _complete(i, down)]
        complete.sort(key=lambda i: i.record.created_at)
        if not complete or complete[0].record.mode != "create":
            continue
        first = next(iter(complete[0].parts.values()))[0][1]
        entry = DatasetEntry(
            domain=domain,
            name=dataset,
            schema=first.schema,
            compression=first.compression,
            metadata=first.metadata,
            hints=first.hints,
            ingests=[i.record for i in complete],
        )
        for ingest in complete:
            for partition in _expected(ingest.record):
                held = ingest.parts.get(partition)
                if not held:
                    entry.unavailable[partition] = _claimed(ingest, partition)
                    continue
                summary = held[0][1]
                entry.partitions.append(
                    PartitionEntry(
                        partition=partition,
                        rows=summary.rows,
                        slices=summary.slices,
                        bytes_stored=summary.bytes_stored,
                        bytes_arrow=summary.bytes_arrow,
                        devices=_in_placement_order(ingest, partition, held),
                        verified=all(s.verified for _, s in held),
                    )
                )
        catalog[entry.qualified] = entry
    return dict(sorted(catalog.items()))


def missed_commits(inventories: dict[str, list[PartitionSummary]]) -> dict[str, set[str]]:
    """Per device that answers, the ingests it was placed in and does not list though their
    decider lists them committed: it missed the commit (it was cut off when it was sent) and
    holds its partitions pending until its lease runs out and it asks the decider. Committing
    them now is what it would do then; a device that holds nothing of them commits nothing."""
    held = {
        (device, summary.ingest.id, summary.partition)
        for device, summaries in inventories.items()
        for summary in summaries
    }
    decided = {
        summary.ingest.id: summary.ingest
        for device, summaries in inventories.items()
        for summary in summaries
        if summary.ingest.decider == device
    }
    missed: dict[str, set[str]] = defaultdict(set)
    for ingest_id, record in decided.items():
        for partition, devices in record.placement.items():
            for device in devices:
                if device in inventories and (device, ingest_id, int(partition)) not in held:
                    missed[device].add(ingest_id)
    return dict(missed)


def _in_placement_order(
    ingest: _Ingest, partition: int, held: list[tuple[str, PartitionSummary]]
) -> list[str]:
    """The devices holding a partition, as its ingest placed them (then any others, such as a
    repair's copy, by name): a failover tries its replicas in this order."""
    order = {device: rank for rank, device in enumerate(_claimed(ingest, partition))}
    return sorted((device for device, _ in held), key=lambda d: (order.get(d, len(order)), d))


def _expected(ingest: IngestRecord) -> range:
    return range(ingest.first_partition, ingest.first_partition + ingest.partitions)


def _claimed(ingest: _Ingest, partition: int) -> list[str]:
    """The devices that should hold a partition: as its holders remember it (a move rewrites
    it on every holder before the device it leaves lets it go), else as the ingest placed it."""
    held = ingest.parts.get(partition, [])
    records = [summary.ingest for _, summary in held] or [ingest.record]
    claimed: list[str] = []
    for record in records:
        for device in record.placement.get(str(partition), []):
            if device not in claimed:
                claimed.append(device)
    return claimed


def _complete(ingest: _Ingest, down: frozenset[str]) -> bool:
    for partition in _expected(ingest.record):
        holders = [device for device, _ in ingest.parts.get(partition, [])]
        missing = [d for d in _claimed(ingest, partition) if d not in holders]
        if len(holders) < ingest.record.replicas and not (missing and set(missing) <= down):
            return False
    return True
