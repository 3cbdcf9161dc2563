"""Feeding the cost model: sample a slice on the host, read calibration and load from devices."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa

from quarry.coordinator.reads.degraded import Rebuilder
from quarry.cost.model import DeviceFigures, SubPlanFigures
from quarry.device.controller import PUSHBACK_NOTICE_SLICES
from quarry.device.units.substrait import read_columns, run_on_host
from quarry.errors import CorruptSlice, DeviceUnavailable
from quarry.plan.prune import slice_may_match
from quarry.protocol.control import CalibrationReport, LoadStatus, PartitionDescription, ZoneMap
from quarry.protocol.stage import Stage
from quarry.store.partition import column_bytes
from quarry.store.zonemap import zone_map_from_json

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry
    from quarry.coordinator.membership.membership import Membership
    from quarry.plan.decompose import Fragment

SAMPLE_REPEAT = 2
# slices sampled at most for the share of rows a filter keeps, while none is kept
KEPT_SLICES_SAMPLED = 4


def _ipc_bytes(batches: list[pa.RecordBatch]) -> int:
    return sum(pa.ipc.get_record_batch_size(b) for b in batches)


def sample_slice(
    cluster: Membership, entry: DatasetEntry, at: tuple[int, int] | None = None
) -> tuple[list[pa.RecordBatch], PartitionDescription]:
    """The slice the host samples a dataset by (the first of its largest partition, or slice
    ``at``: a partition's number and the slice's), as stored, with its partition's
    description; kept per dataset version (``Membership.slices``) for the sub-plans and
    filters of every query over it."""
    if at is None:
        # a lost erasure-coded partition is not sampled: its rows are rebuilt on the host
        largest = max(entry.partitions, key=lambda p: (not p.lost, p.rows))
        at = (largest.partition, 0)
    partition = next(p for p in entry.partitions if p.partition == at[0])
    number = at[1]

    def fetch() -> tuple[list[pa.RecordBatch], PartitionDescription]:
        live = [cluster.devices[d] for d in partition.devices if d not in cluster.down]
        if not live:
            raise DeviceUnavailable(f"no replica of {entry.qualified}'s sampled slice answers")
        for device in live:  # a damaged copy is never sampled: the next replica's is
            try:
                reader = device.scan(
                    entry.domain, entry.name, partition.partition, number, number + 1
                )
                batches = device.guard(lambda reader=reader: [c.data for c in reader])
                return batches, device.describe(entry.domain, entry.name, partition.partition)
            except CorruptSlice as error:
                if device is live[-1] and partition.stripe is not None:  # from its stripe
                    rebuilt = Rebuilder.of(cluster, partition)
                    batches = list(
                        rebuilt.scan(
                            entry.domain, entry.name, partition.partition, number, number + 1
                        )
                    )
                    return batches, device.describe(entry.domain, entry.name, partition.partition)
                if device is live[-1]:
                    raise CorruptSlice(
                        f"no replica of partition {partition.partition} of {entry.qualified} "
                        f"holds a good copy to sample: {error.on(device.name)}"
                    ) from None
        raise AssertionError("unreachable: the last replica returns or raises")

    key = (entry.qualified, entry.version, at)
    return cluster.slices.get(key, fetch)[0]


def described(cluster: Membership, entry: DatasetEntry, partition: int) -> PartitionDescription:
    """A partition's description (its slices' rows and zone maps) from a replica that
    answers with a good copy (a damaged metadata slice is never read: the next replica's is);
    kept per dataset version. ``DeviceUnavailable`` when none does."""

    def fetch() -> PartitionDescription:
        holders = next(p for p in entry.partitions if p.partition == partition).devices
        why = "none answers"
        for name in (d for d in holders if d not in cluster.down):
            try:
                return cluster.devices[name].describe(entry.domain, entry.name, partition)
            except (CorruptSlice, DeviceUnavailable) as error:
                why = str(error)
        raise DeviceUnavailable(
            f"no replica of partition {partition} of {entry.qualified} describes it: {why}"
        )

    return cluster.descriptions.get((entry.qualified, entry.version, partition), fetch)[0]


def sample_subplan(cluster: Membership, fragment: Fragment, entry: DatasetEntry) -> SubPlanFigures:
    """Run the fragment's stages on one real slice on the host, timing them (ActivePy's
    sampling phase, one slice instead of four scaled inputs: a slice is already small)."""
    batches, meta = sample_slice(cluster, entry)
    stored_bytes = max(1, meta.slices[0].bytes_stored)
    first = meta.slices[0]
    needed = read_columns(fragment.stages, fragment.raw_schema)
    read = column_bytes(entry.schema, first.columns, first.bytes_stored, needed)

    def timed(stage: Stage) -> tuple[float, list[pa.RecordBatch]]:
        best, out = float("inf"), []
        for _ in range(SAMPLE_REPEAT):
            started = time.perf_counter()
            out = list(run_on_host(fragment.stages[stage], entry.schema, batches))
            best = min(best, time.perf_counter() - started)
        return best, out

    full_s, full_out = timed(Stage.FULL)
    filter_s, filter_out = timed(Stage.FILTER)
    raw_bytes = _ipc_bytes([b.select(fragment.raw_schema.names) for b in batches])
    return SubPlanFigures(
        full_s_per_byte=full_s / stored_bytes,
        filter_s_per_byte=filter_s / stored_bytes,
        raw_ratio=raw_bytes / stored_bytes,
        filter_ratio=_ipc_bytes(filter_out) / stored_bytes,
        output_ratio=_ipc_bytes(full_out) / stored_bytes,
        read_ratio=read / stored_bytes,
        kept_rows=_kept_rows(cluster, fragment, entry, batches, filter_out, meta),
    )


def value_spans(cluster: Membership, entry: DatasetEntry) -> dict[str, int]:
    """Per integer column, how many values lie between its least and greatest in the whole
    dataset, by every partition's zone maps (kept per dataset version). A key set's share of
    a column is judged against this, not against its build's rows: TPC-DS's sales were sold
    on 1,823 of date_dim's 73,049 dates, and a year's 366 keep a fifth of them, not 0.5%."""

    def spans() -> dict[str, int]:
        low: dict[str, int] = {}
        high: dict[str, int] = {}
        for partition in entry.partitions:
            if partition.lost:
                return {}
            for described_slice in described(cluster, entry, partition.partition).slices:
                for column, zone in described_slice.zone_map.items():
                    if _integer(zone.min) and _integer(zone.max):
                        low[column] = min(low.get(column, zone.min), zone.min)
                        high[column] = max(high.get(column, zone.max), zone.max)
        return {column: high[column] - low[column] + 1 for column in low}

    return cluster.descriptions.get((entry.qualified, entry.version, "spans"), spans)[0]


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kept_rows(
    cluster: Membership,
    fragment: Fragment,
    entry: DatasetEntry,
    sampled: list[pa.RecordBatch],
    kept: list[pa.RecordBatch],
    meta: PartitionDescription,
) -> float:
    """The share of rows the fragment's filter keeps: its share of the slices sampled, of
    those the zone maps say may hold rows it keeps (in any partition), times the share of
    rows in such slices. The first such slice is sampled, and where its rows are none of
    those kept, up to ``KEPT_SLICES_SAMPLED`` spread over the rest. The first slice alone
    said TPC-DS's year 2000 kept 4 dates in 73,049 (it holds the years 1900 to 1948): the
    sales cut by them looked small, and the join keys made the customer profiles wait for
    the sales they should have cut (Q7: 540,000 sales shipped of the 7,400 that match)."""
    first = (meta.summary.partition, 0)
    partitions = [p.partition for p in entry.partitions if not p.lost]
    described_now = {meta.summary.partition: meta}
    # a partition whose devices cannot say now: judged by the sampled one's alone
    with contextlib.suppress(DeviceUnavailable):
        if fragment.predicates:
            described_now = {n: described(cluster, entry, n) for n in partitions}
    rows_of = {
        (partition, n): s.rows
        for partition, description in described_now.items()
        for n, s in enumerate(description.slices)
        if slice_may_match(fragment.predicates, _zone_map(s.zone_map))
    }
    total = max(1, sum(s.rows for d in described_now.values() for s in d.slices))
    if not rows_of:
        return 1 / total  # none anywhere: fewer than one
    matching = sorted(rows_of, key=lambda at: (at != first, at))
    step = max(1, len(matching) // KEPT_SLICES_SAMPLED)
    rows = kept_rows = 0
    for at in matching[::step][:KEPT_SLICES_SAMPLED]:
        if at != first:
            try:
                sampled, _ = sample_slice(cluster, entry, at)
            except (DeviceUnavailable, CorruptSlice):  # judged by the slices sampled so far
                break
            kept = list(run_on_host(fragment.stages[Stage.FILTER], entry.schema, sampled))
        rows += sum(b.num_rows for b in sampled)
        kept_rows += sum(b.num_rows for b in kept)
        if kept_rows:
            break
    share = sum(rows_of.values()) / total
    return min(1.0, max(1, kept_rows) / max(1, rows) * share)  # none kept: fewer than one


def _zone_map(described: Mapping[str, ZoneMap]) -> dict[str, dict[str, Any]]:
    """A slice's zone map as the devices prune by it (values untagged)."""
    return zone_map_from_json({column: asdict(entry) for column, entry in described.items()})


def calibration_of(cluster: Membership, name: str) -> CalibrationReport | None:
    """A device's stored calibration (read once per coordinator), or None."""
    from quarry.coordinator.admin.calibrate import stored as stored_calibration

    if name not in cluster.calibration_cache:
        cluster.calibration_cache[name] = stored_calibration(cluster.devices[name])
    return cluster.calibration_cache[name]


@dataclass(frozen=True)
class Calibrated:
    """A device's figures for the cost model: as ``quarry calibrate`` measured them where it
    stored a report, its profile's otherwise. A link its profile leaves unlimited stays so."""

    compute_factor: float
    internal_bytes_per_s: float | None
    external_bytes_per_s: float | None


def calibrated(cluster: Membership, name: str) -> Calibrated:
    profile = cluster.info[name].profile
    report = calibration_of(cluster, name)
    if report is None:
        return Calibrated(
            profile.compute_factor,
            profile.internal_bytes_per_s or None,
            profile.external_bytes_per_s or None,
        )
    return Calibrated(
        report.compute_factor.measured,
        report.internal_bytes_per_s.measured if profile.internal_bytes_per_s else None,
        report.external_bytes_per_s.measured if profile.external_bytes_per_s else None,
    )


def device_figures(
    cluster: Membership,
    entry: DatasetEntry,
    stored: dict[str, int],
    loads: dict[str, LoadStatus] | None = None,
) -> list[DeviceFigures]:
    """Calibrated figures where a calibration was stored, the profile's otherwise; each
    device's load as ``loads`` says (its pulse before this query), else asked now."""
    figures = []
    partitions: dict[str, int] = {}
    handbacks: dict[str, int] = {}  # one fetch per notice a device sends of what it hands back
    for p in entry.partitions:
        partitions[p.devices[0]] = partitions.get(p.devices[0], 0) + 1
        ranges = max(1, math.ceil(p.slices / PUSHBACK_NOTICE_SLICES))
        handbacks[p.devices[0]] = handbacks.get(p.devices[0], 0) + ranges
    for name, stored_bytes in sorted(stored.items()):
        client = cluster.devices[name]
        profile = cluster.info[name].profile
        figures_of = calibrated(cluster, name)
        load = (loads or {}).get(name) or client.load_status()
        figures.append(
            DeviceFigures(
                name=name,
                stored_bytes=stored_bytes,
                partitions=partitions.get(name, 1),
                compute_factor=figures_of.compute_factor,
                cores=profile.cores,
                internal_bytes_per_s=figures_of.internal_bytes_per_s,
                external_bytes_per_s=figures_of.external_bytes_per_s,
                cpu_busy=load.cpu_busy,
                handbacks=handbacks.get(name, partitions.get(name, 1)),
                shares_host=shares_host(client.address, profile),
            )
        )
    return figures


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def shares_host(address: str, profile: Any) -> bool:
    """An unemulated device on this machine computes on the host's own cores (the embedded
    default): its work and the host's add up there, they do not overlap."""
    host = urlsplit(address).hostname or ""
    unemulated = (
        profile.cores is None
        and profile.compute_factor == 1.0
        and profile.internal_bytes_per_s is None
        and profile.external_bytes_per_s is None
    )
    return unemulated and host in LOOPBACK_HOSTS
