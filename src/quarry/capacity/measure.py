"""Measuring CSDPLAN's inputs on a live quarry cluster (the paper's Step 1, §3.2 and §4.2).

Two systems run the same kernel over the same stored dataset:

- the **SSD system** (host-only path): the host reads the dataset raw off the devices, one reader
  per device in parallel, as a host reads an array of block SSDs (``run_host``); then it computes
  on the host's CPU with ``threads`` threads. Its transfer passes each drive's internal and
  external links (and, if given, an emulated host bus, see ``HostBus``);
- the **CSD system**: each device runs the kernel as its built-in program ``capacity.<kernel>``
  on the partitions it holds (``run_devices``, ``quarry.capacity.device``), all devices at once.

``measure_kernel`` does this on one device, repeated, and turns the medians into the four times of
``CapacityInputs`` (T_SSD-tx, T_SSD-comp with one host core, T_CSD-tx, T_CSD-comp).
``calibration_inputs`` builds the same inputs from a ``quarry calibrate`` report instead, with
only the host's computation time measured (on generated data, no cluster needed).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from quarry.capacity.device import output_schema, program_name
from quarry.capacity.kernel_data import Gatherer, as_table, make_inputs
from quarry.capacity.kernels import KERNELS, check_kernel, check_preconditions, run_kernel
from quarry.capacity.model import CapacityInputError, CapacityInputs
from quarry.device.unit import host_emulator
from quarry.errors import DatasetNotFound, DeviceUnavailable
from quarry.protocol.control import CalibrationReport, Measured

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.coordinator.membership.catalog import DatasetEntry

DOMAIN = "capacity"
REPEAT_MAX = 100
SYSTEMS = ("ssd", "csd")
# What a KernelRun keeps of each device program's summary.
SUMMARY_KEYS = (
    "profile",
    "threads",
    "cores",
    "compute_factor",
    "partitions",
    "rows",
    "bytes",
    "transfer_s",
    "compute_s",
    "program_s",
    "wall_s",
    "bytes_read",
    "bytes_shipped",
)


# ---- data ------------------------------------------------------------------------------------


def dataset_name(kernel: str, data_bytes: int, suffix: str = "") -> str:
    """``capacity/<kernel>_<bytes>[_<suffix>]``: one name per working set, so runs can reuse it."""
    return f"{DOMAIN}/{kernel}_{data_bytes}" + (f"_{suffix}" if suffix else "")


def ingest_kernel_inputs(
    cluster: Cluster,
    kernel: str,
    data_bytes: int,
    dataset: str | None = None,
    *,
    seed: int = 0,
    reuse: bool = True,
    progress: bool | None = False,
    pagerank_blocks: bool = False,
) -> DatasetEntry:
    """Generate ``kernel``'s working set of about ``data_bytes`` and store it on every live device.

    Each live device gets one partition, so the working set is spread evenly as CSDPLAN assumes
    (§3.2.1). Page Rank needs its whole matrix in one partition, so it gets one partition in all;
    with ``pagerank_blocks`` it is instead one independent graph per device of about
    ``data_bytes`` / devices (``pagerank_blocks_table``), which m drives share as Eq. 7 assumes.
    An existing dataset with the expected rows is reused when ``reuse``; otherwise it is replaced.
    """
    check_kernel(kernel, 1)
    dataset = dataset or dataset_name(kernel, data_bytes)
    devices = len(cluster.live_devices())
    if kernel == "pagerank" and pagerank_blocks and devices > 1:
        table, partitions = pagerank_blocks_table(data_bytes, devices, seed=seed), devices
    else:
        table = as_table(make_inputs(kernel, data_bytes, seed=seed))
        partitions = 1 if kernel == "pagerank" else devices
    cluster.refresh()
    qualified = dataset if "/" in dataset else f"{DOMAIN}/{dataset}"
    existing = cluster.catalog.get(qualified)
    if existing is not None:
        placed_well = (
            len(existing.partitions) == partitions
            and len({p.devices[0] for p in existing.partitions}) == partitions
        )
        if (
            reuse
            and existing.rows == table.num_rows
            and existing.schema.equals(table.schema)
            and placed_well
        ):
            return existing
        cluster.drop(qualified)
    return cluster.ingest(table, qualified, partitions=partitions, progress=progress)


def _pagerank_block_pages(pages: int, row_bytes: Callable[[int], float]) -> tuple[int, int]:
    """The block width nearest ``pages`` that ingest's row groups divide, and the group.

    Ingest deals rows to partitions round-robin in groups of about ROW_GROUP_BYTES; a block that
    is a whole number of groups can be ordered so that each partition receives one whole block.
    """
    from quarry.coordinator.ingest.layout import ROW_GROUP_BYTES

    for width in sorted(range(max(2, pages // 2), 2 * pages + 1), key=lambda w: abs(w - pages)):
        group = max(1, int(ROW_GROUP_BYTES / row_bytes(width)))
        if group >= width or width % group == 0:
            return width, min(group, width)
    raise CapacityInputError("data_bytes", f"no block width near {pages} pages", "give more bytes")


def pagerank_blocks_table(data_bytes: int, blocks: int, *, seed: int = 0) -> pa.Table:
    """Page Rank over ``blocks`` drives: ``blocks`` independent graphs (a block-diagonal matrix),
    each a square matrix of about ``data_bytes`` / ``blocks``, in the row order that makes
    ingest's round-robin deal give partition p exactly block p.

    Each iteration of Page Rank needs the whole matrix, so a graph split by rows would need the
    rank vector exchanged between drives every iteration, which Eq. 7 does not model. Independent
    graphs are what Eq. 7 assumes: each drive's share is a smaller whole problem. The pages of
    block p are ranked as a graph of their own; the ranks of the union are those divided by
    ``blocks``.
    """
    assert blocks >= 2, blocks
    target = max(2, int((data_bytes // blocks // 4) ** 0.5))  # make_inputs' pages

    def row_bytes(width: int) -> float:
        two_rows = {"matrix": np.zeros((2, width), np.float32), "rank": np.zeros(2, np.float32)}
        sample = as_table(two_rows)
        return sample.nbytes / sample.num_rows

    width, group = _pagerank_block_pages(target, row_bytes)
    block_tables = [
        as_table(make_inputs("pagerank", 4 * width * width, seed=seed + 1 + b))
        for b in range(blocks)
    ]
    assert all(t.num_rows == width for t in block_tables), (width, block_tables[0].num_rows)
    order = [t.slice(start, group) for start in range(0, width, group) for t in block_tables]
    return pa.concat_tables(order).combine_chunks()


# ---- the two systems -------------------------------------------------------------------------


class HostBus:
    """An emulated host bus (CSDPLAN's k_limit, Eq. 6): the host's raw reads pass it in turn.

    A real host saturates its PCIe root complex at k_limit SSDs. This machine's loopback has no
    crisp limit (its ceiling is CPU, shared with whatever else runs), so a measurement that wants
    the bus inside its range of drive counts emulates one: a first-in first-out link of
    ``bytes_per_s`` that every byte read joins when it arrives (``carry``); the transfer is over
    when the last byte is through (``drain``). The readers themselves do not wait: a reader that
    slept in the bus would stall its drive's stream behind it (its flow-control window is small),
    and the drives would then deliver less than the bus can carry.

    A host profile (``quarry.local(host_profile=...)``) is the other way: its ingress link is a
    bucket every device stream into the host passes, with real back-pressure on the drives.
    ``bench/capacity_validation.py`` uses that, which also slows the streams themselves.
    """

    def __init__(self, bytes_per_s: float):
        if (
            isinstance(bytes_per_s, bool)
            or not isinstance(bytes_per_s, (int, float))
            or not math.isfinite(bytes_per_s)
            or not bytes_per_s > 0
        ):
            raise CapacityInputError(
                "host_bus_bytes_per_s",
                f"got {bytes_per_s!r}",
                "give a positive bandwidth in bytes per second",
            )
        self.bytes_per_s = float(bytes_per_s)
        self._lock = threading.Lock()
        self._free_at = 0.0  # time.monotonic() when the bus has carried everything so far

    def carry(self, size_bytes: int) -> None:
        """``size_bytes`` arrived now: they pass the bus after everything before them."""
        assert size_bytes >= 0, size_bytes
        with self._lock:
            self._free_at = max(time.monotonic(), self._free_at) + size_bytes / self.bytes_per_s

    def drain(self) -> float:
        """Wait until every byte carried so far is through; returns the seconds waited."""
        with self._lock:
            wait_s = self._free_at - time.monotonic()
        if wait_s > 0:
            time.sleep(wait_s)
        return max(wait_s, 0.0)


@dataclass
class KernelRun:
    """One run of one system: the paper's two times, and what the coordinator saw."""

    system: str  # "ssd" (host-only path) or "csd" (device programs)
    kernel: str
    dataset: str
    devices: int
    threads: int
    rows: int
    bytes: int  # the kernel's input bytes in memory (the working set)
    transfer_s: float  # SSD: all devices' reads; CSD: the slowest device's
    compute_s: float
    total_s: float  # wall clock as the coordinator saw it
    bytes_to_host: int  # raw data (SSD) or results (CSD) that crossed the external links
    result: Any
    per_device: list[dict[str, Any]] = field(default_factory=list)

    @property
    def throughput_bytes_per_s(self) -> float:
        assert self.total_s > 0, self
        return self.bytes / self.total_s

    def report(self) -> dict[str, Any]:
        """The ``run_kernel`` report form that ``CapacityInputs.from_kernel_runs`` reads."""
        return {
            "kernel": self.kernel,
            "threads": self.threads,
            "bytes": self.bytes,
            "transfer_s": self.transfer_s,
            "compute_s": self.compute_s,
        }

    def to_dict(self) -> dict[str, Any]:
        result = self.result
        if isinstance(result, np.ndarray):
            result = {"length": int(len(result)), "sum": float(result.sum())}
        return {
            "system": self.system,
            "kernel": self.kernel,
            "dataset": self.dataset,
            "devices": self.devices,
            "threads": self.threads,
            "rows": self.rows,
            "bytes": self.bytes,
            "transfer_s": self.transfer_s,
            "compute_s": self.compute_s,
            "total_s": self.total_s,
            "throughput_bytes_per_s": self.throughput_bytes_per_s,
            "bytes_to_host": self.bytes_to_host,
            "result": result,
            "per_device": self.per_device,
        }


def _primary_devices(cluster: Cluster, entry: DatasetEntry) -> dict[str, list[int]]:
    """Partitions grouped by the first replica that answers: who serves each one."""
    if entry.unavailable:
        raise DeviceUnavailable(
            f"{entry.qualified}: partitions {sorted(entry.unavailable)} have no device that "
            "answers; start them (quarry status) and measure again"
        )
    serving: dict[str, list[int]] = {}
    for p in entry.partitions:
        device = next(d for d in p.devices if d not in cluster.down)
        serving.setdefault(device, []).append(p.partition)
    return serving


def _in_parallel(work: Callable[[str], Any], names: Sequence[str]) -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return dict(zip(names, pool.map(work, names), strict=True))


def _digest(kernel: str, result: Any) -> Any:
    """A partition's answer as the device reports it: Count's count, or rows and a checksum."""
    if kernel == "count":
        return int(result)
    if kernel == "pagerank":
        return result
    return (len(result), int(np.sum(result, dtype=np.int64)))


def _combine(kernel: str, digests: Mapping[int, Any]) -> Any:
    if kernel == "count":
        return sum(digests.values())
    if kernel == "pagerank":
        # One graph per partition; the union's ranks are each graph's, shared by the graphs.
        ranks = [rank for _, rank in sorted(digests.items())]
        return ranks[0] if len(ranks) == 1 else np.concatenate(ranks) / len(ranks)
    return {
        "rows": sum(rows for rows, _ in digests.values()),
        "checksum": sum(checksum for _, checksum in digests.values()),
        "partitions": {str(p): list(d) for p, d in sorted(digests.items())},
    }


def run_host(
    cluster: Cluster,
    dataset: str,
    kernel: str,
    *,
    threads: int = 1,
    params: Mapping[str, Any] | None = None,
    host_bus: HostBus | None = None,
) -> KernelRun:
    """The SSD system: read every partition raw (devices in parallel), then compute on the host.

    The transfer ends when every partition is in contiguous numpy arrays on the host; the
    computation runs per partition (the unit the devices use too) with ``threads`` threads. Both
    run under the host's profile when one is set (``quarry.local(host_profile=...)``): the reads
    pass its ingress link (``DeviceClient.batches``), and every piece of the computation holds
    one of its cores, stretched by its compute factor (``host_emulator().run``), so a host
    profile can emulate a host bus and a host CPU shared with other work. Without a host profile
    the computation runs as it is.
    """
    check_kernel(kernel, threads)
    entry = cluster.entry(dataset)
    serving = _primary_devices(cluster, entry)
    rows_of = {p.partition: p.rows for p in entry.partitions}

    def read_device(name: str) -> dict[int, tuple[dict[str, np.ndarray], int]]:
        client = cluster.device(name)
        gathered = {}
        for partition in serving[name]:
            reader = client.scan(entry.domain, entry.name, partition)
            gatherer = Gatherer(kernel, entry.schema, rows_of[partition])
            received = 0
            for batch in client.batches(reader):
                size = batch.get_total_buffer_size()
                if host_bus is not None:
                    host_bus.carry(size)
                received += size
                gatherer.add(batch)
            gathered[partition] = (gatherer.finish(), received)
        return gathered

    started = time.perf_counter()
    gathered = {
        p: g
        for by_device in _in_parallel(read_device, sorted(serving)).values()
        for p, g in by_device.items()
    }
    if host_bus is not None:
        host_bus.drain()
    transfer_s = time.perf_counter() - started
    inputs = {p: arrays for p, (arrays, _) in sorted(gathered.items())}
    rows = sum(rows_of[p] for p in inputs)
    assert rows == entry.rows, f"read {rows} rows of {entry.qualified}, catalog says {entry.rows}"
    for arrays in inputs.values():
        check_preconditions(kernel, arrays)  # untimed: validation is neither transfer nor work
    digests, compute_s = {}, 0.0
    for partition, arrays in inputs.items():
        compute_started = time.perf_counter()
        result = KERNELS[kernel](arrays, threads, params or {}, host_emulator().run)
        compute_s += time.perf_counter() - compute_started
        digests[partition] = _digest(kernel, result)
    return KernelRun(
        system="ssd",
        kernel=kernel,
        dataset=entry.qualified,
        devices=len(serving),
        threads=threads,
        rows=rows,
        bytes=int(sum(a.nbytes for arrays in inputs.values() for a in arrays.values())),
        transfer_s=transfer_s,
        compute_s=compute_s,
        total_s=transfer_s + compute_s,
        bytes_to_host=sum(received for _, received in gathered.values()),
        result=_combine(kernel, digests),
    )


def run_devices(
    cluster: Cluster,
    dataset: str,
    kernel: str,
    *,
    threads: int = 1,
    params: Mapping[str, Any] | None = None,
) -> KernelRun:
    """The CSD system: every device runs ``capacity.<kernel>`` on its partitions, all at once.

    ``total_s`` is the coordinator's wall clock until the last device answered; ``transfer_s``
    and ``compute_s`` are those of the device that took longest (it sets the array's time).
    """
    check_kernel(kernel, threads)
    entry = cluster.entry(dataset)
    serving = _primary_devices(cluster, entry)
    header_base = {
        "domain": entry.domain,
        "dataset": entry.name,
        "threads": threads,
        "params": dict(params or {}),
        "output": "digest",
    }

    def call(name: str) -> tuple[pa.Table, dict[str, Any]]:
        header = {**header_base, "partitions": serving[name]}
        return cluster.device(name).program(program_name(kernel), header)

    started = time.perf_counter()
    answers = _in_parallel(call, sorted(serving))
    total_s = time.perf_counter() - started
    digests: dict[int, Any] = {}
    summaries = []
    for name, (table, summary) in answers.items():
        assert table.schema.equals(output_schema(kernel, "digest")), table.schema
        summaries.append({"device": name, **{key: summary.get(key) for key in SUMMARY_KEYS}})
        digests.update(_table_digests(kernel, table, serving[name]))
    slowest = max(summaries, key=lambda s: s["transfer_s"] + s["compute_s"])
    rows = sum(s["rows"] for s in summaries)
    assert rows == entry.rows, (
        f"devices computed on {rows} rows of {entry.qualified}, catalog says {entry.rows}"
    )
    return KernelRun(
        system="csd",
        kernel=kernel,
        dataset=entry.qualified,
        devices=len(serving),
        threads=threads,
        rows=rows,
        bytes=sum(s["bytes"] for s in summaries),
        transfer_s=slowest["transfer_s"],
        compute_s=slowest["compute_s"],
        total_s=total_s,
        bytes_to_host=sum(s["bytes_shipped"] for s in summaries),
        result=_combine(kernel, digests),
        per_device=summaries,
    )


def _table_digests(kernel: str, table: pa.Table, partitions: Sequence[int]) -> dict[int, Any]:
    if kernel == "pagerank":
        # Its output has no partition column: a device answers for the one graph it holds.
        assert len(partitions) == 1, f"pagerank: one partition per device, got {partitions}"
        order = np.argsort(table.column("page").to_numpy())
        return {partitions[0]: table.column("rank").to_numpy()[order]}
    partitions = table.column("partition").to_pylist()
    if kernel == "count":
        return dict(zip(partitions, table.column("count").to_pylist(), strict=True))
    return {
        p: (rows, checksum)
        for p, rows, checksum in zip(
            partitions,
            table.column("rows").to_pylist(),
            table.column("checksum").to_pylist(),
            strict=True,
        )
    }


# ---- step 1: the four times on one device ----------------------------------------------------


@dataclass
class Measurement:
    """CSDPLAN's inputs measured on one device, with the runs they are the medians of."""

    inputs: CapacityInputs
    device: str
    profile: str
    device_threads: int
    host_runs: list[KernelRun]
    device_runs: list[KernelRun]

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs.to_dict(),
            "device": self.device,
            "profile": self.profile,
            "device_threads": self.device_threads,
            "host_runs": [r.to_dict() for r in self.host_runs],
            "device_runs": [r.to_dict() for r in self.device_runs],
            "csd_overhead_s_median": statistics.median(
                r.total_s - r.transfer_s - r.compute_s for r in self.device_runs
            ),
        }


def inputs_from_runs(
    host_runs: Sequence[KernelRun], device_runs: Sequence[KernelRun], name: str
) -> CapacityInputs:
    """CSDPLAN's four times as the medians of one-drive runs of each system.

    The host's runs must use one thread (T_SSD-comp is the time Eq. 2 divides by n cores).
    """
    if not host_runs or not device_runs:
        raise CapacityInputError("runs", "no runs of one of the systems", "measure both")
    if any(r.system != "ssd" or r.threads != 1 or r.devices != 1 for r in host_runs) or any(
        r.system != "csd" or r.devices != 1 for r in device_runs
    ):
        raise CapacityInputError(
            "runs",
            "not one-drive runs of the host (one thread) and drive",
            "measure on a single device (single_device)",
        )
    sizes = {r.bytes for r in (*host_runs, *device_runs)}
    if len(sizes) != 1:
        raise CapacityInputError(
            "runs", f"working sets of different sizes {sorted(sizes)}", "measure one working set"
        )
    return CapacityInputs(
        t_ssd_tx_s=statistics.median(r.transfer_s for r in host_runs),
        t_ssd_comp_s=statistics.median(r.compute_s for r in host_runs),
        t_csd_tx_s=statistics.median(r.transfer_s for r in device_runs),
        t_csd_comp_s=statistics.median(r.compute_s for r in device_runs),
        data_bytes=sizes.pop(),
        name=name,
    )


def single_device(cluster: Cluster, device: str | None = None) -> Cluster:
    """A Cluster over one device of ``cluster`` (the first that answers unless named): the paper's
    'system equipped with a single device'. Close it when done; the devices keep running."""
    from quarry.coordinator.cluster import Cluster as ClusterType

    live = [c.name for c in cluster.live_devices()]
    if not live:
        raise DeviceUnavailable("no device answers: start the cluster first (quarry up)")
    name = device or live[0]
    if name not in live:
        raise CapacityInputError(
            "device",
            f"{name!r} is not a live device of this cluster",
            f"choose one of {', '.join(live)}",
        )
    spec = next(d for d in cluster.specs if d.name == name)
    return ClusterType([spec], source=cluster.source)


def device_cores(cluster: Cluster, device: str) -> int:
    """The emulated cores of a device's profile (1 when it has no limit: use the host's own)."""
    info = cluster.info.get(device)
    return int((info.profile.cores if info is not None else None) or 1)


def measure_kernel(
    cluster: Cluster,
    kernel: str,
    data_bytes: int,
    *,
    device: str | None = None,
    device_threads: int | None = None,
    repeat: int = 3,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    on_run: Callable[[KernelRun], None] | None = None,
) -> Measurement:
    """CSDPLAN Step 1 for ``kernel`` on one device of ``cluster``: the four times, as medians.

    The working set (about ``data_bytes``) is stored on that device alone. The host computes with
    one thread (T_SSD-comp is the one-core time that Eq. 2 divides by n); the device with
    ``device_threads`` (default: its profile's cores). One untimed warm-up run of each system
    comes first (the device imports the program, the page cache fills); then ``repeat`` runs of
    each, alternating, so that a passing load on the machine hits both systems alike.
    """
    check_kernel(kernel, 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= REPEAT_MAX:
        raise CapacityInputError("repeat", f"got {repeat!r}", f"give 1 to {REPEAT_MAX}")
    single = single_device(cluster, device)
    try:
        name = single.live_devices()[0].name
        threads = device_threads or device_cores(single, name)
        check_kernel(kernel, threads)
        profile = single.info[name].profile.name
        entry = ingest_kernel_inputs(
            single, kernel, data_bytes, dataset_name(kernel, data_bytes, name), seed=seed
        )
        host_runs: list[KernelRun] = []
        device_runs: list[KernelRun] = []
        run_host(single, entry.qualified, kernel, threads=1, params=params)
        run_devices(single, entry.qualified, kernel, threads=threads, params=params)
        for _ in range(repeat):
            for runs, run in ((host_runs, run_host), (device_runs, run_devices)):
                runs.append(
                    run(
                        single,
                        entry.qualified,
                        kernel,
                        threads=1 if run is run_host else threads,
                        params=params,
                    )
                )
                if on_run is not None:
                    on_run(runs[-1])
        if kernel != "pagerank" and host_runs[0].result != device_runs[0].result:
            raise AssertionError(
                f"{kernel}: the host computed {host_runs[0].result}, device "
                f"{name} {device_runs[0].result}"
            )
        inputs = inputs_from_runs(host_runs, device_runs, f"{kernel}-{profile}")
        return Measurement(inputs, name, profile, threads, host_runs, device_runs)
    finally:
        single.close()


# ---- from `quarry calibrate` -----------------------------------------------------------------


def calibration_report(
    reports: Sequence[CalibrationReport], device: str | None = None
) -> CalibrationReport:
    """One device's calibration: the named one, or the median of all (they must share a profile).

    ``reports`` is what ``Cluster.calibrate()`` returns (``quarry calibrate --json`` prints them).
    """
    if not reports:
        raise CapacityInputError("calibration", "no reports", "run quarry calibrate first")
    if device is not None:
        chosen = [r for r in reports if r.device == device]
        if not chosen:
            raise CapacityInputError(
                "device",
                f"no calibration for {device!r}",
                f"choose one of {', '.join(r.device for r in reports)}",
            )
        return chosen[0]
    profiles = sorted({r.profile for r in reports})
    if len(profiles) != 1:
        raise CapacityInputError(
            "calibration",
            f"devices of several profiles ({', '.join(profiles)})",
            "CSDPLAN models one kind of drive: name one device",
        )

    def median(figure: Callable[[CalibrationReport], Measured], key: str) -> Measured:
        measured = statistics.median(_measured(figure(r), key) for r in reports)
        return Measured(figure(reports[0]).expected, measured)

    return CalibrationReport(
        device="median of " + ", ".join(r.device for r in reports),
        profile=profiles[0],
        compute_factor=median(lambda r: r.compute_factor, "compute_factor"),
        internal_bytes_per_s=median(lambda r: r.internal_bytes_per_s, "internal_bytes_per_s"),
        external_bytes_per_s=median(lambda r: r.external_bytes_per_s, "external_bytes_per_s"),
    )


def _measured(figure: Measured, key: str) -> float:
    value = figure.measured
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or not math.isfinite(value)
    ):
        raise CapacityInputError(
            f"calibration.{key}.measured",
            f"got {value!r}",
            "run quarry calibrate again; it measures a positive number",
        )
    return float(value)


def host_compute_s(
    kernel: str, data_bytes: int, threads: int = 1, *, repeat: int = 3, seed: int = 0
) -> float:
    """The median time this host's CPU takes to compute ``kernel`` on generated data."""
    inputs = make_inputs(kernel, data_bytes, seed=seed)
    run_kernel(kernel, inputs, threads)  # warm-up: allocator, caches
    return statistics.median(
        run_kernel(kernel, inputs, threads)["compute_s"] for _ in range(repeat)
    )


def calibration_inputs(
    report: CalibrationReport,
    *,
    data_bytes: int,
    host_compute_s: float,
    device_compute_s: float | None = None,
    name: str = "calibrated",
) -> CapacityInputs:
    """CSDPLAN's inputs from a calibration report and the host's computation time.

    - T_SSD-tx = bytes / min(internal, external): a raw read passes the drive's own read and its
      link to the host, overlapped, so the slower one sets the pace (the paper's "the SSD system
      uses the CSD as a block device" at the external bandwidth, bounded by the medium);
    - T_SSD-comp = ``host_compute_s``, measured with one host thread;
    - T_CSD-tx = bytes / internal;
    - T_CSD-comp = compute factor x ``device_compute_s``: the host's time with as many threads as
      the device uses (default ``host_compute_s``, one thread).
    """
    internal = _measured(report.internal_bytes_per_s, "internal_bytes_per_s")
    external = _measured(report.external_bytes_per_s, "external_bytes_per_s")
    compute_factor = _measured(report.compute_factor, "compute_factor")
    threaded_s = host_compute_s if device_compute_s is None else device_compute_s
    return CapacityInputs(
        t_ssd_tx_s=data_bytes / min(internal, external),
        t_ssd_comp_s=host_compute_s,
        t_csd_tx_s=data_bytes / internal,
        t_csd_comp_s=compute_factor * threaded_s,
        data_bytes=data_bytes,
        name=name,
    )


def drop_quietly(cluster: Cluster, dataset: str) -> None:
    """Drop a measurement's dataset if it is there (a missing one is fine)."""
    with contextlib.suppress(DatasetNotFound):
        cluster.drop(dataset)


__all__ = [
    "SYSTEMS",
    "HostBus",
    "KernelRun",
    "Measurement",
    "calibration_inputs",
    "calibration_report",
    "dataset_name",
    "device_cores",
    "drop_quietly",
    "host_compute_s",
    "ingest_kernel_inputs",
    "inputs_from_runs",
    "measure_kernel",
    "run_devices",
    "run_host",
    "single_device",
]
