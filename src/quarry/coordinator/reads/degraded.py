"""Degraded reads: a lost data partition of an erasure-coded dataset, rebuilt on the host.

A ``Rebuilder`` stands in the list of a lost partition's replicas, last (``replicas_of``), so
the one dispatch treats it as a replica: when the partition's device is dead, or read a
damaged copy, the rest of its work "fails over" to the rebuilder (``failover.resume``), which
the dispatch reads raw, as it reads a partition under pushdown never: every slice not done
elsewhere, rebuilt from K survivors of the stripe (the other data partitions' stored values
and parity blocks, read from their devices as byte streams, checked there). So the host runs
the same unit of work on the rebuilt rows, and every kind of work (SQL, gene statistics, samples,
offload) gives the answer the healthy cluster gives. A rebuilt slice is checked against the
checksums its device wrote (kept with the parity), as a read on that device checks it.

Its cost is the physical bound of a degraded read: K slices read and shipped for every slice
rebuilt, and one decode on the host's CPU. The code works byte by byte, so a read of some
columns rebuilds only the run of the lost value that holds them (``Span``), from the same run
of each survivor: a data survivor's streams that overlap it, and that run of a parity block
(read whole: a parity partition is read as rows).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry.coordinator.membership.catalog import DatasetEntry, PartitionEntry, Stripe
from quarry.errors import CorruptSlice, DeviceUnavailable, QuarryError
from quarry.protocol.work import ranges_of
from quarry.store import parity, stored
from quarry.store.partition import FetchedSlice, PartitionMeta, decode_read

if TYPE_CHECKING:
    from quarry.coordinator.membership.membership import Membership

SLICES_PER_READ = 4  # stripes rebuilt at once: K streams of this many slices held in memory
SURVIVOR_SETS_MAX = 4  # a survivor that fails mid-rebuild is replaced at most this often


@dataclass
class Layout:
    """What a stripe group's parity (or, without one, its data partitions' metadata slices)
    says of every stripe: its K data slices' descriptions (None: a partition with no slice at
    that number), so a rebuilt value is padded as it was coded, cut to its length and checked."""

    infos: list[list[dict[str, Any] | None]]  # per stripe number, per data block

    def lengths(self, number: int) -> list[int]:
        return [0 if i is None else int(i["bytes_stored"]) for i in self.infos[number]]

    def offsets(self, number: int, position: int) -> list[int]:
        """Where each column stream of a data block's value starts, and where the last ends."""
        info = self.infos[number][position]
        found = [0]
        for size in (info or {}).get("columns") or []:
            found.append(found[-1] + int(size))
        return found

    def by_column(self, number: int) -> bool:
        """Whether every value of stripe ``number`` is stored as a stream per column."""
        return all(i is None or i.get("columns") is not None for i in self.infos[number])


@dataclass(frozen=True)
class Span:
    """The bytes of a stripe rebuilt: ``[low, high)`` of every block. The code works byte by
    byte, so the columns a query reads of a lost slice come back from the same range of K
    survivors: the survivors' streams that overlap it, and that range of a parity block."""

    low: int
    high: int

    def overlaps(self, start: int, end: int) -> bool:
        return start < self.high and end > self.low

    def cut(self, block: bytes) -> bytes:
        """A parity block's bytes within the span (a block is as long as its stripe's longest
        value, so it covers the span whole)."""
        assert len(block) >= self.high, (len(block), self.high)
        return block[self.low : self.high]

    def joined(self, offsets: list[int], indices: list[int], streams: list[bytes]) -> bytes:
        """A value's bytes within the span, from the streams (of the columns at ``indices``,
        which start at ``offsets``) that overlap it, cut at the value's end."""
        value = bytearray(self.high - self.low)
        for index, stream in zip(indices, streams, strict=True):
            start, end = max(offsets[index], self.low), min(offsets[index + 1], self.high)
            if start < end:
                piece = stream[start - offsets[index] : end - offsets[index]]
                value[start - self.low : end - self.low] = piece
        return bytes(value[: max(0, min(offsets[-1], self.high) - self.low)])


class Rebuilder:
    """Stands for a lost member of a stripe group (a data partition: its slices' rows; a
    parity partition: its parity rows), rebuilt from K others."""

    rebuilds = True  # dispatch reads its slices raw and runs the unit on them (``rebuilt``)

    def __init__(self, cluster: Membership, stripe: Stripe, partition: int):
        self.cluster = cluster
        self.entry: DatasetEntry = cluster.catalog[stripe.dataset]
        self.partition = partition
        self.stripe = stripe
        self.is_parity = partition in stripe.parity
        self.name = f"parity:{partition}"  # unique per partition: failover groups by it
        self.failed: set[str] = set()  # devices that failed a survivor read here
        self._layout: Layout | None = None
        self._meta: PartitionMeta | None = None
        self.rebuilt_slices = 0
        self.decode_s = 0.0  # host CPU seconds spent decoding stripes
        self.bytes_read = 0  # survivors' bytes read to rebuild

    @classmethod
    def of(cls, cluster: Membership, partition: PartitionEntry) -> Rebuilder:
        assert partition.stripe is not None, "only an erasure-coded partition is rebuilt"
        return cls(cluster, partition.stripe, partition.partition)

    def __repr__(self) -> str:
        return f"Rebuilder({self.entry.qualified}, partition {self.partition})"

    # ---- what dispatch calls on a device ------------------------------------------------------

    def rebuilt(
        self, first: int = 0, skip: frozenset[int] = frozenset(), columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Slices from ``first`` on, but those in ``skip`` (done elsewhere before the device was
        lost), rebuilt: what dispatch reads raw and runs the unit on."""
        wanted = [n for n in range(first, self.slices()) if n not in skip]
        return self._ranges([(r.first, r.end) for r in ranges_of(wanted)], columns)

    def scan(
        self,
        domain: str,
        dataset: str,
        partition: int,
        first: int = 0,
        end: int | None = None,
        columns: list[str] | None = None,
        stored: bool = False,
        generation: str = "",
    ) -> Iterator[pa.RecordBatch]:
        """Slices [first, end) rebuilt: a data partition's rows, a parity partition's rows."""
        total = self.slices()
        return self._ranges([(first, total if end is None else min(end, total))], columns)

    def batches(self, reader: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from reader

    # ---- what the stripe says -------------------------------------------------------------------

    def slices(self) -> int:
        """How many slices the lost member has (a parity partition: one per stripe)."""
        return len(self.layout().infos) if self.is_parity else len(self.meta().slices)

    def meta(self) -> PartitionMeta:
        """A lost data partition's metadata slice, as its stripes describe it."""
        if self._meta is None:
            assert not self.is_parity
            position = self.stripe.data.index(self.partition)
            infos = [row[position] for row in self.layout().infos if row[position] is not None]
            self._meta = PartitionMeta(
                domain=self.entry.domain,
                dataset=self.entry.name,
                partition=self.partition,
                ingest={},
                schema=self.entry.schema,
                compression=self.entry.compression,
                slices=[parity.info_from_json(i) for i in infos],
                device=self.name,
            )
        return self._meta

    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = self._read_layout()
        return self._layout

    def _read_layout(self) -> Layout:
        """From a parity partition's stripe descriptions, else (every parity partition lost)
        from the data partitions' own metadata slices."""
        errors = []
        for number in self.stripe.parity:
            if number == self.partition:
                continue
            for client in self._clients(number):
                try:
                    scan = client.scan(
                        self.entry.domain, self.entry.name, number, columns=[parity.INFOS]
                    )
                    described = [
                        row
                        for batch in client.batches(scan)
                        for row in batch.column(parity.INFOS).to_pylist()
                    ]
                except (DeviceUnavailable, CorruptSlice) as error:
                    self.failed.add(client.name)
                    errors.append(str(error))
                    continue
                what = f"parity partition {number} of {self.entry.qualified}"
                k = self.stripe.code.k
                return Layout([parity.infos_of(text, k, what) for text in described])
        if self.is_parity:
            return self._layout_of_data(errors)
        raise self._missing(f"no parity partition of its stripe answers ({'; '.join(errors)})")

    def _layout_of_data(self, errors: list[str]) -> Layout:
        described = []
        for member in self.stripe.data:
            client = next(iter(self._clients(member)), None)
            if client is None:
                raise self._missing(f"data partition {member} and every parity partition are lost")
            slices = client.describe(self.entry.domain, self.entry.name, member).slices
            described.append([parity.info_json(parity.info_from_json(d.to_json())) for d in slices])
        stripes = max((len(d) for d in described), default=0)
        return Layout([[d[n] if n < len(d) else None for d in described] for n in range(stripes)])

    # ---- rebuilding -----------------------------------------------------------------------------

    def _ranges(
        self, ranges: list[tuple[int, int]], columns: list[str] | None
    ) -> Iterator[pa.RecordBatch]:
        for first, end in ranges:
            for start in range(first, end, SLICES_PER_READ):
                yield from self._rebuilt(start, min(end, start + SLICES_PER_READ), columns)

    def _rebuilt(self, first: int, end: int, columns: list[str] | None) -> list[pa.RecordBatch]:
        """Slices [first, end) rebuilt; a survivor that fails is replaced by another."""
        errors: list[str] = []
        spans = {number: self._span(number, columns) for number in range(first, end)}
        for _ in range(SURVIVOR_SETS_MAX):
            survivors = self._survivors()
            try:
                blocks = {p: self._read(p, client, first, end, spans) for p, client in survivors}
            except (DeviceUnavailable, CorruptSlice) as error:
                errors.append(str(error))
                continue
            return [
                self._decoded(number, blocks, columns, spans[number])
                for number in range(first, end)
            ]
        raise self._missing("; ".join(errors))

    def _span(self, number: int, columns: list[str] | None) -> Span:
        """What stripe ``number`` must rebuild: a lost data slice's streams of ``columns`` (the
        run from the first to the last of them), else (every column, or a parity block coded
        again from the data) the whole stripe."""
        layout = self.layout()
        whole = Span(0, max(1, max(layout.lengths(number))))
        if self.is_parity or columns is None or not layout.by_column(number):
            return whole
        offsets = layout.offsets(number, self.stripe.data.index(self.partition))
        indices = [self.entry.schema.get_field_index(c) for c in columns]
        if not indices or min(indices) < 0 or len(offsets) <= max(indices) + 1:
            return whole  # decode_read names what is wrong
        return Span(min(offsets[i] for i in indices), max(offsets[i + 1] for i in indices))

    def _survivors(self) -> list[tuple[int, Any]]:
        """K members of the stripe held by devices that answer (data first: a parity row is
        rebuilt from the data alone, with no decode), each with the device to read it from."""
        chosen = []
        for member in (*self.stripe.data, *self.stripe.parity):
            if member == self.partition:
                continue
            client = next(iter(self._clients(member)), None)
            if client is not None:
                chosen.append((member, client))
            if len(chosen) == self.stripe.code.k:
                break
        if len(chosen) < self.stripe.code.k:
            raise self._missing(
                f"only {len(chosen)} other members of its stripe answer, {self.stripe.code.k} "
                "are needed"
            )
        return chosen[: self.stripe.code.k]

    def _clients(self, member: int) -> list[Any]:
        down = self.cluster.down
        return [
            self.cluster.devices[d]
            for d in self.stripe.holders.get(member, ())
            if d not in down and d not in self.failed and d in self.cluster.devices
        ]

    def _read(
        self, member: int, client: Any, first: int, end: int, spans: dict[int, Span]
    ) -> dict[int, bytes]:
        """Slice number -> the member's stored bytes within its stripe's span (a data slice's
        value, read as the streams that overlap the span; a parity block, read whole), for
        the slices it has in [first, end)."""
        if member in self.stripe.parity:
            read = self._scanned(member, client, first, end, [parity.PARITY], True)
            return {n: spans[n].cut(block) for n, block in read.items()}
        position = self.stripe.position(member)
        layout = self.layout()
        wanted: set[int] = set()
        for number, span in spans.items():
            offsets = layout.offsets(number, position)
            wanted.update(i for i in range(len(offsets) - 1) if span.overlaps(*offsets[i : i + 2]))
        held = [n for n in spans if layout.lengths(n)[position]]
        if not wanted:  # the member's values all end before the span: zeros, as coded
            return dict.fromkeys(held, b"")
        names = [self.entry.schema.field(i).name for i in sorted(wanted)]
        read = self._scanned(member, client, first, end, names, False)
        assert sorted(read) == held, (member, sorted(read), held)
        return {
            number: spans[number].joined(layout.offsets(number, position), sorted(wanted), streams)
            for number, streams in read.items()
        }

    def _scanned(
        self, member: int, client: Any, first: int, end: int, names: list[str], is_parity: bool
    ) -> dict[int, Any]:
        """Slice number -> a parity block, or a data slice's streams of ``names``."""
        try:
            reader = client.scan(
                self.entry.domain, self.entry.name, member, first, end, names, stored=not is_parity
            )
            found: dict[int, Any] = {}
            number = first
            for batch in client.batches(reader):
                for value in _values(batch, is_parity):
                    found[number] = value
                    self.bytes_read += sum(len(v) for v in value) if not is_parity else len(value)
                    number += 1
            return found
        except (DeviceUnavailable, CorruptSlice):
            self.failed.add(client.name)
            raise

    def _decoded(
        self,
        number: int,
        read: dict[int, dict[int, bytes]],
        columns: list[str] | None,
        span: Span,
    ) -> pa.RecordBatch:
        """Slice ``number`` of the lost member, from its stripe: rows decoded and checked, or
        a parity row coded again."""
        values = self._stripe(number, read, span)
        self.rebuilt_slices += 1
        if self.is_parity:
            blocks, _ = parity.encode(self.stripe.code, values)
            j = self.stripe.parity.index(self.partition)
            return parity.parity_row(blocks[j], self.layout().infos[number])
        meta = self.meta()
        info = meta.slices[number]
        value = values[self.stripe.data.index(self.partition)]
        assert info.columns is not None, "a coded slice has a stream per column"
        offsets = [0]
        for size in info.columns:
            offsets.append(offsets[-1] + size)
        indices = (
            list(range(len(self.entry.schema)))
            if columns is None
            else [self.entry.schema.get_field_index(c) for c in columns]
        )
        view = memoryview(value)
        parts = [view[offsets[i] - span.low : offsets[i + 1] - span.low] for i in indices]
        return decode_read(meta, FetchedSlice(number, columns, None, parts, indices))

    def _stripe(self, number: int, read: dict[int, dict[int, bytes]], span: Span) -> list[bytes]:
        """Stripe ``number``'s K data values within ``span``, each cut to its own end."""
        code, stripe = self.stripe.code, self.stripe
        lengths = [
            max(0, min(length, span.high) - span.low) for length in self.layout().lengths(number)
        ]
        blocks: dict[int, bytes] = {}
        for member, values in read.items():
            position = stripe.position(member)
            if number in values:
                blocks[position] = values[number]
        for position in range(code.k):  # partitions with no slice here: zeros, as coded
            if not self.layout().lengths(number)[position]:
                blocks.setdefault(position, b"")
        if all(p in blocks for p in range(code.k)):
            data = [blocks[p] for p in range(code.k)]
        else:
            started = time.thread_time()
            data = parity.decode(code, blocks, span.high - span.low)
            self.decode_s += time.thread_time() - started
        return [value[:length] for value, length in zip(data, lengths, strict=True)]

    def _missing(self, why: str) -> QuarryError:
        lost = f"partition {self.partition} of {self.entry.qualified}"
        return DeviceUnavailable(
            f"cannot rebuild {lost} from its {self.stripe.code.text} stripe (data partitions "
            f"{list(self.stripe.data)}, parity partitions {list(self.stripe.parity)}): {why}"
        )


def _values(batch: pa.RecordBatch, is_parity: bool) -> list[Any]:
    """The values in a survivor's batch: a parity block per row, or a data slice's stored
    streams (of the columns read, in schema order) per row."""
    if is_parity:
        return [bytes(v) for v in batch.column(parity.PARITY).to_pylist()]
    names = [n for n in batch.schema.names if n not in (stored.ROWS, stored.CHECKSUMS)]
    return [[batch.column(n)[row].as_py() for n in names] for row in range(batch.num_rows)]
