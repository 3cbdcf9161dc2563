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
from quarry.store import codec, naming
from quarry.store.kv import KeyValueStore, Snapshot
from quarry.store.zonemap import zone_map, zone_map_from_json, zone_map_to_json

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


def _stored_slice(
    txn: Any, key: str, batch: pa.RecordBatch, compression: str, kv_bytes_max: int, version: int
) -> SliceInfo:
    """Store one slice value (a stream per column) and describe it for the metadata slice."""
    value, lengths = codec.encode_columns(batch, compression)
    stripes = _put_striped(txn, key, value, kv_bytes_max)
    striped = kv_bytes_max if stripes > 1 else 0
    return SliceInfo(
        batch.num_rows,
        len(value),
        batch.nbytes,
        stripes,
        zone_map(batch),
        version,
        lengths,
        striped,
    )


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
    ):
        self.store = store
        self.meta = meta
        self.lease_s = lease_s
        self._pending_rows: list[pa.RecordBatch] = []
        self._pending_count = 0
        bytes_per_row = max(1.0, _bytes_per_row_estimate(meta.schema))
        self.fixed = slice_rows is not None  # chosen for every replica: kept as given
        self.slice_rows = slice_rows or codec.rows_per_slice(bytes_per_row, store.kv_bytes_max)
        self._started = False
        # sorted by this column before it is cut into slices (the whole partition waits here)
        self.cluster_by = meta.ingest.get("cluster_by") or None

    def _start(self) -> None:
        d, n, p = self.meta.domain, self.meta.dataset, self.meta.partition
        with self.store.transaction() as txn:
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
        batch = (
            head.to_batches()[0]
            if head.num_rows
            else pa.RecordBatch.from_pylist([], schema=self.meta.schema)
        )
        self._store_slice(batch)

    def _store_slice(self, batch: pa.RecordBatch) -> None:
        number = len(self.meta.slices)
        if number >= naming.SLICES_MAX:
            raise IngestFailed("partition has too many slices; use more partitions")
        key = naming.slice_key(self.meta.domain, self.meta.dataset, self.meta.partition, number)
        with self.store.transaction() as txn:
            self._check_pending(txn)
            info = _stored_slice(
                txn, key, batch, self.meta.compression, self.store.kv_bytes_max, version=1
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
        with self.store.transaction() as txn:
            self._check_pending(txn)
            txn.put(naming.pending_key(m.domain, m.dataset, m.partition) + "/meta-ready", b"1")
            _put_striped(
                txn,
                naming.pending_key(m.domain, m.dataset, m.partition) + "/meta",
                _json_bytes(m.to_json()),
                self.store.kv_bytes_max,
            )
        return m


def _bytes_per_row_estimate(schema: pa.Schema) -> float:
    total = 0.0
    for f in schema:
        try:
            total += f.type.bit_width / 8
        except ValueError:  # variable width (strings, lists): a guess, replaced by real data
            total += 16.0
    return total


def commit(store: KeyValueStore, ingest_id: str, device: str) -> list[int]:
    """Make every pending partition of an ingest visible; one transaction for all of them."""
    committed: list[int] = []
    with store.transaction() as txn:
        for pending in txn.list(naming.PENDING_PREFIX):
            if pending.count("/") != 3:
                continue  # a sub-key such as ".../meta"
            body = _load_json(txn.get(pending)[0])
            if body["ingest"]["id"] != ingest_id:
                continue
            if not txn.version(pending + "/meta-ready"):
                raise IngestFailed(f"partition {pending} of ingest {ingest_id} was not finished")
            meta_keys = [k for k in txn.list(pending + "/meta") if k != pending + "/meta-ready"]
            body = _load_json(codec.unstripe([txn.get(k)[0] for k in meta_keys]))
            meta = PartitionMeta.from_json(body)
            meta.device = device
            _put_striped(
                txn,
                naming.meta_key(meta.domain, meta.dataset, meta.partition),
                _json_bytes(meta.to_json()),
                store.kv_bytes_max,
            )
            txn.put(
                _catalog_key(meta.domain, meta.dataset, meta.partition), _json_bytes(meta.summary())
            )
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
        deleted += store.delete_prefix(naming.partition_prefix(domain, dataset, int(partition)))
        deleted += store.delete_prefix(pending)
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
        deleted += store.delete_prefix(naming.partition_prefix(domain, dataset, int(partition)))
        deleted += store.delete_prefix(pending)
    return deleted


def renew(store: KeyValueStore, ingest_id: str, lease_s: float) -> int:
    """The ingest's coordinator is alive: its pending partitions here stay ``lease_s`` longer."""
    renewed = 0
    with store.transaction() as txn:
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


def inventory(store: KeyValueStore) -> list[dict[str, Any]]:
    return [_load_json(store.get(key)[0]) for key in store.list(CATALOG_PREFIX)]


def read_meta(store: KeyValueStore, domain: str, dataset: str, partition: int) -> PartitionMeta:
    try:
        raw = _read_striped_meta(store, naming.meta_key(domain, dataset, partition))
    except KeyNotFound:
        raise DatasetNotFound(
            f"partition {partition} of {domain}/{dataset} is not on this device"
        ) from None
    return PartitionMeta.from_json(_load_json(raw))


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


def fetch_slice(
    store: KeyValueStore,
    meta: PartitionMeta,
    number: int,
    columns: list[str] | None = None,
    snapshot: Snapshot | None = None,
) -> FetchedSlice:
    """The stored bytes of a slice's ``columns``; read in place through ``snapshot`` (the
    batch decoded from them then holds it open), else copied off the store."""
    info = meta.slices[number]
    key = naming.slice_key(meta.domain, meta.dataset, meta.partition, number)
    if info.columns is None:  # stored whole
        value = codec.unstripe(store.get_many(naming.slice_value_keys(key, info.stripes)))
        return FetchedSlice(number, columns, value, None, None)
    wanted = column_indices(meta, columns)
    parts = _column_values(store, key, info, wanted, snapshot)
    return FetchedSlice(number, columns, None, [parts[i] for i in wanted], wanted)


def decode_read(meta: PartitionMeta, fetched: FetchedSlice) -> pa.RecordBatch:
    info = meta.slices[fetched.number]
    try:
        if fetched.whole is not None:
            batch = codec.decode_slice(fetched.whole, meta.schema, info.rows)
            return batch.select(fetched.columns) if fetched.columns is not None else batch
        assert fetched.parts is not None and fetched.indices is not None
        return codec.decode_columns(fetched.parts, meta.columns(fetched.indices), info.rows)
    except CorruptSlice as error:
        raise CorruptSlice(
            f"slice {fetched.number} of partition {meta.partition} of "
            f"{meta.domain}/{meta.dataset}: {error}"
        ) from None


def read_stored(
    store: KeyValueStore, meta: PartitionMeta, number: int, columns: list[str]
) -> list[bytes | memoryview] | None:
    """The stored IPC streams of ``columns`` of a slice, undecoded (None: the slice was stored
    whole, in the first format, and has no stream per column)."""
    info = meta.slices[number]
    if info.columns is None:
        return None
    key = naming.slice_key(meta.domain, meta.dataset, meta.partition, number)
    wanted = column_indices(meta, columns)
    parts = _column_values(store, key, info, wanted)
    return [parts[i] for i in wanted]


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


def read_bytes(meta: PartitionMeta, number: int, columns: list[str] | None = None) -> int:
    """Bytes ``read_slice`` takes off the store for these columns of a slice."""
    info = meta.slices[number]
    return column_bytes(meta.schema, info.columns, info.bytes_stored, columns)


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
    offsets = [0]
    for length in info.columns:
        offsets.append(offsets[-1] + length)
    runs: list[list[int]] = []
    for i in sorted(set(wanted)):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    stripe = info.stripe_bytes or max(1, info.bytes_stored)
    keys = naming.slice_value_keys(key, info.stripes)
    pieces: list[tuple[str, int, int]] = []
    counts = []
    for run in runs:
        start, end = offsets[run[0]], offsets[run[-1] + 1]
        first, last = start // stripe, max(start, end - 1) // stripe
        counts.append(last - first + 1)
        for s in range(first, last + 1):
            low, high = max(start, s * stripe), min(end, (s + 1) * stripe)
            pieces.append((keys[min(s, len(keys) - 1)], low - s * stripe, high - s * stripe))
    values: list = snapshot.ranges(pieces) if snapshot is not None else store.get_ranges(pieces)
    out: dict[int, bytes | memoryview | pa.Buffer] = {}
    for run, count in zip(runs, counts, strict=True):
        # a run within one stripe is read in place (or its one copy); across stripes, joined
        data = values[0] if count == 1 else b"".join(values[:count])
        values = values[count:]
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
    return deleted


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
    meta_key = naming.meta_key(domain, dataset, partition)
    key = naming.slice_key(domain, dataset, partition, number)
    with store.transaction() as txn:
        meta = PartitionMeta.from_json(
            _load_json(codec.unstripe([txn.get(k)[0] for k in _meta_keys(txn, meta_key)]))
        )
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
        meta.slices[number] = _stored_slice(
            txn, key, batch, meta.compression, store.kv_bytes_max, old.version + 1
        )
        for old_meta in _meta_keys(txn, meta_key):
            txn.delete(old_meta)
        _put_striped(txn, meta_key, _json_bytes(meta.to_json()), store.kv_bytes_max)
        txn.put(_catalog_key(domain, dataset, partition), _json_bytes(meta.summary()))
    return old.version + 1


def _meta_keys(txn: Any, meta_key: str) -> list[str]:
    return [k for k in txn.list(meta_key) if k == meta_key or k.startswith(meta_key + ".")]
