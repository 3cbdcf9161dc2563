"""What `quarry status`, `quarry datasets` and `quarry describe` print with --json: the typed
records' ``to_json`` keeps the shapes scripts already read."""

from __future__ import annotations

import pyarrow as pa

from quarry.coordinator.membership import catalog
from quarry.coordinator.membership.listing import DatasetDescription, DatasetSummary, DeviceStatus
from quarry.protocol.control import IngestRecord, PartitionSummary, StatsReply

SCHEMA = pa.schema([("id", pa.int64()), ("ke", pa.float64())])


def _catalog(down: frozenset[str] = frozenset()) -> dict[str, catalog.DatasetEntry]:
    """physics/particles: three partitions, two replicas each over three devices."""
    placement = {"0": ["dev0", "dev1"], "1": ["dev1", "dev2"], "2": ["dev2", "dev0"]}
    ingest = IngestRecord(
        id="i1", first_partition=0, partitions=3, replicas=2, placement=placement, cluster_by="ke"
    )
    inventories: dict[str, list[PartitionSummary]] = {}
    for partition, devices in placement.items():
        for device in devices:
            if device in down:
                continue
            summary = PartitionSummary(
                domain="physics",
                dataset="particles",
                partition=int(partition),
                ingest=ingest,
                schema=SCHEMA,
                compression="zstd",
                metadata={"lab": "cern"},
                hints={"sorted_by": "ke"},
                rows=100 * (int(partition) + 1),
                slices=2,
                bytes_stored=1000,
                bytes_arrow=1600,
            )
            inventories.setdefault(device, []).append(summary)
    return catalog.build(inventories, down, frozenset({"dev0", "dev1", "dev2"}))


def test_a_dataset_listed_as_before():
    (entry,) = _catalog().values()
    listed = DatasetSummary.of(entry)
    assert listed.rows == 600 and listed.devices["dev1"].partitions == 2
    assert listed.to_json() == {
        "dataset": "physics/particles",
        "rows": 600,
        "partitions": 3,
        "slices": 6,
        "bytes_stored": 3000,
        "bytes_arrow": 4800,
        "compression": "zstd",
        "replicas": 2,
        "cluster_by": ["ke"],
        "columns": [{"name": "id", "type": "int64"}, {"name": "ke", "type": "double"}],
        "devices": {
            "dev0": {"partitions": 2, "rows": 400},
            "dev1": {"partitions": 2, "rows": 300},
            "dev2": {"partitions": 2, "rows": 500},
        },
        "metadata": {"lab": "cern"},
        "version": entry.version,
        "available": True,
        "unavailable_partitions": {},
    }


def test_a_partition_whose_holders_are_down_is_named():
    (entry,) = _catalog(down=frozenset({"dev1", "dev2"})).values()
    listed = DatasetSummary.of(entry).to_json()
    assert listed["available"] is False and listed["rows"] == 400
    assert listed["unavailable_partitions"] == {"1": ["dev1", "dev2"]}


def test_a_dataset_described_as_before():
    (entry,) = _catalog().values()
    described = DatasetDescription.of(entry)
    body = described.to_json()
    assert {k: v for k, v in body.items() if k in DatasetSummary.of(entry).to_json()} == (
        DatasetSummary.of(entry).to_json()
    )
    assert body["partitions_detail"][1] == {
        "partition": 1,
        "rows": 200,
        "slices": 2,
        "bytes_stored": 1000,
        "devices": ["dev1", "dev2"],
    }
    (ingest,) = body["ingests"]
    assert ingest["id"] == "i1" and "placement" not in ingest  # partitions_detail shows it
    assert body["hints"] == {"sorted_by": "ke"}
    assert list(body)[-3:] == ["partitions_detail", "ingests", "hints"]


def test_a_device_status_up_and_down():
    stats = StatsReply(keys=12, file_bytes=4096, partitions=3, running=1, exchanges_max=4)
    up = DeviceStatus(
        "dev0", "grpc://127.0.0.1:1", True, profile="host", pid=42, stats=stats, host="h1"
    )
    assert up.to_json() == {
        "device": "dev0",
        "address": "grpc://127.0.0.1:1",
        "up": True,
        "profile": "host",
        "pid": 42,
        **stats.to_json(),
        "host": "h1",
        "rack": "",
        "drained": False,
    }
    down = DeviceStatus("dev1", "grpc://127.0.0.1:2", False, error="does not answer", host="h2")
    assert down.to_json() == {
        "device": "dev1",
        "address": "grpc://127.0.0.1:2",
        "up": False,
        "error": "does not answer",
        "host": "h2",
        "rack": "",
        "drained": False,
    }
