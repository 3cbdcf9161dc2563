"""The host half of differential expression on a cluster: ask devices, complete, Combine.

`side_statistics` returns, per gene, the (n, mean, m2) of the one or two cell sets a comparison
needs (group 0: the group, group 1: the reference). How it gets them is the pushdown:

- `always`: every device runs `genes.accumulate` over its partitions (from its cache where it
  can) and ships side statistics; slices it pushes back (forced by `push_back`) the host fetches
  raw and accumulates itself.
- `auto`: the same, but each device decides per slice, at run time, whether running Accumulate
  pays off against shipping the slice (ActivePy Eq. 1 with the host's measured Accumulate cost;
  `quarry.device.controller.Adaptive`).
- `never`: the host-only baseline: the host scans every slice raw and accumulates locally.

The answer is the same bits whatever was decided: each slice is accumulated by the same code
wherever it runs, and Combine is canonical (sorted) and passes single partials through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.coordinator.client import DeviceClient
from quarry.cost.model import host_share, link_bytes_per_s
from quarry.device.controller import HostCost
from quarry.errors import DeviceUnavailable
from quarry.genes.datasets import StoredMatrix
from quarry.genes.device import PROGRAM
from quarry.genes.errors import GenesInputError
from quarry.genes.groups import Grouping
from quarry.genes.layout import ROW_ID_COLUMN, rows_batch, stored_schema
from quarry.genes.stats import PARTIAL_SCHEMA, accumulate, combine, select_groups

Pushdown = Literal["always", "never", "auto"]
PUSHDOWNS = ("always", "never", "auto")
PushBack = Mapping[int, Sequence[tuple[int, int]]]

# Slices of the host's own Accumulate calibration (auto): a 10%-dense slice of about 1 MB.
CALIBRATION_GENES = 256
CALIBRATION_CELLS = 4096
CALIBRATION_DENSITY = 0.1
CALIBRATION_REPEATS = 3


# the additive fields of a Report: summed across requests, devices and datasets
REPORT_COUNTERS = (
    "bytes_shipped",
    "bytes_shipped_raw",
    "bytes_read",
    "bytes_sent",
    "slices_executed",
    "slices_pushed_back",
    "slices_cached",
    "slices_raw",
    "requests",
    "host_accumulate_s",
)


@dataclass
class Report:
    """Where the work ran and what moved; `rank_genes` puts it in `attrs["quarry"]`."""

    dataset: str
    pushdown: str
    bytes_shipped: int = 0  # device -> host: side statistics plus raw slices
    bytes_shipped_raw: int = 0  # of which raw slices (pushed back, or pushdown never)
    bytes_read: int = 0  # read off the devices' stores (raw scans: the slices' bytes)
    bytes_sent: int = 0  # host -> devices: groupings
    slices_executed: int = 0
    slices_pushed_back: int = 0
    slices_cached: int = 0
    slices_raw: int = 0  # slices the host accumulated (pushed back, or pushdown never)
    requests: int = 0
    host_accumulate_s: float = 0.0
    wall_s: float = 0.0
    devices: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: Report) -> None:
        for name in REPORT_COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.devices.extend(other.devices)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def side_statistics(
    matrix: StoredMatrix,
    grouping: Grouping,
    sides: Sequence[Sequence[int]],
    pushdown: Pushdown = "auto",
    *,
    push_back: PushBack | None = None,
    policy: Mapping[str, Any] | None = None,
) -> tuple[pa.RecordBatch, Report]:
    """Per gene and side i, the statistics of the union of groups `sides[i]` (group = i)."""
    if pushdown not in PUSHDOWNS:
        raise GenesInputError(f"pushdown must be one of {PUSHDOWNS}, not {pushdown!r}")
    assert 1 <= len(sides) <= 2, sides
    assert len(grouping.group_of_cell) == matrix.cell_count, "grouping of another dataset"
    started = time.perf_counter()
    report = Report(matrix.dataset, pushdown)
    assignments = _assign(matrix)
    sides_list = [list(map(int, side)) for side in sides]
    push_back = dict(push_back or {})
    unknown = sorted(set(push_back) - {p.partition for p in matrix.entry.partitions})
    if unknown:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: push_back names partitions {unknown} it does not have"
        )

    def run(device: str) -> tuple[list[pa.RecordBatch], Report]:
        client = matrix.cluster.devices[device]
        partitions = assignments[device]
        if pushdown == "never":
            return _host_only(matrix, client, partitions, grouping, sides_list)
        return _on_device(
            matrix,
            client,
            partitions,
            grouping,
            sides_list,
            pushdown,
            {p: push_back[p] for p in partitions if p in push_back},
            policy,
        )

    results: list[pa.RecordBatch] = []
    with ThreadPoolExecutor(max_workers=max(1, len(assignments))) as pool:
        for batches, device_report in pool.map(run, sorted(assignments)):
            results.extend(batches)
            report.add(device_report)
    statistics = (
        combine(results) if results else pa.RecordBatch.from_pylist([], schema=PARTIAL_SCHEMA)
    )
    report.wall_s = time.perf_counter() - started
    return statistics, report


def _assign(matrix: StoredMatrix) -> dict[str, list[int]]:
    """One replica per partition: the first that answers (placement order, so caches warm)."""
    cluster = matrix.cluster
    assignments: dict[str, list[int]] = {}
    if matrix.entry.unavailable:
        raise DeviceUnavailable(
            f"dataset {matrix.dataset}: partitions {sorted(matrix.entry.unavailable)} are on "
            "devices that do not answer; start them (quarry status) and try again"
        )
    for entry in matrix.entry.partitions:
        live = [d for d in entry.devices if d not in cluster.down]
        if not live:
            raise DeviceUnavailable(
                f"dataset {matrix.dataset}: no replica of partition {entry.partition} answers "
                f"(devices {entry.devices}); start them and try again"
            )
        assignments.setdefault(live[0], []).append(entry.partition)
    return assignments


def _on_device(
    matrix: StoredMatrix,
    client: DeviceClient,
    partitions: list[int],
    grouping: Grouping,
    sides: list[list[int]],
    pushdown: str,
    push_back: dict[int, Sequence[tuple[int, int]]],
    policy: Mapping[str, Any] | None,
) -> tuple[list[pa.RecordBatch], Report]:
    report = Report(matrix.dataset, pushdown)
    header: dict[str, Any] = {
        "domain": matrix.domain,
        "dataset": matrix.name,
        "version": matrix.version,
        "ingest_ids": sorted(i["id"] for i in matrix.entry.ingests),
        "partitions": partitions,
        "grouping": grouping.digest(),
        "group_count": grouping.group_count,
        "cell_count": matrix.cell_count,
        "sides": sides,
        "mode": "auto" if pushdown == "auto" else "always",
        "push_back": {str(p): [list(r) for r in ranges] for p, ranges in push_back.items()},
        "policy": dict(policy or {}),
    }
    if pushdown == "auto":
        header["host"] = asdict(_host_cost(matrix, client.name, len(matrix.cluster.devices)))
    # Ask without the grouping first: a device with every partition cached needs only the
    # digest, so a repeated request moves almost nothing. A miss costs one more round trip.
    report.requests += 1
    table, summary = client.program(PROGRAM, header, b"")
    if summary.get("grouping_needed"):
        payload = np.ascontiguousarray(grouping.group_of_cell, dtype="<i4").tobytes()
        report.requests += 1
        report.bytes_sent += len(payload)
        report.bytes_shipped += int(summary.get("bytes_shipped", 0))
        table, summary = client.program(PROGRAM, header, payload)
        assert not summary.get("grouping_needed"), "the device was sent the grouping"
    _check_output(table, client.name)
    report.bytes_shipped += int(summary["bytes_shipped"])
    report.bytes_read += int(summary["bytes_read"])
    report.slices_executed += int(summary["slices_executed"])
    report.slices_pushed_back += int(summary["slices_pushed_back"])
    report.slices_cached += int(summary["slices_cached"])
    report.devices.append(summary)
    outputs = [batch for batch in table.to_batches() if batch.num_rows]

    partials: list[pa.RecordBatch] = []
    for partition, detail in sorted(summary["partitions"].items(), key=lambda i: int(i[0])):
        for first, end in detail["pushed_back"]:
            partials.extend(
                _accumulate_raw(matrix, client, int(partition), grouping, report, first, end)
            )
    if partials:
        outputs.extend(_sides(partials, sides, report))
    return outputs, report


def _host_only(
    matrix: StoredMatrix,
    client: DeviceClient,
    partitions: list[int],
    grouping: Grouping,
    sides: list[list[int]],
) -> tuple[list[pa.RecordBatch], Report]:
    report = Report(matrix.dataset, "never")
    partials: list[pa.RecordBatch] = []
    for partition in partitions:
        partials.extend(_accumulate_raw(matrix, client, partition, grouping, report, 0, None))
    report.devices.append({"device": client.name, "partitions": partitions})
    return (_sides(partials, sides, report) if partials else []), report


def _accumulate_raw(
    matrix: StoredMatrix,
    client: DeviceClient,
    partition: int,
    grouping: Grouping,
    report: Report,
    first: int,
    end: int | None,
) -> list[pa.RecordBatch]:
    """Fetch slices [first, end) of a partition as stored and accumulate them on the host."""
    reader = client.scan(matrix.domain, matrix.name, partition, first, end)
    partials = []
    while True:
        try:
            chunk = client.guard(reader.read_chunk)
        except StopIteration:
            break
        batch = chunk.data
        if batch is None or batch.num_rows == 0:
            continue
        size = pa.ipc.get_record_batch_size(batch)
        report.bytes_shipped += size
        report.bytes_shipped_raw += size
        report.bytes_read += size  # a raw slice is read whole, as stored (uncompressed here)
        report.slices_raw += 1
        started = time.perf_counter()
        partials.append(accumulate(batch, grouping.group_of_cell, grouping.group_count))
        report.host_accumulate_s += time.perf_counter() - started
    return partials


def _sides(
    partials: list[pa.RecordBatch], sides: list[list[int]], report: Report
) -> list[pa.RecordBatch]:
    started = time.perf_counter()
    statistics = combine(partials)
    result = [select_groups(statistics, ids, as_group=i) for i, ids in enumerate(sides)]
    report.host_accumulate_s += time.perf_counter() - started
    return result


def _check_output(table: pa.Table, device: str) -> None:
    names, types = table.schema.names, table.schema.types
    if names != PARTIAL_SCHEMA.names or types != PARTIAL_SCHEMA.types:
        raise GenesInputError(f"device {device} answered {PROGRAM} with columns {names}")


def _host_cost(matrix: StoredMatrix, device: str, device_count: int) -> HostCost:
    """What the host would pay to accumulate a slice itself, for the device's decision."""
    profile = matrix.cluster.info.get(device, {}).get("profile", {})
    host_cores = os.cpu_count() or 1
    return HostCost(
        full_s_per_byte=host_accumulate_s_per_byte(),
        raw_ratio=1.0,  # a pushed-back slice ships whole
        filter_ratio=1.0,  # Accumulate has no filter stage: "filter" is never cheaper than raw
        link_bytes_per_s=float(link_bytes_per_s(profile.get("external_bytes_per_s"))),
        host_share=host_share(host_cores, device_count),
        start="full",
    )


@cache
def host_accumulate_s_per_byte() -> float:
    """The host's Accumulate cost per stored byte, measured once per process on a synthetic
    slice (10% dense, 4,096 cells, 10 groups)."""
    rng = np.random.default_rng(0)
    values = sparse.random(
        CALIBRATION_GENES,
        CALIBRATION_CELLS,
        density=CALIBRATION_DENSITY,
        format="csr",
        dtype=np.float32,
        random_state=rng,
    )
    schema = stored_schema("genes", pa.float32(), CALIBRATION_CELLS)
    batch = rows_batch(values, schema, 0, CALIBRATION_GENES)
    assert batch.schema.names[0] == ROW_ID_COLUMN["genes"]
    groups = rng.integers(0, 10, CALIBRATION_CELLS).astype(np.int32)
    best = float("inf")
    for _ in range(CALIBRATION_REPEATS):
        started = time.perf_counter()
        accumulate(batch, groups, 10)
        best = min(best, time.perf_counter() - started)
    return best / pa.ipc.get_record_batch_size(batch)
