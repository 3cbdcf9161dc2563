"""How ingest lays a table's rows out: how many partitions, which rows travel together, and
which rows share a slice.

Ingest deals the source's rows round-robin to the partitions in groups of whole rows
(``atomic._send``; ``reads/source_order.py`` reads the source's order back from the groups), and
each device cuts its partition's rows, in the order they arrive, into slices of ``slice_rows``
(``store/partition.PartitionWriter``). Two named rules set the numbers:

- ``partitions_for``: each partition of a new table holds at least ``QUARRY_PARTITION_MIB_MIN``
  (16 MiB), up to one partition per drive, so a table under it is one partition. Every
  partition a query reads costs its device a run of its own (metadata, a plan, an engine run,
  a report: a few ms of device CPU whatever it holds), and a query joining several small
  dimension tables paid it on every device for each of them.
- ``contiguous_slices`` (asked for by the ingest, ``contiguous_slices=True``): rows are dealt
  in groups of exactly one slice, the same ``slice_rows`` on every partition, so a slice holds
  a run of consecutive source rows and its zone maps bound what the source's order bounds. By
  default groups are about 1 MiB, and on a device with 4 MiB values a slice strings together
  three or four groups from as many stretches of the source: a column that follows the source's
  order (an expression matrix's row ids) spans about four times as much per slice, so
  zone maps prune little.
"""

from __future__ import annotations

import math

import pyarrow as pa

from quarry import settings
from quarry.store.codec import rows_per_slice

MiB = 1 << 20
ROW_GROUP_BYTES = MiB  # rows travel to a partition in groups of whole rows, about this big
# A partition is where rows live (one device and its replicas), not how a drive works at once:
# a drive's cores run chunks of any of its partitions together (``device.loop.ChunkSlots``), and
# bounded-load placement deals partitions evenly. Every partition a query reads costs the drive
# a run of its own (its metadata, a plan, an engine run at least, a report): about 2 ms of device
# CPU each, measured on a 1,000-row aggregate (4 partitions 14 ms a query, 16 partitions 29 ms).
PARTITIONS_PER_DEVICE = 1


def estimated_bytes(first: pa.RecordBatch | None, rows_total: int | None) -> float | None:
    """The table's size in memory: its first rows' width times its row count (None: a stream
    of unknown length)."""
    if first is None or not rows_total:
        return None
    return first.nbytes / first.num_rows * rows_total


def partitions_for(first: pa.RecordBatch | None, rows_total: int | None, drives: int) -> int:
    """How many partitions a new dataset gets: as many as it fills ``QUARRY_PARTITION_MIB_MIN``
    (at least one), at most ``PARTITIONS_PER_DEVICE`` per drive (a storage server deals its
    share over the drives behind it); a stream of unknown length one per drive. With the
    setting at 0, a partition per 1 MiB row group the table fills.

    Every partition a query reads costs a stream, and a stream costs a device 3-7 ms of CPU
    whatever it holds (TPC-H SF 1, nation, region and supplier in one partition instead of
    four: Q2 0.165 -> 0.128 s, Q11 0.165 -> 0.108 s, Q16 0.148 -> 0.090 s, Q7 0.320 -> 0.214 s).
    On 4 devices, each partition at least 16 MiB against a partition per 1 MiB row group (same
    run, each query alternating between two clusters): TPC-DS SF 1 took 0.90 of the time over
    its 99 queries, TPC-H SF 1 0.96 (customer and part one partition each; lineitem, orders and
    partsupp still four)."""
    most = PARTITIONS_PER_DEVICE * drives
    estimated = estimated_bytes(first, rows_total)
    if estimated is None:
        return most
    partition_bytes_min = settings.PARTITION_MIB_MIN.get() * MiB
    if partition_bytes_min:
        return max(1, min(most, int(estimated // partition_bytes_min)))
    return max(1, min(most, math.ceil(estimated / ROW_GROUP_BYTES)))


def contiguous_slices(first: pa.RecordBatch | None, kv_bytes_max: int) -> int | None:
    """Rows per slice, and per group dealt, of an ingest that keeps each slice one run of the
    source's rows: what the smallest value limit among the devices holds, from the first rows'
    width (None: no rows). Every partition gets this one size, so a group is exactly a slice
    wherever it lands (a partition on devices with larger values gets smaller slices than they
    could hold: a slice's size is a limit, not a target)."""
    if first is None or not first.num_rows:
        return None
    return rows_per_slice(first.nbytes / first.num_rows, kv_bytes_max)


def group_rows_for(
    first: pa.RecordBatch | None,
    rows_total: int | None,
    partitions: int,
    slice_rows: int | None = None,
) -> int:
    """Rows per group dealt to a partition: one slice's (``contiguous_slices``), else about
    ROW_GROUP_BYTES of the first rows' width. A table smaller than its partitions' groups still
    spreads over all of them (then each partition holds one group: one slice, still one run)."""
    if first is None:
        return 0
    if slice_rows is not None:
        group_rows = slice_rows
    else:
        group_rows = max(1, int(ROW_GROUP_BYTES / max(1.0, first.nbytes / first.num_rows)))
    if rows_total:
        group_rows = max(1, min(group_rows, -(-rows_total // partitions)))
    return group_rows


def slice_rows_for(rows: pa.Table | None, kv_bytes_max: int) -> int | None:
    """Rows per slice for every replica of a partition: what the smallest value limit among
    them holds, from the first rows' real size (a larger slice would only be striped)."""
    if rows is None or not rows.num_rows:
        return None
    return rows_per_slice(rows.nbytes / rows.num_rows, kv_bytes_max)
