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

from quarry.store.partition import schema_from_text


@dataclass
class PartitionEntry:
    partition: int
    rows: int
    slices: int
    bytes_stored: int
    bytes_arrow: int
    devices: list[str]  # replicas that hold it, in placement order


@dataclass
class DatasetEntry:
    domain: str
    name: str
    schema: pa.Schema
    compression: str
    metadata: dict[str, str]
    hints: dict[str, Any]
    ingests: list[dict[str, Any]]
    partitions: list[PartitionEntry] = field(default_factory=list)
    # Partitions whose every replica sits on a device that does not answer right now.
    unavailable: dict[int, list[str]] = field(default_factory=dict)

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
        ids = ",".join(sorted(i["id"] for i in self.ingests))
        return hashlib.blake2b(ids.encode(), digest_size=8).hexdigest()

    def partitions_by_device(self) -> dict[str, list[int]]:
        placement: dict[str, list[int]] = defaultdict(list)
        for p in self.partitions:
            for device in p.devices:
                placement[device].append(p.partition)
        return dict(placement)

    def to_json(self) -> dict[str, Any]:
        by_device: dict[str, dict[str, int]] = defaultdict(lambda: {"partitions": 0, "rows": 0})
        for p in self.partitions:
            for device in p.devices:
                by_device[device]["partitions"] += 1
                by_device[device]["rows"] += p.rows
        return {
            "dataset": self.qualified,
            "rows": self.rows,
            "partitions": len(self.partitions),
            "slices": sum(p.slices for p in self.partitions),
            "bytes_stored": self.bytes_stored,
            "bytes_arrow": self.bytes_arrow,
            "compression": self.compression,
            "replicas": self.ingests[0]["replicas"],
            "columns": [{"name": f.name, "type": str(f.type)} for f in self.schema],
            "devices": dict(sorted(by_device.items())),
            "metadata": self.metadata,
            "version": self.version,
            "available": not self.unavailable,
            "unavailable_partitions": {str(p): d for p, d in sorted(self.unavailable.items())},
        }


def build(
    inventories: dict[str, list[dict[str, Any]]], down: frozenset[str] = frozenset()
) -> dict[str, DatasetEntry]:
    """Assemble datasets from each device's inventory (device name -> partition summaries).

    ``down`` names devices that did not answer: a partition missing only because its devices
    are down keeps its dataset listed, marked unavailable, rather than making it vanish.
    """
    holders: dict[tuple[str, str, int], list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for device, entries in inventories.items():
        for entry in entries:
            holders[(entry["domain"], entry["dataset"], entry["partition"])].append((device, entry))

    by_dataset: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for (domain, dataset, partition), held in holders.items():
        ingest = held[0][1]["ingest"]
        by_dataset[(domain, dataset)].setdefault(ingest["id"], {"ingest": ingest, "parts": {}})
        by_dataset[(domain, dataset)][ingest["id"]]["parts"][partition] = held

    catalog: dict[str, DatasetEntry] = {}
    for (domain, dataset), ingests in by_dataset.items():
        complete = [i for i in ingests.values() if _complete(i["ingest"], i["parts"], down)]
        complete.sort(key=lambda i: i["ingest"]["created_at"])
        if not complete or complete[0]["ingest"]["mode"] != "create":
            continue
        first = next(iter(complete[0]["parts"].values()))[0][1]
        entry = DatasetEntry(
            domain=domain,
            name=dataset,
            schema=schema_from_text(first["schema"]),
            compression=first["compression"],
            metadata=first.get("metadata", {}),
            hints=first.get("hints", {}),
            ingests=[i["ingest"] for i in complete],
        )
        for ingest in complete:
            for partition in _expected(ingest["ingest"]):
                held = ingest["parts"].get(partition)
                if not held:
                    entry.unavailable[partition] = _placement(ingest["ingest"], partition)
                    continue
                summary = held[0][1]
                entry.partitions.append(
                    PartitionEntry(
                        partition=partition,
                        rows=summary["rows"],
                        slices=summary["slices"],
                        bytes_stored=summary["bytes_stored"],
                        bytes_arrow=summary["bytes_arrow"],
                        devices=[device for device, _ in held],
                    )
                )
        catalog[entry.qualified] = entry
    return dict(sorted(catalog.items()))


def _expected(ingest: dict[str, Any]) -> range:
    return range(ingest["first_partition"], ingest["first_partition"] + ingest["partitions"])


def _placement(ingest: dict[str, Any], partition: int) -> list[str]:
    return list(ingest.get("placement", {}).get(str(partition), []))


def _complete(ingest: dict[str, Any], parts: dict[int, list[Any]], down: frozenset[str]) -> bool:
    for partition in _expected(ingest):
        holders = {device for device, _ in parts.get(partition, [])}
        missing = [d for d in _placement(ingest, partition) if d not in holders]
        if len(holders) < ingest["replicas"] and not (missing and set(missing) <= down):
            return False
    return True
