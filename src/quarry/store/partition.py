"""Partitions on one device: writing slices (pending), committing, reading, updating.

A partition is written in two phases so that a dataset appears whole or not at all:
1. ``PartitionWriter`` marks the partition pending (``~pending/...``), cuts the incoming rows into
   slices of whole rows sized from ``kv_bytes_max``, and stores them under their final names.
2. ``commit`` writes the metadata slice and a catalog entry and removes the pending mark, in one
   transaction. Until then no reader sees the partition. A pending partition lives while its
   coordinator renews its lease (``renew``); one the coordinator left behind is settled by its
   device, as the ingest's decider says (``outcome``; quarry.device.janitor).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from quarry.errors import (
    CorruptSlice,
    DatasetExists,
    DatasetNotFound,
    IngestFailed,
    KeyNotFound,
    QueryError,
    SchemaMismatch,
    VersionConflict,
)
from quarry.store import checksum, codec, naming
from quarry.store.kv import KeyValueStore, Snapshot
from quarry.store.zonemap import (
    IntegerBounds,
    integer_bounds,
    zone_map,
    zone_map_from_json,
    zone_map_to_json,
)

LEASE_S_DEFAULT = 60.0  # a pending partition outlives a coordinator that stopped renewing it
CLUSTER_BYTES_MAX = 2 << 30  # a clustered partition is sorted in memory: at most this much

META_FORMAT = 1
CATALOG_PREFIX = "~catalog/"


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass
class SliceInfo:
    rows: int
    bytes_stored: int
    bytes_arrow: int
    stripes: int
    zone_map: dict[str, dict[str, Any]]
    version: int = 1
    # Each column's IPC stream length, in schema order (None: a value stored whole, the first
    # format), and the stripe size the value was cut at (0: one key-value).
    columns: list[int] | None = None
    stripe_bytes: int = 0
    # Each column stream's checksum (``store.checksum``), in the same order (None: written
    # before checksums, read unverified).
    checksums: list[int] | None = None
    # A blocked slice (``codec.BLOCK_BYTES_HINT``): rows per block, and per column the lengths
    # and checksums of its stream's messages (``codec.message_lengths``: head, each block,
    # end marker), so a read of some rows takes, and checks, the head and their blocks alone.
    block_rows: int = 0
    blocks: list[list[int]] | None = None
    block_checksums: list[list[int]] | None = None

    def block_span(self, rows: tuple[int, int] | None) -> tuple[int, int] | None:
        """The blocks [first, end) holding rows [rows[0], rows[1]) of the slice; None when the
        read takes the whole slice (no blocks, no rows asked, or every block needed)."""
        if rows is None or not self.block_rows or self.blocks is None:
            return None
        count = len(self.blocks[0]) - 2
        first, end = rows
        assert 0 <= first < end <= self.rows, (rows, self.rows)
        span = first // self.block_rows, min(count, -(-end // self.block_rows))
        return None if span == (0, count) else span

    def block_rows_of(self, span: tuple[int, int]) -> tuple[int, int]:
        """The slice's rows [first, end) that blocks ``span`` hold."""
        return span[0] * self.block_rows, min(self.rows, span[1] * self.block_rows)


@dataclass
class PartitionMeta:
    """The metadata slice: everything a device needs to serve and describe a partition."""

    domain: str
    dataset: str
    partition: int
    ingest: dict[str, Any]  # id, first_partition, partitions, replicas, mode, created_at
    schema: pa.Schema
    compression: str
    metadata: dict[str, str] = field(default_factory=dict)
    hints: dict[str, Any] = field(default_factory=dict)
    slices: list[SliceInfo] = field(default_factory=list)
    device: str = ""

    # what decoding each set of columns read needs (``codec.Columns``), made once per set
    _columns: dict[tuple[int, ...], codec.Columns] = field(
        default_factory=dict, repr=False, compare=False
    )
    # what a whole-slice read of each set of columns takes, per slice (``read_bytes``)
    _read_sizes: dict[tuple[str, ...] | None, tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # each column's zone maps over the slices as arrays (``zone_bounds``)
    _zone_bounds: dict[str, IntegerBounds] = field(default_factory=dict, repr=False, compare=False)

    def columns(self, indices: list[int]) -> codec.Columns:
        """Decoding these columns (schema positions) of any slice of the partition."""
        key = tuple(indices)
        made = self._columns.get(key)
        if made is None:
            fields = [self.schema.field(i) for i in indices]
            made = self._columns[key] = codec.Columns.of(fields, self.schema.metadata)
        return made

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices)

    @property
    def bytes_stored(self) -> int:
        return sum(s.bytes_stored for s in self.slices)

    @property
    def bytes_arrow(self) -> int:
        return sum(s.bytes_arrow for s in self.slices)

    @property
    def verified(self) -> bool:
        """Whether every slice carries checksums (a partition written before them does not)."""
        return all(s.checksums is not None for s in self.slices)

    def summary(self) -> dict[str, Any]:
        """Inventory entry: everything but the zone maps."""
        return {
            "domain": self.domain,
            "dataset": self.dataset,
            "partition": self.partition,
            "ingest": self.ingest,
            "schema": schema_to_text(self.schema),
            "compression": self.compression,
            "metadata": self.metadata,
            "hints": self.hints,
            "rows": self.rows,
            "slices": len(self.slices),
            "bytes_stored": self.bytes_stored,
            "bytes_arrow": self.bytes_arrow,
            "device": self.device,
            "verified": self.verified,
        }

    def to_json(self) -> dict[str, Any]:
        body = self.summary()
        body["format"] = META_FORMAT
        body["slices"] = [
            {**asdict(s), "zone_map": zone_map_to_json(s.zone_map)} for s in self.slices
        ]
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PartitionMeta:
        assert body.get("format") == META_FORMAT, (
            f"unknown metadata slice format {body.get('format')}"
        )
        slices = [
            SliceInfo(
                s["rows"],
                s["bytes_stored"],
                s["bytes_arrow"],
                s["stripes"],
                zone_map_from_json(s["zone_map"]),
                s.get("version", 1),
                s.get("columns"),
                s.get("stripe_bytes", 0),
                s.get("checksums"),
                s.get("block_rows", 0),
                s.get("blocks"),
                s.get("block_checksums"),
            )
            for s in body["slices"]
        ]
        return cls(
            domain=body["domain"],
            dataset=body["dataset"],
            partition=body["partition"],
            ingest=body["ingest"],
            schema=schema_from_text(body["schema"]),
            compression=body["compression"],
            metadata=body.get("metadata", {}),
            hints=body.get("hints", {}),
            slices=slices,
            device=body.get("device", ""),
        )


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _sealed_json(value: Any) -> bytes:
    """A metadata slice or catalog entry as stored: JSON sealed with its checksum."""
    return checksum.seal(_json_bytes(value))


def _unsealed_json(raw: bytes, what: str) -> tuple[Any, bool]:
    """A sealed JSON value read back, checked (and whether it had a checksum to check)."""
    body, verified = checksum.unseal(raw, what)
    try:
        return json.loads(body), verified
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptSlice(f"{what}: not JSON ({error})") from None


def meta_of(raw: bytes, what: str) -> PartitionMeta:
    """A metadata slice from its stored bytes, checked; damage of any kind is ``CorruptSlice``."""
    body, _ = _unsealed_json(raw, what)
    try:
        return PartitionMeta.from_json(body)
    except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptSlice(f"{what}: does not describe a partition ({error})") from None


def meta_what(domain: str, dataset: str, partition: int) -> str:
    """How errors name a partition's metadata slice (``CorruptSlice`` reads it back)."""
    return f"the metadata slice of partition {partition} of {domain}/{dataset}"


def store_slice(
    txn: Any,
    key: str,
    batch: pa.RecordBatch,
    compression: str,
    kv_bytes_max: int,
    version: int,
    block_rows: int = 0,
) -> SliceInfo:
    """Store one slice value (a stream per column) and describe it for the metadata slice,
    each stream's checksum with it."""
    value, lengths = codec.encode_columns(batch, compression, block_rows)
    stripes = _put_striped(txn, key, value, kv_bytes_max)
    return describe_slice(batch, value, lengths, stripes, kv_bytes_max, version, block_rows)


def describe_slice(
    batch: pa.RecordBatch,
    value: bytes,
    lengths: list[int],
    stripes: int,
    kv_bytes_max: int,
    version: int = 1,
    block_rows: int = 0,
) -> SliceInfo:
    """What the metadata slice says of a slice value (also computed off the device: the parity
    of an erasure-coded stripe keeps it, so a lost slice is rebuilt and checked exactly)."""
    blocks = block_checksums = None
    if block_rows:
        blocks, block_checksums = [], []
        view, start = memoryview(value), 0
        for length in lengths:
            messages = codec.message_lengths(view[start : start + length])
            blocks.append(messages)
            block_checksums.append(checksum.of_columns(view[start : start + length], messages))
            start += length
    return SliceInfo(
        batch.num_rows,
        len(value),
        batch.nbytes,
        stripes,
        zone_map(batch),
        version,
        lengths,
        kv_bytes_max if stripes > 1 else 0,
        checksum.of_columns(value, lengths),
        block_rows if blocks is not None else 0,
        blocks,
        block_checksums,
    )


def put_meta(txn: Any, meta: PartitionMeta, kv_bytes_max: int) -> None:
    """A partition's metadata slice and its catalog entry, sealed, in place of the old ones
    (part of the caller's transaction)."""
    meta_key = naming.meta_key(meta.domain, meta.dataset, meta.partition)
    for old_meta in _meta_keys(txn, meta_key):
        txn.delete(old_meta)
    _put_striped(txn, meta_key, _sealed_json(meta.to_json()), kv_bytes_max)
    txn.put(_catalog_key(meta.domain, meta.dataset, meta.partition), _sealed_json(meta.summary()))


def meta_in(txn: Any, domain: str, dataset: str, partition: int) -> PartitionMeta:
    """A partition's metadata slice read inside a write transaction, checked."""
    keys = _meta_keys(txn, naming.meta_key(domain, dataset, partition))
    if not keys:
        raise DatasetNotFound(f"partition {partition} of {domain}/{dataset} is not on this device")
    raw = codec.unstripe([txn.get(k)[0] for k in keys])
    return meta_of(raw, meta_what(domain, dataset, partition))


def _put_striped(txn: Any, key: str, value: bytes, kv_bytes_max: int) -> int:
    stripes = codec.stripe(value, kv_bytes_max)
    for value_key, part in zip(naming.slice_value_keys(key, len(stripes)), stripes, strict=True):
        txn.put(value_key, part)
    return len(stripes)


def _read_striped_meta(store: KeyValueStore, key: str) -> bytes:
    keys = store.list(key)  # "meta" or "meta.000", "meta.001", ...
    keys = [k for k in keys if k == key or k.startswith(key + ".")]
    if not keys:
        raise KeyNotFound(key)
    return codec.unstripe(store.get_many(keys))


class PartitionWriter:
    """Receives a partition's rows in any batch sizes and stores them as slices, pending."""

    def __init__(
        self,
        store: KeyValueStore,
        meta: PartitionMeta,
        slice_rows: int | None = None,
        lease_s: float = LEASE_S_DEFAULT,
        copy: bool = False,
    ):
        self.store = store
        self.meta = meta
        self.lease_s = lease_s
        # a copy of a partition committed elsewhere (a move, a repair): committing it adds a
        # replica of rows every query already reads right, so no query need plan again
        self.copy = copy
        self._pending_rows: list[pa.RecordBatch] = []
        self._pending_count = 0
        bytes_per_row = max(1.0, _bytes_per_row_estimate(meta.schema))
        self.fixed = slice_rows is not None  # chosen for every replica: kept as given
        self.slice_rows = slice_rows or codec.rows_per_slice(bytes_per_row, store.kv_bytes_max)
        self._started = False
        # sorted by this column before it is cut into slices (the whole partition waits here)
        self.cluster_by = meta.ingest.get("cluster_by") or None
        self.block_bytes = block_bytes_of(meta)

    def _start(self) -> None:
        d, n, p = self.meta.domain, self.meta.dataset, self.meta.partition
        with self.store.transaction(visible=False) as txn:
            _clear_retired(txn, d, n, p)  # a copy arriving where the partition was moved from
            if txn.list(naming.meta_key(d, n, p)):
                raise DatasetExists(
                    f"dataset {d}/{n} already has partition {p} on this device: drop it first "
                    "(quarry drop) or ingest under another name"
                )
            pending = naming.pending_key(d, n, p)
            if txn.version(pending):
                raise DatasetExists(
                    f"another ingest of {d}/{n} partition {p} is in progress on this device"
                )
            now = time.time()
            marker = {
                "ingest": self.meta.ingest,
                "started_at": now,
                "lease_until": now + self.lease_s,
                "copy": self.copy,
            }
            txn.put(pending, _json_bytes(marker))
        self._started = True

    def write(self, batch: pa.RecordBatch) -> None:
        if not self._started:
            self._start()
        if not batch.schema.equals(self.meta.schema):
            raise SchemaMismatch(
                f"rows for {self.meta.domain}/{self.meta.dataset} do not match the partition "
                f"schema: got {batch.schema}, expected {self.meta.schema}"
            )
        if not self.fixed and not self.meta.slices and not self._pending_count and batch.num_rows:
            # Size slices from the real data rather than the schema's fixed-width guess.
            row_bytes = batch.nbytes / batch.num_rows
            self.slice_rows = codec.rows_per_slice(row_bytes, self.store.kv_bytes_max)
        self._pending_rows.append(batch)
        self._pending_count += batch.num_rows
        if self.cluster_by:
            self._check_cluster_bytes()
            return
        while self._pending_count >= self.slice_rows:
            self._cut(self.slice_rows)

    def _check_cluster_bytes(self) -> None:
        held = sum(b.nbytes for b in self._pending_rows)
        if held > CLUSTER_BYTES_MAX:
            raise IngestFailed(
                f"partition {self.meta.partition} of {self.meta.domain}/{self.meta.dataset} "
                f"holds more than {CLUSTER_BYTES_MAX >> 20} MiB: an ingest clustered by "
                f"{self.cluster_by} sorts each partition in the device's memory; use more "
                "partitions (--partitions)"
            )

    def _sort(self) -> None:
        """The whole partition in order of ``cluster_by`` (stable, nulls last: replicas given
        the same rows store the same slices)."""
        table = pa.Table.from_batches(self._pending_rows, schema=self.meta.schema)
        order = pc.sort_indices(table, sort_keys=[(self.cluster_by, "ascending", "at_end")])
        self._pending_rows = table.take(order).combine_chunks().to_batches()

    def _cut(self, rows: int) -> None:
        table = pa.Table.from_batches(self._pending_rows, schema=self.meta.schema)
        head = table.slice(0, rows).combine_chunks()
        rest = table.slice(rows)
        self._pending_rows = rest.to_batches()
        self._pending_count = rest.num_rows
        batch = head.to_batches()[0] if head.num_rows else codec.empty_batch(self.meta.schema)
        self._store_slice(batch)

    def _store_slice(self, batch: pa.RecordBatch) -> None:
        number = len(self.meta.slices)
        if number >= naming.SLICES_MAX:
            raise IngestFailed("partition has too many slices; use more partitions")
        key = naming.slice_key(self.meta.domain, self.meta.dataset, self.meta.partition, number)
        with self.store.transaction(visible=False) as txn:
            self._check_pending(txn)
            info = store_slice(
                txn,
                key,
                batch,
                self.meta.compression,
                self.store.kv_bytes_max,
                version=1,
                block_rows=block_rows_for(batch, self.block_bytes),
            )
        self.meta.slices.append(info)

    def _check_pending(self, txn: Any) -> None:
        """Its pending mark is still there: rows of an ingest aborted meanwhile (its lease ran
        out while its coordinator's link was cut, and the rows kept coming from the socket's
        buffer) are never written after the abort removed what came before them."""
        m = self.meta
        if not txn.version(naming.pending_key(m.domain, m.dataset, m.partition)):
            raise IngestFailed(
                f"partition {m.partition} of {m.domain}/{m.dataset}: its ingest was aborted on "
                "this device (its lease ran out) while its rows were still arriving"
            )

    def finish(self) -> PartitionMeta:
        """Store the last rows and the pending metadata; durable when this returns."""
        if not self._started:
            self._start()
        if self.cluster_by and self._pending_count:
            self._sort()
            while self._pending_count > self.slice_rows:
                self._cut(self.slice_rows)
        if self._pending_count:
            self._cut(self._pending_count)
        m = self.meta
        with self.store.transaction(visible=False) as txn:
            self._check_pending(txn)
            txn.put(naming.pending_key(m.domain, m.dataset, m.partition) + "/meta-ready", b"1")
            _put_striped(
                txn,
                naming.pending_key(m.domain, m.dataset, m.partition) + "/meta",
                _sealed_json(m.to_json()),
                self.store.kv_bytes_max,
            )
        return m


def block_bytes_of(meta: PartitionMeta) -> int:
    """The block size the dataset asked for (``codec.BLOCK_BYTES_HINT``; 0: slices unblocked).
    Columns holding dictionaries travel with dictionary messages between the blocks: never
    blocked."""
    target = int(meta.hints.get(codec.BLOCK_BYTES_HINT) or 0)
    if target < 0:
        raise IngestFailed(f"{codec.BLOCK_BYTES_HINT} must be a byte count, not {target}")
    return 0 if codec.has_dictionary(meta.schema) else target


def block_rows_for(batch: pa.RecordBatch, block_bytes: int) -> int:
    """Rows per block of a slice, so that a block holds about ``block_bytes`` of its rows (0:
    the slice is one block, and is not cut)."""
    if not block_bytes or batch.nbytes <= block_bytes or not batch.num_rows:
        return 0
    return max(1, batch.num_rows * block_bytes // batch.nbytes)


def _bytes_per_row_estimate(schema: pa.Schema) -> float:
    total = 0.0
    for f in schema:
        try:
            total += f.type.bit_width / 8
        except ValueError:  # variable width (strings, lists): a guess, replaced by real data
            total += 16.0
    return total


def commit(store: KeyValueStore, ingest_id: str, device: str) -> list[int]:
    """Make every pending partition of an ingest visible; one transaction for all of them.
    Copies alone (a move, a repair) leave the catalog generation as it was: a replica more of
    a partition listed already changes no answer a query planned before it would give."""
    committed: list[int] = []
    with store.transaction(visible=False) as txn:
        for pending in txn.list(naming.PENDING_PREFIX):
            if pending.count("/") != 3:
                continue  # a sub-key such as ".../meta"
            body = _load_json(txn.get(pending)[0])
            if body["ingest"]["id"] != ingest_id:
                continue
            if not body.get("copy", False):
                txn.show()
            if not txn.version(pending + "/meta-ready"):
                raise IngestFailed(f"partition {pending} of ingest {ingest_id} was not finished")
            meta_keys = [k for k in txn.list(pending + "/meta") if k != pending + "/meta-ready"]
            raw = codec.unstripe([txn.get(k)[0] for k in meta_keys])
            meta = meta_of(raw, f"the pending metadata slice {pending}")
            meta.device = device
            put_meta(txn, meta, store.kv_bytes_max)
            for key in [pending, pending + "/meta-ready", *meta_keys]:
                txn.delete(key)
            committed.append(meta.partition)
    return committed


def _load_json(raw: bytes) -> Any:
    return json.loads(raw)


def _catalog_key(domain: str, dataset: str, partition: int) -> str:
    return f"{CATALOG_PREFIX}{domain}/{dataset}/{partition:0{naming.PARTITION_DIGITS}d}"


def _pending_marks(store: KeyValueStore) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each pending partition's mark and its body (one gone meanwhile is passed over)."""
    for pending in store.list(naming.PENDING_PREFIX):
        if pending.count("/") != 3:
            continue
        try:
            yield pending, _load_json(store.get(pending)[0])
        except KeyNotFound:
            continue


def abort(store: KeyValueStore, ingest_id: str | None = None) -> int:
    """Delete pending partitions (of one ingest, or all): their slices and their marks."""
    deleted = 0
    for pending, body in _pending_marks(store):
        if ingest_id is not None and body["ingest"]["id"] != ingest_id:
            continue
        domain, dataset, partition = pending[len(naming.PENDING_PREFIX) :].split("/")
        prefix = naming.partition_prefix(domain, dataset, int(partition))
        deleted += store.delete_prefix(prefix, visible=False)  # pending: no reader sees it
        deleted += store.delete_prefix(pending, visible=False)
    return deleted


def pending_ingests(store: KeyValueStore) -> dict[str, dict[str, Any]]:
    """Ingests this device holds pending: id -> its record and when its lease ends."""
    found: dict[str, dict[str, Any]] = {}
    for _, body in _pending_marks(store):
        record = body["ingest"]
        entry = found.setdefault(record["id"], {"ingest": record, "lease_until": 0.0})
        # a marker from before leases existed: its coordinator is long gone
        entry["lease_until"] = max(entry["lease_until"], body.get("lease_until", 0.0))
    return found


def abort_unfinished(store: KeyValueStore, ingest_id: str) -> int:
    """Delete the pending partitions of an ingest whose rows never all arrived: whatever the
    outcome, they cannot be committed (their coordinator is gone)."""
    deleted = 0
    for pending in store.list(naming.PENDING_PREFIX):
        if pending.count("/") != 3 or store.version(pending + "/meta-ready"):
            continue
        try:
            body = _load_json(store.get(pending)[0])
        except KeyNotFound:
            continue
        if body["ingest"]["id"] != ingest_id:
            continue
        domain, dataset, partition = pending[len(naming.PENDING_PREFIX) :].split("/")
        prefix = naming.partition_prefix(domain, dataset, int(partition))
        deleted += store.delete_prefix(prefix, visible=False)  # pending: no reader sees it
        deleted += store.delete_prefix(pending, visible=False)
    return deleted


def renew(store: KeyValueStore, ingest_id: str, lease_s: float) -> int:
    """The ingest's coordinator is alive: its pending partitions here stay ``lease_s`` longer."""
    renewed = 0
    with store.transaction(visible=False) as txn:
        for pending in txn.list(naming.PENDING_PREFIX):
            if pending.count("/") != 3:
                continue
            body = _load_json(txn.get(pending)[0])
            if body["ingest"]["id"] != ingest_id:
                continue
            body["lease_until"] = max(body.get("lease_until", 0.0), time.time() + lease_s)
            txn.put(pending, _json_bytes(body))
            renewed += 1
    return renewed


def committed_ingest(store: KeyValueStore, ingest_id: str) -> bool:
    """Whether any partition of the ingest is committed here."""
    return any(summary["ingest"]["id"] == ingest_id for summary in inventory(store))


def outcome(store: KeyValueStore, ingest_id: str, now: float) -> str:
    """What the ingest's decider says of it: its own commit decides. Pending with its lease
    run out means its coordinator is gone: aborted here, and so answered (a coordinator that
    comes back finds nothing to commit on the decider and aborts everywhere)."""
    if committed_ingest(store, ingest_id):
        return "commit"
    held = pending_ingests(store).get(ingest_id)
    if held is None:
        return "abort"
    if held["lease_until"] > now:
        return "pending"
    abort(store, ingest_id)
    return "abort"


def inventory(
    store: KeyValueStore, damaged: list[CorruptSlice] | None = None
) -> list[dict[str, Any]]:
    """Every committed partition's catalog entry. One that fails its check is rebuilt from
    the metadata slice, and one whose metadata slice fails too is left out (the device cannot
    serve it); either is added to ``damaged``. One dropped or moved away while they are listed
    is left out (the write changed the store's count: whoever caches this reads it again)."""
    entries = []
    for key in store.list(CATALOG_PREFIX):
        domain, dataset, partition = key[len(CATALOG_PREFIX) :].split("/")
        try:
            entries.append(catalog_entry(store, domain, dataset, int(partition)))
            continue
        except KeyNotFound:
            continue
        except CorruptSlice as error:
            if damaged is not None:
                damaged.append(error)
        try:
            entries.append(read_meta(store, domain, dataset, int(partition)).summary())
        except KeyNotFound:
            continue
        except CorruptSlice as error:
            if damaged is not None:
                damaged.append(error)
    return entries


def catalog_entry(store: KeyValueStore, domain: str, dataset: str, partition: int) -> Any:
    """A partition's catalog entry, checked (``CorruptSlice`` if damaged)."""
    return catalog_entry_in(store, domain, dataset, partition)


def catalog_entry_in(reader: Any, domain: str, dataset: str, partition: int) -> Any:
    """A partition's catalog entry read through ``reader`` (the store or a transaction of
    it), checked (``CorruptSlice`` if damaged)."""
    what = f"the catalog entry of partition {partition} of {domain}/{dataset}"
    return _unsealed_json(reader.get(_catalog_key(domain, dataset, partition))[0], what)[0]


def json_round_trip(value: Any) -> Any:
    """``value`` as it reads back once stored as JSON (tuples become lists...)."""
    return json.loads(_json_bytes(value))


def read_meta(store: KeyValueStore, domain: str, dataset: str, partition: int) -> PartitionMeta:
    """A partition's metadata slice, checked against its checksum (``CorruptSlice`` if not)."""
    try:
        raw = _read_striped_meta(store, naming.meta_key(domain, dataset, partition))
    except KeyNotFound:
        raise DatasetNotFound(
            f"partition {partition} of {domain}/{dataset} is not on this device"
        ) from None
    return meta_of(raw, meta_what(domain, dataset, partition))


def read_slice(
    store: KeyValueStore, meta: PartitionMeta, number: int, columns: list[str] | None = None
) -> pa.RecordBatch:
    """One slice, only ``columns`` of it (None: all) read off the store, in that order."""
    return decode_read(meta, fetch_slice(store, meta, number, columns))


@dataclass(frozen=True)
class FetchedSlice:
    """A slice's stored bytes as read off the store, not yet decoded (``read_slice`` in two
    steps, so a device can say how long each took)."""

    number: int
    columns: list[str] | None
    whole: bytes | None  # a value stored whole (the first format)
    parts: list[bytes | memoryview | pa.Buffer] | None  # else the columns' IPC streams
    indices: list[int] | None  # and those columns' schema positions
    # Some blocks alone (``SliceInfo.block_span``): which, and each column's head and blocks.
    span: tuple[int, int] | None = None
    heads: list[bytes | memoryview | pa.Buffer] | None = None

    @property
    def bytes_read(self) -> int:
        """What was taken off the store."""
        if self.whole is not None:
            return len(self.whole)
        assert self.parts is not None
        return sum(checksum.size(p) for p in [*self.parts, *(self.heads or [])])


def fetch_slice(
    store: KeyValueStore,
    meta: PartitionMeta,
    number: int,
    columns: list[str] | None = None,
    snapshot: Snapshot | None = None,
    rows: tuple[int, int] | None = None,
) -> FetchedSlice:
    """The stored bytes of a slice's ``columns``; read in place through ``snapshot`` (the
    batch decoded from them then holds it open), else copied off the store. ``rows``: the
    slice's rows [first, end) that are needed; a blocked slice then gives the blocks that hold
    them (at least those rows; ``FetchedSlice.span``), any other the whole slice."""
    info = meta.slices[number]
    key = naming.slice_key(meta.domain, meta.dataset, meta.partition, number)
    if info.columns is None:  # stored whole
        value = codec.unstripe(store.get_many(naming.slice_value_keys(key, info.stripes)))
        return FetchedSlice(number, columns, value, None, None)
    wanted = column_indices(meta, columns)
    span = info.block_span(rows)
    if span is not None:
        heads, bodies = _block_values(store, key, info, wanted, span, snapshot)
        return FetchedSlice(number, columns, None, bodies, wanted, span, heads)
    parts = _column_values(store, key, info, wanted, snapshot)
    return FetchedSlice(number, columns, None, [parts[i] for i in wanted], wanted)


def decode_read(meta: PartitionMeta, fetched: FetchedSlice) -> pa.RecordBatch:
    """A slice's fetched bytes checked against their checksums, then decoded and checked
    against the metadata slice: damage of any kind is ``CorruptSlice``, naming the copy."""
    info = meta.slices[fetched.number]
    try:
        if fetched.whole is not None:
            batch = codec.decode_slice(fetched.whole, meta.schema, info.rows)
            return batch.select(fetched.columns) if fetched.columns is not None else batch
        assert fetched.parts is not None and fetched.indices is not None
        if fetched.span is not None:
            return _decode_blocks(meta, fetched)
        verify_parts(meta, fetched.number, fetched.parts, fetched.indices)
        return codec.decode_columns(fetched.parts, meta.columns(fetched.indices), info.rows)
    except CorruptSlice as error:
        raise CorruptSlice(f"{slice_what(meta, fetched.number)}: {error}") from None


def _decode_blocks(meta: PartitionMeta, fetched: FetchedSlice) -> pa.RecordBatch:
    """Some blocks of a slice's columns, each message checked against its checksum, decoded."""
    info = meta.slices[fetched.number]
    assert fetched.span is not None and fetched.heads is not None and fetched.parts is not None
    assert info.blocks is not None and fetched.indices is not None
    first, end = fetched.span
    rows = info.block_rows_of(fetched.span)
    columns = meta.columns(fetched.indices)
    arrays = []
    each = zip(fetched.heads, fetched.parts, fetched.indices, strict=True)
    for k, (head, body, index) in enumerate(each):
        name = meta.schema.field(index).name
        lengths = info.blocks[index]
        sums = None if info.block_checksums is None else info.block_checksums[index]
        try:
            checksum.check(head, lengths[0], sums and sums[0], f"column {name} head")
            view, start = memoryview(body), 0
            for block in range(first, end):
                length = lengths[1 + block]
                what = f"column {name} block {block}"
                checksum.check(view[start : start + length], length, sums and sums[1 + block], what)
                start += length
            if start != checksum.size(body):
                raise CorruptSlice(f"column {name}: {checksum.size(body)} bytes read for blocks")
            single, head_bytes = columns.singles[k], columns.heads[k]
            arrays.append(codec.decode_blocks(head, body, single, head_bytes, rows[1] - rows[0]))
        except CorruptSlice as error:
            raise CorruptSlice(f"column {name}: {error}") from None
    return pa.RecordBatch.from_arrays(arrays, schema=columns.schema)


def _block_values(
    store: KeyValueStore,
    key: str,
    info: SliceInfo,
    wanted: list[int],
    span: tuple[int, int],
    snapshot: Snapshot | None,
) -> tuple[list[Any], list[Any]]:
    """Of each wanted column, its head and its blocks ``span`` as byte ranges of the value."""
    assert info.columns is not None and info.blocks is not None
    offsets = _column_offsets(info.columns)
    ranges = []
    for i in wanted:
        lengths = info.blocks[i]
        assert sum(lengths) == info.columns[i], (i, lengths, info.columns[i])
        start = offsets[i] + lengths[0]
        low = start + sum(lengths[1 : 1 + span[0]])
        high = start + sum(lengths[1 : 1 + span[1]])
        ranges += [(offsets[i], start), (low, high)]
    values = _ranges_of_value(store, key, info, ranges, snapshot)
    return values[0::2], values[1::2]


def _column_offsets(lengths: list[int]) -> list[int]:
    """Where each column stream starts in a slice value, and (last) where the value ends."""
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return offsets


def _ranges_of_value(
    store: KeyValueStore,
    key: str,
    info: SliceInfo,
    ranges: list[tuple[int, int]],
    snapshot: Snapshot | None,
) -> list[Any]:
    """Byte ranges [start, end) of a slice value, each cut at the stripes it crosses and read
    in one call; a range within one stripe comes in place (or as its one copy)."""
    stripe = info.stripe_bytes or max(1, info.bytes_stored)
    keys = naming.slice_value_keys(key, info.stripes)
    pieces: list[tuple[str, int, int]] = []
    counts = []
    for start, end in ranges:
        first, last = start // stripe, max(start, end - 1) // stripe
        counts.append(last - first + 1)
        for s in range(first, last + 1):
            low, high = max(start, s * stripe), min(end, (s + 1) * stripe)
            pieces.append((keys[min(s, len(keys) - 1)], low - s * stripe, high - s * stripe))
    values: list = snapshot.ranges(pieces) if snapshot is not None else store.get_ranges(pieces)
    out = []
    for count in counts:
        out.append(values[0] if count == 1 else b"".join(values[:count]))
        values = values[count:]
    return out


def slice_what(meta: PartitionMeta, number: int) -> str:
    """How errors name a copy of a slice (``CorruptSlice`` reads it back)."""
    on = f" on device {meta.device}" if meta.device else ""
    return f"slice {number} of partition {meta.partition} of {meta.domain}/{meta.dataset}{on}"


def verify_parts(meta: PartitionMeta, number: int, parts: list[Any], indices: list[int]) -> bool:
    """Check column streams read off the store (``parts``, of the columns at ``indices``)
    against the lengths and checksums the metadata slice keeps; whether they had checksums."""
    info = meta.slices[number]
    assert info.columns is not None, "a slice stored whole has no stream per column"
    checksums = info.checksums
    if checksums is not None and len(checksums) != len(info.columns):
        raise CorruptSlice(f"{len(checksums)} checksums for {len(info.columns)} columns")
    verified = False
    for part, index in zip(parts, indices, strict=True):
        expected = None if checksums is None else checksums[index]
        what = f"column {meta.schema.field(index).name}"
        verified = checksum.check(part, info.columns[index], expected, what) or verified
    return verified


def read_stored(
    store: KeyValueStore, meta: PartitionMeta, number: int, columns: list[str]
) -> tuple[list[bytes | memoryview], list[int] | None] | None:
    """The stored IPC streams of ``columns`` of a slice, undecoded but checked against their
    checksums, and those checksums, for the receiver to check again (None: none kept). None
    for a slice stored whole, in the first format, with no stream per column."""
    info = meta.slices[number]
    if info.columns is None:
        return None
    key = naming.slice_key(meta.domain, meta.dataset, meta.partition, number)
    wanted = column_indices(meta, columns)
    parts = _column_values(store, key, info, wanted)
    wanted_parts = [parts[i] for i in wanted]
    try:
        verify_parts(meta, number, wanted_parts, wanted)
    except CorruptSlice as error:
        raise CorruptSlice(f"{slice_what(meta, number)}: {error}") from None
    checksums = None if info.checksums is None else [info.checksums[i] for i in wanted]
    return wanted_parts, checksums


def column_indices(meta: PartitionMeta, columns: list[str] | None) -> list[int]:
    """Schema positions of ``columns`` (None: every column), in the order asked."""
    if columns is None:
        return list(range(len(meta.schema)))
    indices = [meta.schema.get_field_index(c) for c in columns]
    unknown = [c for c, i in zip(columns, indices, strict=True) if i < 0]
    if unknown:
        raise QueryError(
            f"{meta.domain}/{meta.dataset} has no column {', '.join(unknown)} "
            f"(its columns: {', '.join(meta.schema.names)})"
        )
    return indices


def read_bytes(
    meta: PartitionMeta,
    number: int,
    columns: list[str] | None = None,
    rows: tuple[int, int] | None = None,
) -> int:
    """Bytes ``fetch_slice`` takes off the store for these columns (and rows) of a slice."""
    info = meta.slices[number]
    span = info.block_span(rows) if info.columns is not None else None
    if span is None:
        return whole_read_bytes(meta, columns)[number]
    assert info.blocks is not None
    total = 0
    for i in column_indices(meta, columns):
        lengths = info.blocks[i]
        total += lengths[0] + sum(lengths[1 + span[0] : 1 + span[1]])
    return total


def whole_read_bytes(meta: PartitionMeta, columns: list[str] | None) -> tuple[int, ...]:
    """Bytes a read of these columns of each whole slice takes, worked out once per set of
    columns: a device asks for every slice of every request it runs (a chunk's size, the
    cache's admission, each slice's read), and a partition's metadata outlives requests."""
    key = None if columns is None else tuple(columns)
    sizes = meta._read_sizes.get(key)
    if sizes is None or len(sizes) != len(meta.slices):  # a writer's metadata grows
        sizes = tuple(
            column_bytes(meta.schema, info.columns, info.bytes_stored, columns)
            for info in meta.slices
        )
        meta._read_sizes[key] = sizes
    return sizes


def zone_bounds(meta: PartitionMeta, column: str) -> IntegerBounds:
    """A column's zone maps over every slice as arrays, made once per column of a partition's
    metadata (which outlives requests: ``device.loop.Metas``)."""
    bounds = meta._zone_bounds.get(column)
    if bounds is None or len(bounds.known) != len(meta.slices):  # a writer's metadata grows
        bounds = integer_bounds([(info.zone_map or {}).get(column) for info in meta.slices])
        meta._zone_bounds[column] = bounds
    return bounds


def column_bytes(
    schema: pa.Schema, lengths: list[int] | None, whole: int, columns: list[str] | None
) -> int:
    """Of a slice value of ``whole`` bytes, those of ``columns``' streams (all of it when the
    value was stored whole, or every column is asked for)."""
    if lengths is None or columns is None:
        return whole
    indices = {schema.get_field_index(c) for c in columns}
    return sum(lengths[i] for i in indices if i >= 0)


def _column_values(
    store: KeyValueStore,
    key: str,
    info: SliceInfo,
    wanted: list[int],
    snapshot: Snapshot | None = None,
) -> dict[int, bytes | memoryview | pa.Buffer]:
    """The IPC streams of the wanted columns, read as byte ranges of the slice value (runs of
    neighbouring columns as one range, each range cut at the stripes it crosses)."""
    assert info.columns is not None
    offsets = _column_offsets(info.columns)
    runs: list[list[int]] = []
    for i in sorted(set(wanted)):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    ranges = [(offsets[run[0]], offsets[run[-1] + 1]) for run in runs]
    out: dict[int, bytes | memoryview | pa.Buffer] = {}
    for run, data in zip(runs, _ranges_of_value(store, key, info, ranges, snapshot), strict=True):
        base, view = offsets[run[0]], memoryview(data)  # columns of a run share it
        for i in run:
            out[i] = view[offsets[i] - base : offsets[i + 1] - base] if len(run) > 1 else data
    return out


def read_slices(
    store: KeyValueStore,
    meta: PartitionMeta,
    first: int = 0,
    end: int | None = None,
    columns: list[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    end = len(meta.slices) if end is None else min(end, len(meta.slices))
    for number in range(first, end):
        yield read_slice(store, meta, number, columns)


def drop(store: KeyValueStore, domain: str, dataset: str) -> int:
    deleted = store.delete_prefix(naming.dataset_prefix(domain, dataset))
    deleted += store.delete_prefix(f"{CATALOG_PREFIX}{domain}/{dataset}/")
    deleted += store.delete_prefix(f"{naming.CACHE_PREFIX}{domain}/{dataset}/")
    store.delete_prefix(f"{naming.RETIRED_PREFIX}{domain}/{dataset}/", visible=False)
    return deleted


# ---- moves: a partition copied elsewhere leaves this device -------------------------------------


def retire(
    store: KeyValueStore, domain: str, dataset: str, partition: int, ingest_id: str, now: float
) -> bool:
    """Take a committed partition out of this device's inventory (it was copied elsewhere and
    committed there): from now on no query planned anew reads it here. Its rows and metadata
    stay until ``purge_retired`` runs past the grace, so work planned before the move still
    reads whole what it started on. Only the partition of ``ingest_id``: a dataset dropped
    and ingested again under the name is not touched. Returns whether it retired one."""
    catalog_key = _catalog_key(domain, dataset, partition)
    with store.transaction() as txn:
        if not txn.version(catalog_key):
            return False
        summary = catalog_entry_in(txn, domain, dataset, partition)
        if summary["ingest"]["id"] != ingest_id:
            return False
        txn.delete(catalog_key)
        marker = {"ingest": ingest_id, "retired_at": now}
        txn.put(naming.retired_key(domain, dataset, partition), _json_bytes(marker))
    return True


def purge_retired(store: KeyValueStore, keep_s: float, now: float) -> int:
    """Delete the rows of partitions retired more than ``keep_s`` ago; returns how many."""
    purged = 0
    for key in store.list(naming.RETIRED_PREFIX):
        try:
            marker = _load_json(store.get(key)[0])
        except KeyNotFound:
            continue
        if marker.get("retired_at", 0.0) + keep_s > now:
            continue
        domain, dataset, partition = key[len(naming.RETIRED_PREFIX) :].split("/")
        with store.transaction(visible=False) as txn:  # nothing listed changes
            purged += _clear_retired(txn, domain, dataset, int(partition))
    return purged


def _clear_retired(txn: Any, domain: str, dataset: str, partition: int) -> int:
    """Delete a retired partition's leftovers and its mark, if it is retired here."""
    marker = naming.retired_key(domain, dataset, partition)
    if not txn.version(marker) or txn.version(_catalog_key(domain, dataset, partition)):
        return 0
    for key in txn.list(naming.partition_prefix(domain, dataset, partition)):
        txn.delete(key)
    txn.delete(marker)
    return 1


def set_holders(
    store: KeyValueStore,
    domain: str,
    dataset: str,
    partition: int,
    ingest_id: str,
    devices: list[str],
) -> bool:
    """Record which devices hold a committed partition now (its ingest's placement, as this
    copy remembers it): after a move the catalog waits for those devices, not the ones the
    ingest first chose. Returns whether this device holds the partition of ``ingest_id``."""
    catalog_key = _catalog_key(domain, dataset, partition)
    meta_key = naming.meta_key(domain, dataset, partition)
    # what a query reads does not change (its rows, its slices): no new catalog generation
    with store.transaction(visible=False) as txn:
        if not txn.version(catalog_key):
            return False
        summary = catalog_entry_in(txn, domain, dataset, partition)
        if summary["ingest"]["id"] != ingest_id:
            return False
        meta_keys = _meta_keys(txn, meta_key)
        raw = codec.unstripe([txn.get(k)[0] for k in meta_keys])
        meta, _ = _unsealed_json(raw, meta_what(domain, dataset, partition))
        for body in (summary, meta):
            body["ingest"]["placement"] = {
                **body["ingest"].get("placement", {}),
                str(partition): list(devices),
            }
        txn.put(catalog_key, _sealed_json(summary))
        for old in meta_keys:
            txn.delete(old)
        _put_striped(txn, meta_key, _sealed_json(meta), store.kv_bytes_max)
    return True


def update_slice(
    store: KeyValueStore,
    domain: str,
    dataset: str,
    partition: int,
    number: int,
    batch: pa.RecordBatch,
    expected_version: int,
) -> int:
    """Replace one slice atomically if its version is still ``expected_version``.

    Each slice's version lives in the metadata slice and grows with every update. The check, the
    new stripes and the new metadata are one LMDB transaction: the loser of a race raises
    ``VersionConflict`` and none of its key-values change.
    """
    if not batch.schema.equals(read_meta(store, domain, dataset, partition).schema):
        raise SchemaMismatch(f"new slice schema {batch.schema} differs from {domain}/{dataset}'s")
    key = naming.slice_key(domain, dataset, partition, number)
    with store.transaction() as txn:
        meta = meta_in(txn, domain, dataset, partition)
        if not 0 <= number < len(meta.slices):
            raise KeyNotFound(
                f"slice {number} of {domain}/{dataset} partition {partition} does not exist"
            )
        old = meta.slices[number]
        if old.version != expected_version:
            raise VersionConflict(
                f"slice {number} of {domain}/{dataset} partition {partition} is at version "
                f"{old.version}, not {expected_version}: another writer updated it first; "
                "nothing was written. Read it again and retry."
            )
        for old_key in naming.slice_value_keys(key, old.stripes):
            txn.delete(old_key)
        meta.slices[number] = store_slice(
            txn,
            key,
            batch,
            meta.compression,
            store.kv_bytes_max,
            old.version + 1,
            block_rows_for(batch, block_bytes_of(meta)),
        )
        put_meta(txn, meta, store.kv_bytes_max)
    return old.version + 1


def _meta_keys(txn: Any, meta_key: str) -> list[str]:
    return [k for k in txn.list(meta_key) if k == meta_key or k.startswith(meta_key + ".")]
