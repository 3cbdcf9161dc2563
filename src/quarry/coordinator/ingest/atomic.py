"""Atomic ingest: rows -> row groups -> partitions on devices (pending) -> commit everywhere.

Phase one streams each partition to each of its replicas; a device stores it pending and makes
it durable before answering, and keeps it while this coordinator renews its lease. Phase two
commits on the ingest's *decider* first (the first holder of the first partition): its commit
is the decision. Any failure before it aborts the ingest everywhere. After it the others commit;
one that does not answer commits on its own when it comes back, asking the decider
(quarry.device.janitor). A coordinator that dies leaves pending partitions whose leases run out:
their devices ask the decider, which aborts what it still holds, and clean up, with no restart.
So a dataset is listed only when every partition is durable on every replica, ends complete or
absent everywhere, and its name can be ingested again.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from quarry import settings
from quarry.coordinator.ingest import layout
from quarry.coordinator.ingest.parity import ParityBuilder
from quarry.coordinator.ingest.sources import GuardedReader, open_source
from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.coordinator.membership.device_client import DeviceClient, finish_put
from quarry.coordinator.membership.placement import place_all, shared_domains
from quarry.errors import (
    DatasetExists,
    DatasetNotFound,
    DeviceUnavailable,
    Forbidden,
    IngestFailed,
    InvalidOption,
    QuarryError,
    SchemaMismatch,
    SourceError,
    Unauthenticated,
)
from quarry.progress import Bar
from quarry.protocol.control import IngestRecord, StripeGroup
from quarry.protocol.ingest import PartitionWritten, PutPartition, Renew, Renewed
from quarry.store import naming, parity
from quarry.store.codec import BLOCK_BYTES_HINT, check_compression

if TYPE_CHECKING:
    from quarry.coordinator.membership.membership import Membership

MODES = ("create", "append")
# errors that say what the user must change, not that the ingest broke: raised as they are
PASSED_ON = (SourceError, SchemaMismatch, DatasetExists, Forbidden, Unauthenticated)
RENEWALS_PER_LEASE = 3  # a lease is renewed this often before it would run out


def ingest(
    cluster: Membership,
    source: Any,
    dataset: str,
    *,
    replicas: int = 1,
    compression: str = "none",
    partitions: int | None = None,
    mode: str = "create",
    metadata: dict[str, str] | None = None,
    hints: dict[str, Any] | None = None,
    format: str | None = None,
    progress: bool | None = None,
    cluster_by: str | None = None,
    redundancy: str = "",
    contiguous_slices: bool = False,
) -> DatasetEntry:
    """``redundancy``: "" keeps ``replicas`` copies of each partition; "ec:K+M" stripes the
    partitions K at a time with M parity partitions each (``store/parity.py``).
    ``contiguous_slices``: every slice holds one run of the source's rows, so zone maps of a
    column in the source's order prune tightly (``ingest/layout.contiguous_slices``)."""
    domain, name = naming.split_dataset(dataset)
    check_compression(compression)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    code = parity.parse(redundancy)
    if code is not None and replicas != 1:
        raise InvalidOption(f"{code.text} keeps one copy of each slice and parity: drop replicas")
    if code is not None and (hints or {}).get(BLOCK_BYTES_HINT):
        # parity is coded over the host's own encoding of each slice, which is not blocked
        raise InvalidOption(
            f"{code.text} codes parity over whole slices: drop the {BLOCK_BYTES_HINT} hint "
            "(slices in blocks) or keep replicas instead"
        )
    cluster.refresh()
    existing = cluster.catalog.get(f"{domain}/{name}")
    if existing is not None and mode == "append":
        code = parity.parse(existing.ingests[0].redundancy)  # an append keeps the dataset's
    if mode == "create" and existing is not None:
        raise DatasetExists(
            f"dataset {domain}/{name} already exists ({existing.rows} rows): drop it first "
            f"(quarry drop {domain}/{name}), append to it (--append), or choose another name"
        )
    if mode == "append" and existing is None:
        raise DatasetNotFound(f"cannot append to {domain}/{name}: it does not exist")

    opened = open_source(source, format)
    schema = opened.reader.schema
    if existing is not None and not schema.equals(existing.schema):
        raise SchemaMismatch(
            _schema_difference(f"{domain}/{name}", existing.schema, schema, opened.name)
        )
    _check_cluster_by(cluster_by, schema)
    devices = cluster.placing_devices()
    if not devices:
        raise IngestFailed("no device answers: start the cluster first (quarry up)")
    if not 1 <= replicas <= len(devices):
        raise IngestFailed(
            f"asked for {replicas} replicas but {len(devices)} devices answer: use 1 to "
            f"{len(devices)}"
        )
    if code is not None and code.k + code.m > len(devices):
        raise IngestFailed(
            f"{code.text} puts each stripe's {code.k + code.m} slices on as many devices, but "
            f"{len(devices)} answer: start more or choose a smaller K+M"
        )

    first_batch, rows = _peek(GuardedReader(opened))
    drives = sum(cluster.info[d.name].drives for d in devices if d.name in cluster.info)
    drives = max(drives, len(devices))
    partition_count = partitions or layout.partitions_for(first_batch, opened.rows_total, drives)
    if code is not None:
        partition_count = _striped_count(code, partition_count, len(devices), drives)
    first = 0 if existing is None else _next_partition(existing, data=True)
    limit = naming.PARTITIONS_MAX if code is None else parity.PARITY_FIRST
    if first + partition_count > limit:
        raise IngestFailed(f"{domain}/{name} would exceed {limit} data partitions")
    ingest_id = uuid.uuid4().hex
    by_id = {d.name: d for d in devices}
    # where each device sits (host, rack): replicas of a partition go to distinct ones
    domains = {device: at for device, at in cluster.domains().items() if device in by_id}
    stripes: tuple[StripeGroup, ...] = ()
    if code is None:
        placement = {
            str(p): devices_of_p
            for p, devices_of_p in place_all(
                f"{domain}/{name}",
                range(first, first + partition_count),
                dict(sorted(domains.items())),
                replicas,
            ).items()
        }
    else:
        parity_first = _next_partition(existing, data=False) if existing else parity.PARITY_FIRST
        stripes, placement = _place_stripes(
            code, f"{domain}/{name}", first, partition_count, parity_first, domains
        )
    involved = sorted({d for names in placement.values() for d in names})
    kv_bytes_max = {d.name: cluster.info[d.name].profile.kv_bytes_max for d in devices}
    slice_rows_all = None  # one size for every partition: a group is a slice wherever it lands
    if contiguous_slices:
        slice_rows_all = _contiguous_slice_rows(first_batch, placement, kv_bytes_max)
    group_rows = layout.group_rows_for(
        first_batch, opened.rows_total, partition_count, slice_rows_all
    )
    record = IngestRecord(
        id=ingest_id,
        first_partition=first,
        partitions=partition_count,
        replicas=replicas,
        mode=mode,
        created_at=time.time(),
        placement=placement,
        # the file it came from, absolute: a program that reads it is served this dataset
        source=str(Path(opened.name).resolve()) if isinstance(source, str | Path) else opened.name,
        # whose commit decides: the first holder of the first partition, asked by any
        # participant that misses the outcome
        decider=placement[str(first)][0],
        addresses={d: by_id[d].address for d in involved},
        group_rows=group_rows,
        cluster_by=cluster_by or "",
        redundancy=code.text if code is not None else "",
        stripes=stripes,
    )
    lease_s = lease_seconds()
    streams: dict[tuple[int, str], tuple[Any, Any]] = {}

    parity_partitions = {p for group in stripes for p in group.parity}
    slice_rows_of: dict[int, int | None] = {}  # as each data partition's devices cut it

    def stream(partition: int, device: str, rows: pa.Table | None = None) -> tuple[Any, Any]:
        key = (partition, device)
        if key not in streams and partition in parity_partitions:
            request = PutPartition(
                domain=domain,
                dataset=name,
                partition=partition,
                ingest=record,
                hints={"parity": record.redundancy},
                lease_s=lease_s,
                slice_rows=1,  # a parity slice is one stripe's row
            )
            streams[key] = by_id[device].open_put(request, parity.SCHEMA)
        if key not in streams:
            replicas_kv = [kv_bytes_max[d] for d in placement[str(partition)]]
            request = PutPartition(
                domain=domain,
                dataset=name,
                partition=partition,
                ingest=record,
                compression=compression,
                metadata=metadata or {},
                hints=hints or {},
                lease_s=lease_s,
                slice_rows=slice_rows_all or layout.slice_rows_for(rows, min(replicas_kv)),
            )
            slice_rows_of.setdefault(partition, request.slice_rows)
            streams[key] = by_id[device].open_put(request, schema)
        return streams[key]

    builder = None
    if code is not None:

        def send_parity(partition: int, row: pa.RecordBatch) -> None:
            (device,) = placement[str(partition)]
            writer, _ = stream(partition, device)
            by_id[device].guard(lambda: writer.write_batch(row))

        builder = ParityBuilder(
            code,
            stripes,
            schema,
            compression,
            {p: kv_bytes_max[placement[str(p)][0]] for g in stripes for p in g.data},
            cluster_by,
            send_parity,
        )

    def fed(partition: int, rows: pa.Table) -> None:
        if builder is not None:
            builder.add(partition, rows, slice_rows_of.get(partition))

    with Renewer([by_id[d] for d in involved], ingest_id, lease_s):
        try:
            _send(rows, opened, record, by_id, stream, progress, fed)
            if builder is not None:
                builder.finish()
            for partition in record.written():
                for device in placement[str(partition)]:
                    writer, reader = stream(partition, device)
                    ack = by_id[device].guard(lambda w=writer, r=reader: finish_put(w, r))
                    if builder is not None and partition not in parity_partitions:
                        written = PartitionWritten.from_bytes(ack)
                        builder.check(partition, written.slices, written.bytes_stored, device)
            _decide(by_id[record.decider], record, f"{domain}/{name}")
        except BaseException as error:
            if isinstance(error, OutcomeUnknown):
                raise  # the decider decides: nothing here may abort the others
            _abort(by_id, involved, ingest_id, streams)
            if isinstance(error, PASSED_ON):
                raise
            if isinstance(error, QuarryError):
                raise IngestFailed(
                    f"ingest of {domain}/{name} failed and was rolled back, nothing is visible: "
                    f"{error}"
                ) from error
            raise
    _commit_rest(by_id, involved, record)
    cluster.refresh()
    entry = cluster.catalog.get(f"{domain}/{name}")
    if entry is None:  # a device that missed its commit and still answers: it settles soon
        raise IngestFailed(
            f"ingest of {domain}/{name} is committed but not yet visible on every device; "
            "they settle it on their own within seconds: list it again"
        )
    spread = code.k + code.m if code is not None else replicas
    held = [stripe_devices(g, placement) for g in stripes] or list(placement.values())
    shared = shared_domains(((spread, p) for p in held), domains)
    return replace(entry, warnings=tuple(s.message() for s in shared)) if shared else entry


def _striped_count(code: parity.Code, count: int, devices: int, drives: int) -> int:
    """Data partitions of an erasure-coded ingest: whole stripe groups of K. Every partition a
    query reads costs its device a run of its own, so a table that fills every drive keeps at
    most one data partition on a device: its count rounded down to whole groups (4+2 or 8+2 on
    ten devices: 8, on eight of them), and up to whole rounds of the devices where K divides
    them (4+2 on eight: 8, one on each). 4+2 on ten answered 10% faster than replicas 1 in 8;
    rounded up, in 12 (two on two devices, the busiest's share 2/12 where 8 give each 1/8), 8%
    slower; dealt evenly, two on every device, in 20, 29% slower (docs/redundancy.md). A
    smaller table gets its count rounded up to whole groups."""
    if count < drives:
        return -(-count // code.k) * code.k
    groups = max(1, count // code.k)
    if devices % code.k == 0:
        rounds = devices // code.k
        groups = -(-groups // rounds) * rounds
    return groups * code.k


def _next_partition(existing: DatasetEntry, data: bool) -> int:
    """The first number an append's data (or parity) partitions take."""
    if data:
        numbers = [p.partition for p in existing.partitions] + list(existing.unavailable)
        return max(numbers) + 1
    numbers = [p.partition for p in existing.parity] + list(existing.parity_lost)
    return max(numbers, default=parity.PARITY_FIRST - 1) + 1


def _place_stripes(
    code: parity.Code,
    dataset: str,
    first: int,
    count: int,
    parity_first: int,
    domains: dict[str, Any],
) -> tuple[tuple[StripeGroup, ...], dict[str, list[str]]]:
    """Stripe groups and where each member goes: a group's K+M partitions on K+M devices in
    distinct failure domains while enough exist (placed as K+M replicas of one partition), the
    M that hold the least data so far taking its parity, so data spreads evenly."""
    groups = count // code.k
    placed = place_all(
        f"{dataset}#stripes", range(groups), dict(sorted(domains.items())), code.k + code.m
    )
    data_load: dict[str, float] = dict.fromkeys(domains, 0.0)
    # a device's data to come: its places in the groups not yet given roles, each worth the
    # data share of a place (K of K+M), so a device in many groups takes parity in some
    ahead = Counter(d for g in range(groups) for d in placed[g])
    stripes, placement = [], {}
    for g in range(groups):
        devices = list(placed[g])
        ahead.subtract(devices)
        share = code.k / (code.k + code.m)
        by_load = sorted(
            devices, key=lambda d: (-(data_load[d] + share * ahead[d]), -devices.index(d))
        )
        parity_devices = set(by_load[: code.m])
        data_devices = [d for d in devices if d not in parity_devices]
        parity_ordered = [d for d in devices if d in parity_devices]
        data = tuple(range(first + g * code.k, first + (g + 1) * code.k))
        parity_numbers = tuple(range(parity_first + g * code.m, parity_first + (g + 1) * code.m))
        for partition, device in zip(data, data_devices, strict=True):
            placement[str(partition)] = [device]
            data_load[device] += 1
        for partition, device in zip(parity_numbers, parity_ordered, strict=True):
            placement[str(partition)] = [device]
        stripes.append(StripeGroup(data, parity_numbers))
    return tuple(stripes), placement


def stripe_devices(group: StripeGroup, placement: dict[str, list[str]]) -> list[str]:
    """The devices a stripe group's members are on (each one, for its domains to be apart)."""
    return [d for p in (*group.data, *group.parity) for d in placement.get(str(p), [])]


def _contiguous_slice_rows(
    first: pa.RecordBatch | None, placement: dict[str, list[str]], kv_bytes_max: dict[str, int]
) -> int | None:
    """``layout.contiguous_slices`` for the smallest value limit of any device the ingest
    writes to."""
    holders = {d for devices in placement.values() for d in devices}
    return layout.contiguous_slices(first, min(kv_bytes_max[d] for d in holders))


def _check_cluster_by(column: str | None, schema: pa.Schema) -> None:
    """A clustering column must exist and have an order (numbers, strings, dates...)."""
    if column is None:
        return
    if column not in schema.names:
        raise InvalidOption(
            f"cannot cluster by {column!r}: the source has no such column "
            f"(its columns: {', '.join(schema.names)})"
        )
    kind = schema.field(column).type
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind) or pa.types.is_null(kind):
        raise InvalidOption(f"cannot cluster by {column!r}: its type {kind} has no order")


def lease_seconds() -> float:
    """How long a pending partition outlives a coordinator that stopped renewing it
    ($QUARRY_INGEST_LEASE_S, for experiments and tests; the protocol's default otherwise)."""
    return settings.INGEST_LEASE_S.get()


class Renewer:
    """Renews an ingest's leases on its devices while the ingest runs (a thread)."""

    def __init__(self, clients: list[DeviceClient], ingest_id: str, lease_s: float):
        self.clients = clients
        self.request = Renew(ingest_id, lease_s)
        self.period_s = lease_s / RENEWALS_PER_LEASE
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quarry-renew", daemon=True)

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for client in self.clients:
                with contextlib.suppress(QuarryError):  # a dead device fails the ingest anyway
                    client.ask(self.request, Renewed)


class OutcomeUnknown(IngestFailed):
    """The decider stopped answering while it was asked to commit, and still does not: it
    alone knows whether the ingest is committed. The other participants keep their partitions
    pending, stop being renewed, and ask it once their leases run out: the dataset ends
    complete or absent everywhere, as it says."""


def _decide(decider: DeviceClient, record: IngestRecord, dataset: str) -> None:
    """Commit on the decider first: from then on the ingest is committed, whatever fails.

    A decider cut off while asked (the answer lost on a silent link) may or may not have
    committed. It is asked to abort, then what it holds: an abort there makes a commit that
    never came final, and a commit that came shows in its inventory (then the ingest stands)."""
    try:
        committed = decider.commit(record.id)
    except DeviceUnavailable as lost:
        committed = _settled(decider, record, dataset, lost)
    if not committed:
        raise IngestFailed(
            f"device {decider.name} no longer holds this ingest's partitions (its lease ran "
            "out): nothing was committed"
        )


def _settled(
    decider: DeviceClient, record: IngestRecord, dataset: str, lost: DeviceUnavailable
) -> bool:
    """Whether the decider committed, once it answers again within the silence bound; an
    ``OutcomeUnknown`` if it does not."""
    deadline = time.monotonic() + decider.liveness.silence_s
    while True:
        try:
            decider.abort(record.id)
            return any(s.ingest.id == record.id for s in decider.inventory())
        except DeviceUnavailable:
            if time.monotonic() >= deadline:
                raise OutcomeUnknown(
                    f"ingest of {dataset}: its decider, device {decider.name}, stopped answering "
                    f"while asked to commit ({lost}); whether it committed only it knows. The "
                    "devices settle it by its word once it answers: the dataset will be complete "
                    "or absent, never partial. List it again later."
                ) from None
            time.sleep(decider.liveness.heartbeat_period_s)


def _commit_rest(by_id: dict[str, DeviceClient], involved: list[str], record: IngestRecord) -> None:
    """The other participants. One that does not answer commits on its own when it comes back
    (it asks the decider), so the ingest stands."""
    for device in involved:
        if device == record.decider:
            continue
        with contextlib.suppress(DeviceUnavailable):
            by_id[device].commit(record.id)


def _peek(batches: Iterable[pa.RecordBatch]) -> tuple[pa.RecordBatch | None, Iterator]:
    """The first batch with rows, and every batch (that one included)."""
    rest = iter(batches)
    for batch in rest:
        if batch.num_rows:
            return batch, itertools.chain([batch], rest)
    return None, iter(())


def _send(
    rows: Iterator[pa.RecordBatch],
    opened: Any,
    record: IngestRecord,
    by_id: dict[str, DeviceClient],
    stream: Any,
    progress: bool | None,
    fed: Any = None,
) -> None:
    """Deal the source's rows round-robin to the record's partitions in groups of its
    ``group_rows``: the source's order can be read back (``coordinator/reads/source_order.py``)."""
    schema = opened.reader.schema
    first, partition_count, placement = record.first_partition, record.partitions, record.placement
    group_rows = record.group_rows
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    group = 0
    with Bar("ingest", opened.rows_total, "rows", progress) as bar:
        for batch in rows:
            if not batch.num_rows:
                continue
            pending.append(batch)
            pending_rows += batch.num_rows
            while pending_rows >= group_rows:
                table = pa.Table.from_batches(pending, schema=schema)
                _deliver(
                    table.slice(0, group_rows),
                    first + group % partition_count,
                    placement,
                    by_id,
                    stream,
                    fed,
                )
                rest = table.slice(group_rows)
                pending, pending_rows = rest.to_batches(), rest.num_rows
                group += 1
            bar.advance(batch.num_rows)
        if pending_rows:
            table = pa.Table.from_batches(pending, schema=schema)
            _deliver(table, first + group % partition_count, placement, by_id, stream, fed)


def _deliver(
    rows: pa.Table,
    partition: int,
    placement: dict[str, list[str]],
    by_id: dict[str, DeviceClient],
    stream: Any,
    fed: Any = None,
) -> None:
    """Rows to every replica of their partition (and to the parity being computed)."""
    for device in placement[str(partition)]:
        writer, _ = stream(partition, device, rows)
        for batch in rows.to_batches():
            by_id[device].guard(lambda w=writer, b=batch: w.write_batch(b))
    if fed is not None:
        fed(partition, rows)


def _abort(
    by_id: dict[str, DeviceClient],
    devices: list[str],
    ingest_id: str,
    streams: dict[tuple[int, str], tuple[Any, Any]],
) -> None:
    for writer, _ in streams.values():
        with contextlib.suppress(Exception):  # a broken stream; the abort below cleans up
            writer.close()
    for device in devices:
        # a dead device collects its pending partitions when it starts again
        with contextlib.suppress(QuarryError):
            by_id[device].abort(ingest_id)


def _schema_difference(dataset: str, expected: pa.Schema, got: pa.Schema, source: str) -> str:
    lines = [f"{source} does not match the schema of {dataset}:"]
    expected_fields = {f.name: f for f in expected}
    got_fields = {f.name: f for f in got}
    for missing in expected_fields.keys() - got_fields.keys():
        lines.append(f"  missing column {missing} ({expected_fields[missing].type})")
    for extra in got_fields.keys() - expected_fields.keys():
        lines.append(f"  unexpected column {extra} ({got_fields[extra].type})")
    for both in expected_fields.keys() & got_fields.keys():
        if not expected_fields[both].type.equals(got_fields[both].type):
            lines.append(
                f"  column {both}: {got_fields[both].type}, expected {expected_fields[both].type}"
            )
    if len(lines) == 1:
        lines.append("  same columns in another order")
    lines.append("Convert the file to the dataset's schema, or ingest it as a new dataset.")
    return "\n".join(lines)
