"""The host half of differential expression on a cluster: ask devices, complete, Combine.

`side_statistics` returns, per gene, the (n, mean, m2) of the one or two cell sets a comparison
needs (group 0: the group, group 1: the reference). How it gets them is the pushdown:

- `always`: every device runs the unit of work `genes.accumulate` over its partitions (from its
  cache where it can) and ships side statistics; slices it pushes back (forced by `push_back`)
  the host fetches raw and completes with the same unit (the one host dispatch,
  `quarry.coordinator.dispatch.dispatch`).
- `auto`: the same, but each device decides per slice, at run time, whether running Accumulate
  pays off against shipping the slice (ActivePy Eq. 1 with the host's measured Accumulate cost;
  `quarry.device.controller.Adaptive`).
- `never`: the host-only baseline: the host scans every slice raw and accumulates locally.

The answer is the same bits whatever was decided: each slice is accumulated by the same code
wherever it runs, and Combine is canonical (sorted) and passes single partials through.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.coordinator.dispatch.dispatch import Dispatch, Task
from quarry.coordinator.query.planning import replicas_of
from quarry.cost.model import host_share, link_bytes_per_s
from quarry.device.unit import Unit, host_context, host_cores
from quarry.errors import DeviceUnavailable
from quarry.genes.datasets import StoredMatrix
from quarry.genes.device import SIDES_MAX, Accumulate, AccumulateArgs
from quarry.genes.errors import GenesInputError
from quarry.genes.groups import Grouping
from quarry.genes.layout import ROW_ID_COLUMN, rows_batch, stored_schema
from quarry.protocol.counters import WorkCounters
from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import ForcedDecision, HostCost, Policy, WorkRequest
from quarry.pushdown import Pushdown

PushBack = Mapping[int, Sequence[tuple[int, int]]]

# Slices of the host's own Accumulate calibration (auto): a 10%-dense slice of about 1 MB.
CALIBRATION_GENES = 256
CALIBRATION_CELLS = 4096
CALIBRATION_DENSITY = 0.1
CALIBRATION_REPEATS = 3
RESULT_BATCHES_MAX = 64  # side statistics waiting for the host's Combine


def _summed(default: float = 0) -> Any:
    """An additive field of a Report: summed across requests, devices and datasets."""
    return field(default=default, metadata={"summed": True})


@dataclass
class Report:
    """Where the work ran and what moved; `rank_genes` puts it in `attrs["quarry"]`."""

    dataset: str
    pushdown: Pushdown
    bytes_shipped: int = _summed()  # device -> host: side statistics plus raw slices
    bytes_shipped_raw: int = _summed()  # of which raw slices (pushed back, or pushdown never)
    bytes_read: int = _summed()  # read off the devices' stores (raw scans: the slices' bytes)
    bytes_sent: int = _summed()  # host -> devices: groupings
    slices_executed: int = _summed()
    slices_pushed_back: int = _summed()
    slices_cached: int = _summed()
    slices_pruned: int = _summed()  # slices whose zone maps hold nothing asked for: not read
    slices_raw: int = _summed()  # slices the host accumulated (pushed back, or pushdown never)
    requests: int = _summed()
    host_accumulate_s: float = _summed(0.0)
    wall_s: float = 0.0
    devices: list[dict[str, Any]] = field(default_factory=list)
    # devices that stopped answering, and the replicas that finished their partitions
    failovers: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: Report) -> None:
        for name in REPORT_COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.devices.extend(other.devices)
        self.failovers.extend(other.failovers)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


REPORT_COUNTERS = tuple(f.name for f in fields(Report) if f.metadata.get("summed"))


# the devices accumulate (always), decide per slice (auto), or the host does it all (never); a
# storage server has no genes unit of its own to complete with (no server)
GENES_MODES = frozenset({Pushdown.NEVER, Pushdown.ALWAYS, Pushdown.AUTO})


def side_statistics(
    matrix: StoredMatrix,
    grouping: Grouping,
    sides: Sequence[Sequence[int]],
    pushdown: Pushdown | str = Pushdown.AUTO,
    *,
    push_back: PushBack | None = None,
    policy: Mapping[str, Any] | None = None,
    unit: type[Accumulate] = Accumulate,
    version_suffix: str = "",
) -> tuple[pa.RecordBatch, Report]:
    """Per gene and side i, the statistics of the union of groups `sides[i]` (group = i): the
    moments (``Accumulate``) or the rank sums (``RankSums``). ``version_suffix`` names a
    transform of the values the unit applies (its statistics are cached apart)."""
    pushdown = Pushdown.parse(pushdown, GENES_MODES)
    assert 1 <= len(sides) <= SIDES_MAX, len(sides)
    assert len(grouping.group_of_cell) == matrix.cell_count, "grouping of another dataset"
    started = time.perf_counter()
    push_back = dict(push_back or {})
    unknown = sorted(set(push_back) - {p.partition for p in matrix.entry.partitions})
    if unknown:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: push_back names partitions {unknown} it does not have"
        )
    dispatch = Dispatch()
    tasks = _tasks(matrix, grouping, sides, pushdown, push_back, policy, unit, version_suffix)
    results = list(dispatch.run(tasks, len(tasks), RESULT_BATCHES_MAX, "quarry-genes"))
    if results:
        statistics = tasks[0].host.merge(results)
    else:
        statistics = pa.RecordBatch.from_pylist([], schema=unit.SCHEMA)
    report = report_of(matrix.dataset, pushdown, dispatch)
    report.wall_s = time.perf_counter() - started
    return statistics, report


def _tasks(
    matrix: StoredMatrix,
    grouping: Grouping,
    sides: Sequence[Sequence[int]],
    pushdown: Pushdown,
    push_back: PushBack,
    policy: Mapping[str, Any] | None,
    unit: type[Accumulate],
    version_suffix: str = "",
) -> list[Task]:
    """One task per device: every partition it serves, in one request (its cache is per
    partition, its output one Combine over them)."""
    args = AccumulateArgs(
        version=matrix.version + version_suffix,
        ingest_ids=tuple(sorted(i.id for i in matrix.entry.ingests)),
        grouping=grouping.digest(),
        group_count=grouping.group_count,
        cell_count=matrix.cell_count,
        sides=tuple(tuple(int(g) for g in side) for side in sides),
    )
    payload = np.ascontiguousarray(grouping.group_of_cell, dtype="<i4").tobytes()
    # Ask without the grouping first: a device with every partition cached needs only the
    # digest, so a repeated request moves almost nothing. A miss costs one more round trip.
    return matrix_tasks(
        matrix, unit, args.to_json(), payload, pushdown, push_back, policy, deferred=True
    )


def matrix_tasks(
    matrix: StoredMatrix,
    unit: type[Unit],
    args: dict[str, Any],
    payload: bytes,
    pushdown: Pushdown,
    push_back: PushBack,
    policy: Mapping[str, Any] | None,
    *,
    deferred: bool = False,
) -> list[Task]:
    """One task per device running ``unit`` over every partition of the matrix it serves (the
    first replica that answers, so caches warm); ``deferred``: the payload is sent only if the
    device says it needs it."""
    assignments = _assign(matrix)
    entries = {p.partition: p for p in matrix.entry.partitions}
    tasks = []
    for device, partitions in sorted(assignments.items()):
        forced = tuple(
            ForcedDecision(p, int(first), int(end), Stage.RAW)
            for p in partitions
            for first, end in push_back.get(p, ())
        )
        request = WorkRequest(
            unit=unit.NAME,
            domain=matrix.domain,
            dataset=matrix.name,
            partitions=tuple(partitions),
            forced=forced,
            host=_host_cost(matrix, device, len(matrix.cluster.devices), unit)
            if pushdown is Pushdown.AUTO
            else None,
            policy=Policy.from_json(dict(policy or {})),
            args=args,
        )
        tasks.append(
            Task(
                client=matrix.cluster.devices[device],
                request=request,
                host=unit(request, payload, host_context()),
                payload=b"" if deferred else payload,
                deferred_payload=payload if deferred else None,
                label=matrix.dataset,
                host_only=pushdown is Pushdown.NEVER,
                replicas={p: replicas_of(matrix.cluster, entries[p], device) for p in partitions},
            )
        )
    return tasks


def report_of(dataset: str, pushdown: Pushdown, dispatch: Dispatch) -> Report:
    reports = dispatch.sorted_reports()
    counted = WorkCounters.sum(r.counters for r in reports)
    report = Report(
        dataset,
        pushdown,
        bytes_shipped=counted.bytes_shipped,
        bytes_shipped_raw=sum(r.bytes_shipped_raw for r in reports),
        bytes_read=counted.bytes_read,
        bytes_sent=dispatch.bytes_sent,
        slices_executed=counted.slices_executed,
        slices_pushed_back=counted.slices_pushed_back,
        slices_cached=counted.slices_cached,
        slices_pruned=counted.slices_pruned,
        slices_raw=sum(r.slices_raw for r in reports),
        requests=dispatch.requests,
        host_accumulate_s=dispatch.host_complete_s,
    )
    by_device: dict[str, dict[str, Any]] = {}
    for r in reports:
        device = by_device.setdefault(r.device, {"device": r.device, "partitions": {}})
        device["partitions"][str(r.partition)] = {
            "slices": r.counters.slices_total,
            "executed": r.ranges(Stage.FULL),
            "pushed_back": r.ranges(Stage.RAW),
            "cached": r.ranges(Skip.CACHED),
            "pruned": r.ranges(Skip.PRUNED),
            "decisions": [d.to_json() for d in r.decisions],
        }
    report.devices = [by_device[name] for name in sorted(by_device)]
    report.failovers = [
        {"device": r.device, "partition": r.partition, **f} for r in reports for f in r.failovers
    ]
    return report


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


def _host_cost(matrix: StoredMatrix, device: str, device_count: int, unit: type[Unit]) -> HostCost:
    """What the host would pay to accumulate a slice itself, for the device's decision."""
    profile = matrix.cluster.info[device].profile
    return HostCost(
        full_s_per_byte=host_accumulate_s_per_byte(unit),
        raw_ratio=1.0,  # a pushed-back slice ships whole
        filter_ratio=1.0,  # Accumulate has no filter stage: "filter" is never cheaper than raw
        link_bytes_per_s=float(link_bytes_per_s(profile.external_bytes_per_s)),
        host_share=host_share(host_cores(), device_count),
        start=Stage.FULL,
    )


@cache
def host_accumulate_s_per_byte(unit: type[Unit] = Accumulate) -> float:
    """The host's cost per stored byte of a unit's work (moments, rank sums, a selection),
    measured once per process on a synthetic slice (10% dense, 4,096 cells)."""
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
    work = unit.calibration_work(batch, rng)  # type: ignore[attr-defined]
    best = float("inf")
    for _ in range(CALIBRATION_REPEATS):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best / pa.ipc.get_record_batch_size(batch)
