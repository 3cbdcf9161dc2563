"""The catalog after a move: a partition's holders remember who holds it now, so a holder
that goes down leaves its dataset listed (under-replicated) rather than hidden, while an
ingest still committing stays hidden."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from quarry.coordinator.membership import catalog
from quarry.protocol.control import IngestRecord, PartitionSummary

SCHEMA = pa.schema([("id", pa.int64())])
PLACED = {"0": ["dev0", "dev1"], "1": ["dev1", "dev2"]}
RECORD = IngestRecord(id="i1", first_partition=0, partitions=2, replicas=2, placement=PLACED)
MEMBERS = frozenset({"dev0", "dev1", "dev2", "dev3"})


def _summary(partition: int, record: IngestRecord = RECORD) -> PartitionSummary:
    return PartitionSummary("d", "t", partition, record, SCHEMA, rows=10, slices=1)


def test_a_moved_partition_whose_new_holder_is_down_stays_listed():
    """Partition 0 moved from dev0 to dev3 (every holder told: dev1 and dev3), then dev3 went
    down: the dataset is listed, partition 0 on dev1 alone."""
    moved = replace(RECORD, placement={**PLACED, "0": ["dev1", "dev3"]})
    inventories = {
        "dev0": [],
        "dev1": [_summary(0, moved), _summary(1)],
        "dev2": [_summary(1)],
    }
    listed = catalog.build(inventories, frozenset({"dev3"}), MEMBERS)
    entry = listed["d/t"]
    assert {p.partition: p.devices for p in entry.partitions} == {0: ["dev1"], 1: ["dev1", "dev2"]}


def test_an_ingest_still_committing_stays_hidden():
    """dev0 has not committed partition 0 yet and answers: not listed, whatever moved."""
    inventories = {"dev0": [], "dev1": [_summary(0), _summary(1)], "dev2": [_summary(1)]}
    assert catalog.build(inventories, frozenset(), MEMBERS) == {}
