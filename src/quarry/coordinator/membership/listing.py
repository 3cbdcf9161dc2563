"""What a user is shown of a cluster: each device's status, the datasets listed and described.

``Cluster.status()``, ``datasets()`` and ``describe()`` return these records; their
``to_json()`` is what ``quarry status --json``, ``quarry datasets --json`` and ``quarry
describe --json`` print (the shapes are in docs/architecture.md, "What a user holds"). A field
renamed here is a type error where it is read, not a ``KeyError`` in a script.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Self

from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.protocol.control import IngestRecord, StatsReply


@dataclass(frozen=True)
class DeviceStatus:
    """One device as ``quarry status`` shows it: up, with its profile, process and counts, or
    down, with why."""

    device: str
    address: str
    up: bool
    error: str | None = None  # why it does not answer (down only)
    profile: str | None = None
    pid: int | None = None
    stats: StatsReply | None = None  # its keys, partitions, work running and refused (up only)
    # its failure domain: the host it runs on, its rack ("" none), as it says (or the file)
    host: str = ""
    rack: str = ""
    drained: bool = False  # ``quarry device drain`` emptied it: it takes nothing new

    def __post_init__(self) -> None:
        assert self.up == (self.stats is not None), f"{self.device}: counts come from a live one"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"device": self.device, "address": self.address, "up": self.up}
        if self.stats is None:
            body["error"] = self.error
        else:
            body.update({"profile": self.profile, "pid": self.pid, **self.stats.to_json()})
        body.update({"host": self.host, "rack": self.rack, "drained": self.drained})
        return body


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as Arrow prints it: int64, double, string, timestamp[us] ...

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type}


@dataclass(frozen=True)
class DeviceShare:
    """What one device holds of a dataset: partitions (replicas count on each) and rows."""

    partitions: int
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "rows": self.rows}


@dataclass(frozen=True)
class DatasetSummary:
    """One dataset as ``quarry datasets`` lists it. Rows, partitions and bytes count what
    answers; ``unavailable_partitions`` names the partitions whose every holder is down."""

    dataset: str  # domain/name
    rows: int
    partitions: int
    slices: int
    bytes_stored: int
    bytes_arrow: int
    compression: str
    replicas: int
    cluster_by: tuple[str, ...]
    columns: tuple[Column, ...]
    devices: dict[str, DeviceShare]  # by device name, sorted
    metadata: dict[str, str]
    version: str
    available: bool
    unavailable_partitions: dict[int, tuple[str, ...]]  # partition -> the devices it is on

    @classmethod
    def of(cls, entry: DatasetEntry) -> Self:
        return cls(**_summary_fields(entry))

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "rows": self.rows,
            "partitions": self.partitions,
            "slices": self.slices,
            "bytes_stored": self.bytes_stored,
            "bytes_arrow": self.bytes_arrow,
            "compression": self.compression,
            "replicas": self.replicas,
            "cluster_by": list(self.cluster_by),
            "columns": [c.to_json() for c in self.columns],
            "devices": {name: share.to_json() for name, share in self.devices.items()},
            "metadata": dict(self.metadata),
            "version": self.version,
            "available": self.available,
            "unavailable_partitions": {
                str(p): list(d) for p, d in self.unavailable_partitions.items()
            },
        }


def _summary_fields(entry: DatasetEntry) -> dict[str, Any]:
    by_device: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in entry.partitions:
        for device in p.devices:
            by_device[device][0] += 1
            by_device[device][1] += p.rows
    return {
        "dataset": entry.qualified,
        "rows": entry.rows,
        "partitions": len(entry.partitions),
        "slices": sum(p.slices for p in entry.partitions),
        "bytes_stored": entry.bytes_stored,
        "bytes_arrow": entry.bytes_arrow,
        "compression": entry.compression,
        "replicas": entry.ingests[0].replicas,
        "cluster_by": tuple(sorted({i.cluster_by for i in entry.ingests if i.cluster_by})),
        "columns": tuple(Column(f.name, str(f.type)) for f in entry.schema),
        "devices": {d: DeviceShare(*counts) for d, counts in sorted(by_device.items())},
        "metadata": dict(entry.metadata),
        "version": entry.version,
        "available": not entry.unavailable,
        "unavailable_partitions": {p: tuple(d) for p, d in sorted(entry.unavailable.items())},
    }


@dataclass(frozen=True)
class PartitionDetail:
    partition: int
    rows: int
    slices: int
    bytes_stored: int
    devices: tuple[str, ...]  # the replicas that hold it, in placement order

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "rows": self.rows,
            "slices": self.slices,
            "bytes_stored": self.bytes_stored,
            "devices": list(self.devices),
        }


@dataclass(frozen=True)
class DatasetDescription(DatasetSummary):
    """One dataset as ``quarry describe`` shows it: its summary, each partition, the ingests
    that made it (without their placement, which ``partitions_detail`` shows as it is now) and
    its physical design hints."""

    partitions_detail: tuple[PartitionDetail, ...] = ()
    ingests: tuple[IngestRecord, ...] = ()
    hints: dict[str, Any] = field(default_factory=dict)  # free-form, as the ingest gave them

    @classmethod
    def of(cls, entry: DatasetEntry) -> Self:
        detail = tuple(
            PartitionDetail(p.partition, p.rows, p.slices, p.bytes_stored, tuple(p.devices))
            for p in entry.partitions
        )
        return cls(
            **_summary_fields(entry),
            partitions_detail=detail,
            ingests=tuple(entry.ingests),
            hints=dict(entry.hints),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "partitions_detail": [p.to_json() for p in self.partitions_detail],
            "ingests": [
                {k: v for k, v in i.to_json().items() if k != "placement"} for i in self.ingests
            ],
            "hints": self.hints,
        }
