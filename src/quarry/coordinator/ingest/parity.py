"""Parity while an erasure-coded ingest streams: the host cuts and encodes each data partition's
rows exactly as its device does, and codes every stripe as soon as its K slices are known.

The device cuts a partition's rows, in the order they arrive, into slices of the ``slice_rows``
the coordinator chose for it (sorting the whole partition first when clustered), and stores
each as ``codec.encode_columns`` encodes it: both are deterministic, so the host computes the
same stored values without reading anything back, and checks at the end that each device
stored as many slices and bytes as it computed (a paired assertion: a parity block over values
the device did not store would rebuild garbage, which the checksums would refuse). Memory: the
slices of a stripe wait only until its K partitions have cut theirs (rows are dealt to the
partitions round-robin, so they cut at about the same pace); a clustered partition is held
whole, as on its device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from quarry.errors import IngestFailed
from quarry.protocol.control import StripeGroup
from quarry.store import codec, parity
from quarry.store.partition import SliceInfo, describe_slice


@dataclass
class _Cutter:
    """One data partition's rows cut into slices as its device cuts them."""

    schema: pa.Schema
    slice_rows: int = 0
    pending: list[pa.RecordBatch] = field(default_factory=list)
    pending_rows: int = 0
    slices: dict[int, tuple[bytes, SliceInfo]] = field(default_factory=dict)  # not yet coded
    cut: int = 0  # slices cut so far
    bytes_stored: int = 0
    finished: bool = False

    def take(self, rows: int) -> pa.RecordBatch:
        table = pa.Table.from_batches(self.pending, schema=self.schema)
        head, rest = table.slice(0, rows).combine_chunks(), table.slice(rows)
        self.pending, self.pending_rows = rest.to_batches(), rest.num_rows
        batches = head.to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=self.schema)


class ParityBuilder:
    """Feeds on the rows each data partition is sent; hands each stripe's parity rows to
    ``send(parity partition, row)`` in stripe order."""

    def __init__(
        self,
        code: parity.Code,
        groups: tuple[StripeGroup, ...],
        schema: pa.Schema,
        compression: str,
        kv_bytes_max: dict[int, int],  # data partition -> its device's value limit
        cluster_by: str | None,
        send: Callable[[int, pa.RecordBatch], None],
    ):
        self.code = code
        self.compression = compression
        self.kv_bytes_max = kv_bytes_max
        self.cluster_by = cluster_by
        self.send = send
        self.group_of = {p: group for group in groups for p in group.data}
        self.cutters = {p: _Cutter(schema) for p in self.group_of}
        self.coded = {group.data[0]: 0 for group in groups}  # stripes coded per group

    def add(self, partition: int, rows: pa.Table, slice_rows: int | None) -> None:
        cutter = self.cutters[partition]
        if not cutter.slice_rows:
            assert slice_rows, "the device's slice size is chosen with its first rows"
            cutter.slice_rows = slice_rows
        cutter.pending.extend(_as_received(b) for b in rows.to_batches())
        cutter.pending_rows += rows.num_rows
        if self.cluster_by:
            return  # sorted whole at the end, as on the device
        while cutter.pending_rows >= cutter.slice_rows:
            self._store(partition, cutter.take(cutter.slice_rows))
        self._code(self.group_of[partition])

    def finish(self) -> None:
        """The last rows of every partition, and every stripe left."""
        for partition, cutter in self.cutters.items():
            if self.cluster_by and cutter.pending_rows:
                table = pa.Table.from_batches(cutter.pending, schema=cutter.schema)
                order = pc.sort_indices(table, sort_keys=[(self.cluster_by, "ascending", "at_end")])
                cutter.pending = table.take(order).combine_chunks().to_batches()
                while cutter.pending_rows > cutter.slice_rows:
                    self._store(partition, cutter.take(cutter.slice_rows))
            if cutter.pending_rows:
                self._store(partition, cutter.take(cutter.pending_rows))
            cutter.finished = True
        for group in {id(g): g for g in self.group_of.values()}.values():
            self._code(group)

    def check(self, partition: int, slices: int, bytes_stored: int, device: str) -> None:
        """What the device says it stored is what parity was computed over."""
        cutter = self.cutters[partition]
        if (slices, bytes_stored) != (cutter.cut, cutter.bytes_stored):
            raise IngestFailed(
                f"device {device} stored partition {partition} as {slices} slices of "
                f"{bytes_stored} bytes, but its parity was computed over {cutter.cut} slices of "
                f"{cutter.bytes_stored} bytes (a device encoding differently from the host): "
                "nothing was committed"
            )

    def _store(self, partition: int, batch: pa.RecordBatch) -> None:
        cutter = self.cutters[partition]
        value, lengths = codec.encode_columns(batch, self.compression)
        kv = self.kv_bytes_max[partition]
        stripes = max(1, -(-len(value) // kv))  # as ``codec.stripe`` cuts it on the device
        cutter.slices[cutter.cut] = (value, describe_slice(batch, value, lengths, stripes, kv))
        cutter.cut += 1
        cutter.bytes_stored += len(value)

    def _code(self, group: StripeGroup) -> None:
        """Code every stripe of the group whose slices are all cut (or whose partitions ended
        short of it)."""
        cutters = [self.cutters[p] for p in group.data]
        first = group.data[0]
        while True:
            number = self.coded[first]
            if not all(c.finished or number < c.cut for c in cutters):
                return
            if all(number >= c.cut for c in cutters):
                return  # every partition ended before this stripe
            taken = [c.slices.pop(number, None) for c in cutters]
            values = [t[0] if t is not None else b"" for t in taken]
            infos = [parity.info_json(t[1]) if t is not None else None for t in taken]
            blocks, _ = parity.encode(self.code, values)
            for partition, block in zip(group.parity, blocks, strict=True):
                self.send(partition, parity.parity_row(block, infos))
            self.coded[first] = number + 1


def _as_received(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch as its device receives it (through an IPC stream): buffers of its own rows
    alone. Cut and encoded as it was sent (a view into the source's larger buffers), TPC-H's
    lineitem read from Parquet encoded to 16 bytes more than its device stored, over three
    slices: the check at the end of the ingest refused it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()
