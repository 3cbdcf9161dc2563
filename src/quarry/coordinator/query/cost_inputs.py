"""Feeding the cost model: sample a slice on the host, read calibration and load from devices."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa

from quarry.cost.model import DeviceFigures, SubPlanFigures
from quarry.device.controller import PUSHBACK_NOTICE_SLICES
from quarry.device.units.substrait import read_columns, run_on_host
from quarry.errors import CorruptSlice, DeviceUnavailable
from quarry.protocol.control import CalibrationReport, LoadStatus, PartitionDescription
from quarry.protocol.stage import Stage
from quarry.store.partition import column_bytes

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry
    from quarry.coordinator.membership.membership import Membership
    from quarry.plan.decompose import Fragment

SAMPLE_REPEAT = 2


def _ipc_bytes(batches: list[pa.RecordBatch]) -> int:
    return sum(pa.ipc.get_record_batch_size(b) for b in batches)


def sample_slice(
    cluster: Membership, entry: DatasetEntry
) -> tuple[list[pa.RecordBatch], PartitionDescription]:
    """The slice the host samples a dataset by (the first of its largest partition), as stored,
    with its partition's description; kept per dataset version (``Membership.slices``) for the
    sub-plans and filters of every query over it."""

    def fetch() -> tuple[list[pa.RecordBatch], PartitionDescription]:
        partition = max(entry.partitions, key=lambda p: p.rows)
        live = [cluster.devices[d] for d in partition.devices if d not in cluster.down]
        if not live:
            raise DeviceUnavailable(f"no replica of {entry.qualified}'s sampled slice answers")
        for device in live:  # a damaged copy is never sampled: the next replica's is
            try:
                reader = device.scan(entry.domain, entry.name, partition.partition, 0, 1)
                batches = device.guard(lambda reader=reader: [c.data for c in reader])
                return batches, device.describe(entry.domain, entry.name, partition.partition)
            except CorruptSlice as error:
                if device is live[-1]:
                    raise CorruptSlice(
                        f"no replica of partition {partition.partition} of {entry.qualified} "
                        f"holds a good copy to sample: {error.on(device.name)}"
                    ) from None
        raise AssertionError("unreachable: the last replica returns or raises")

    return cluster.slices.get((entry.qualified, entry.version), fetch)[0]


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
    rows = max(1, sum(b.num_rows for b in batches))
    kept = max(1, sum(b.num_rows for b in filter_out)) / rows  # none kept: fewer than one
    return SubPlanFigures(
        full_s_per_byte=full_s / stored_bytes,
        filter_s_per_byte=filter_s / stored_bytes,
        raw_ratio=raw_bytes / stored_bytes,
        filter_ratio=_ipc_bytes(filter_out) / stored_bytes,
        output_ratio=_ipc_bytes(full_out) / stored_bytes,
        read_ratio=read / stored_bytes,
        kept_rows=min(1.0, kept),
    )


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
