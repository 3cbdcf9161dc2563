"""A dataset's rows in the order of the source they were ingested from.

Ingest deals a source's rows round-robin to its partitions in groups of ``group_rows`` (the
ingest record keeps the figure): group g went to partition ``first + g % P``. Taking
``group_rows`` rows from each partition in turn gives the source back, row for row; ingests
follow one another in the order they were made (an append comes after what it appended to).
An ingest from before the figure was kept, or one that sorted each partition by a column
(``cluster_by``), reads partition after partition.

Each partition is read a slice at a time, each slice its own short scan: holding one stream
per partition open while the others are read would hold a device's admission slots for as long
as the whole read, and a device with more partitions than slots would wait for itself. So at
most one slice per partition waits in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from quarry.coordinator.membership.catalog import DatasetEntry

# fetch(partition, first slice, end slice) -> that range's batches, from a replica that answers
Fetch = Callable[[int, int, int], Iterator[pa.RecordBatch]]


class Cursor:
    """One partition's rows, handed out a number at a time."""

    def __init__(self, partition: int, slices: int, fetch: Fetch):
        self.partition = partition
        self.slices = slices
        self.fetch = fetch
        self.next_slice = 0
        self.buffer: list[pa.RecordBatch] = []

    def take(self, rows: int) -> list[pa.RecordBatch]:
        """Up to ``rows`` rows; fewer only when the partition has no more."""
        taken: list[pa.RecordBatch] = []
        wanted = rows
        while wanted:
            if not self.buffer:
                if self.next_slice >= self.slices:
                    break
                number = self.next_slice
                self.buffer = [
                    b for b in self.fetch(self.partition, number, number + 1) if b.num_rows
                ]
                self.next_slice += 1
                continue
            batch = self.buffer[0]
            if batch.num_rows <= wanted:
                taken.append(self.buffer.pop(0))
                wanted -= batch.num_rows
            else:
                taken.append(batch.slice(0, wanted))
                self.buffer[0] = batch.slice(wanted)
                wanted = 0
        return taken


def source_order(entry: DatasetEntry, fetch: Fetch) -> Iterator[pa.RecordBatch]:
    slices = {p.partition: p.slices for p in entry.partitions}
    rows = {p.partition: p.rows for p in entry.partitions}
    for record in sorted(entry.ingests, key=lambda r: r.created_at):
        numbers = range(record.first_partition, record.first_partition + record.partitions)
        cursors = [Cursor(p, slices.get(p, 0), fetch) for p in numbers]
        if record.group_rows <= 0 or record.cluster_by:  # groups not kept, or rows sorted
            for cursor in cursors:
                yield from cursor.take(rows.get(cursor.partition, 0))
            continue
        group = 0
        while True:
            taken = cursors[group % len(cursors)].take(record.group_rows)
            yield from taken
            if sum(b.num_rows for b in taken) < record.group_rows:
                break  # the source's last group, short or empty: nothing follows it
            group += 1
