"""Rows back in the source's order from partitions dealt round-robin in groups."""

from __future__ import annotations

import pyarrow as pa

from quarry.coordinator.membership.catalog import DatasetEntry, PartitionEntry
from quarry.coordinator.reads.source_order import source_order
from quarry.protocol.control import IngestRecord

SCHEMA = pa.schema([("v", pa.int64())])


def _dealt(rows: int, partitions: int, group_rows: int, slice_rows: int):
    """Partitions as ingest deals them, each cut in slices; and a fetch of a slice range."""
    held: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for group, start in enumerate(range(0, rows, group_rows)):
        held[group % partitions].extend(range(start, min(rows, start + group_rows)))
    slices = {
        p: [values[i : i + slice_rows] for i in range(0, len(values), slice_rows)]
        for p, values in held.items()
    }
    fetched: list[tuple[int, int, int]] = []

    def fetch(partition: int, first: int, end: int):
        fetched.append((partition, first, end))
        for values in slices[partition][first:end]:
            yield pa.record_batch([pa.array(values, pa.int64())], schema=SCHEMA)

    record = IngestRecord("i", 0, partitions, 1, group_rows=group_rows, created_at=1.0)
    entry = DatasetEntry(
        "d",
        "t",
        SCHEMA,
        "none",
        {},
        {},
        [record],
        [PartitionEntry(p, len(held[p]), len(slices[p]), 0, 0, ["dev0"]) for p in held],
    )
    return entry, fetch, fetched


def test_groups_come_back_in_the_order_they_were_dealt():
    for rows, partitions, group_rows, slice_rows in [
        (1000, 3, 70, 45),  # groups and slices cut at different rows
        (1000, 4, 250, 1000),  # exactly one group each
        (10, 6, 4, 3),  # fewer groups than partitions: the last ones hold nothing
        (0, 2, 5, 5),
    ]:
        entry, fetch, fetched = _dealt(rows, partitions, group_rows, slice_rows)
        back = [v for batch in source_order(entry, fetch) for v in batch.column(0).to_pylist()]
        assert back == list(range(rows)), (rows, partitions, group_rows, slice_rows)
        assert all(end == first + 1 for _, first, end in fetched)  # a slice per fetch
