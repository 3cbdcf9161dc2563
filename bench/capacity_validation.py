"""CSDPLAN validated on our own cluster: the four §4 kernels on 1..16 emulated drives, with the
host normal and overloaded.

Run: python bench/capacity_validation.py [--kernels count,vector_addition,array_merge,pagerank]
     [--devices-max 16] [--rounds 3] [--k-limit 4] [--conditions normal,cpu,io] [--calibration]

For every condition of the host (CSDPLAN §4.4), one cluster of ``--devices-max`` drives runs, and
for every kernel:

1. Step 1 (§3.2): on one drive, measure T_SSD-tx, T_SSD-comp (one host core), T_CSD-tx and
   T_CSD-comp (``quarry.capacity.measure.measure_kernel``): 3 runs of each system before the
   sweep, then one more of each in every round; the inputs are the medians of all.
2. Predict with the model: the SSD array (the host reads raw from m drives, then computes on one
   core; Eq. 5-6) and the CSD array (m drives compute their share; Eq. 7), m = 1..16, and the
   break-even point (BEP, ``break_even``: Eq. 8 with the bus cap). Under overload the host's
   slow-down factors are measured as §4.4 does, on one drive (step 1 under overload over step 1
   without: ``overloaded_host``), and enter Eq. 5 and Eq. 8 / 13.
3. Measure the same 32 configurations on the live cluster in rounds (each round visits every m,
   alternating the order of the two systems), and take medians: other work on this 2-core
   machine moves single runs, and a round-robin spreads its effect over all points.
4. Compare: throughput within 15% at every point; measured BEP within 1 drive of the predicted.

What is emulated, and by what:

- The drive (``capdrive``, a profile written to a temporary TOML file): ``kinetic``'s 1 MiB
  key-values and 2.5 GbE port, one core 30x slower than a host core, an internal read of 25 MB/s.
  A slow medium and a slow controller keep 16 drives' real work (reading, and 1/30 of their
  computation) well inside this machine's 2 cores; with kinetic's 15x and 50 MB/s, Array Merge
  on 16 drives measured the machine's contention (the drives' computation came out 20 to 50%
  slower than 1/16 of one drive's), not the drives.
- The host bus (k_limit, Eq. 6): the host profile's ingress link, ``external_bytes_per_s`` =
  k_limit x the drive's read rate. ``run_host`` reads through the coordinator's DeviceClient
  streams, and every batch a device sends the host passes that one bucket, with real
  back-pressure on the drives' streams. (``HostBus``, the earlier emulation, is no longer needed:
  it accounted the bytes after they arrived, without slowing the streams.)
- The host CPU (Host(1), Eq. 2): the host profile's one core; ``run_host`` computes every piece
  in it (``host_emulator().run``), stretched by the profile's compute factor.
- Overload, CPU (``cpu``: sd_comp = 2): the host profile's compute factor is 2, so the kernel gets
  half of the host's core, the rest going to the other work (the emulator's processor sharing).
- Overload, I/O (``io``: sd_tx = 2): a data-intensive co-tenant takes half of the host's I/O
  path: the host's ingress link (the bus) and each drive's port to the host (the drive profile's
  external link) run at half rate. The drives' internal reads, which the CSD array uses, are
  untouched: the CSD array is not affected by the host's overload (Eq. 3).

Working sets: fixed in total per kernel and split evenly over the m drives, as in Figure 7 and
as Eq. 5 and 7 assume; "evenly" in whole row groups of ingest (``point_bytes``), so the total
varies a little with m and throughput is per byte of each point's own working set. Page Rank
needs a whole matrix per computation, so its working set on m drives is m independent graphs,
one per drive (``pagerank_blocks_table``), of widths that fit ingest's row groups.

The machine's allocator is set to reuse memory (``MALLOC_TUNING``), and ``SETUPS`` sizes each
kernel; the comments there say why.

Writes bench/results/capacity_validation.json and .png. A benchmark measures and reports: the
"within" flags say whether the acceptance bounds held on this run; it does not fail.
"""

from __future__ import annotations

import ctypes
import os

# One thread per BLAS call, in this process and in the device processes it starts: Page Rank's
# T_SSD-comp is the time of one host core (Eq. 2), and a drive computes on its emulated cores.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
# Memory the kernels allocate is reused, never fresh from the kernel. glibc maps every block over
# its (at most 32 MiB) threshold anew and gives it back on free, so a 48 MiB output array costs
# 12k page faults each run, in system time that the drives count as compute and stretch 15x:
# the same Vector Addition took 0.2 to 2.1 s on one drive, and arrays under the threshold
# (smaller shares, more drives) paid nothing. Without mmap and trimming, and with one arena (a
# request served by a thread that had not allocated before would otherwise start a cold arena),
# a drive's memory is its own steady working memory, as on a real drive, and the cost per byte
# is the work's.
MALLOC_TUNING = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_ARENA_MAX": "1",
}
os.environ.update(MALLOC_TUNING)  # the device processes read it when they start
try:  # this process started before: tell its allocator directly
    _libc = ctypes.CDLL("libc.so.6")
    for _option, _value in ((-4, 0), (-1, 1 << 30), (-8, 1)):  # M_MMAP_MAX, M_TRIM_, M_ARENA_MAX
        _libc.mallopt(_option, _value)
except OSError:  # not glibc: nothing to tune
    pass

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import quarry  # noqa: E402
from quarry.capacity.break_even import bep_eq13, break_even  # noqa: E402
from quarry.capacity.kernels import KERNELS  # noqa: E402
from quarry.capacity.measure import (  # noqa: E402
    KernelRun,
    calibration_inputs,
    calibration_report,
    dataset_name,
    host_compute_s,
    ingest_kernel_inputs,
    inputs_from_runs,
    measure_kernel,
    run_devices,
    run_host,
    single_device,
)
from quarry.capacity.model import (  # noqa: E402
    CapacityInputs,
    HostConfig,
    overloaded_host,
    t_csd_array_s,
    t_ssd_array_s,
)
from quarry.coordinator.cluster import Cluster  # noqa: E402
from quarry.coordinator.ingest.layout import ROW_GROUP_BYTES  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json  # noqa: E402

NAME = "capacity_validation"
DRIVE = "capdrive"
DRIVE_READ_BYTES_PER_S = 2.5e7
DRIVE_COMPUTE_FACTOR = 30.0
STEP1_REPEAT = 3  # before the sweep; one more pair per round
THROUGHPUT_TOLERANCE = 0.15
BEP_TOLERANCE_DEVICES = 1
SYSTEMS = ("ssd", "csd")
console = Console(width=150)


@dataclass(frozen=True)
class KernelSetup:
    """A kernel's working set (total, MiB) and parameters: a point takes 0.15 to 4 s."""

    kernel: str
    mib: int
    params: dict[str, Any] = field(default_factory=dict)


# Count and Vector Addition are transfer-bound (the host computes them at GB/s), so they get the
# largest sets: at 16 drives each drive's share still reads for over 0.1 s. Array Merge costs the
# drive most per byte; 64 MiB keeps 4 MiB a drive at 16 (with 24 MiB, 1.5 MiB shares missed by
# 17 to 44%: per-request overhead and the bucket's idle credit weighed on a 0.3 s point).
# Page Rank's 20 iterations make it as compute-heavy on the drive as its transfer (the paper's
# is compute-bound; more would put its BEP beyond 16 drives).
SETUPS = {
    "count": KernelSetup("count", 48),
    "vector_addition": KernelSetup("vector_addition", 48),
    "array_merge": KernelSetup("array_merge", 64),
    "pagerank": KernelSetup("pagerank", 48, {"iterations": 20}),
}


@dataclass(frozen=True)
class Condition:
    """A host condition of §4.4: the slow-down factors it is built to cause (1 = normal)."""

    name: str
    sd_tx: float
    sd_comp: float
    description: str

    @property
    def drive_profile(self) -> str:
        return DRIVE if self.sd_tx == 1 else f"{DRIVE}_{self.name}"

    @property
    def host_profile(self) -> str:
        return f"caphost_{self.name}"


CONDITIONS = {
    "normal": Condition("normal", 1.0, 1.0, "the host alone"),
    "cpu": Condition("cpu", 1.0, 2.0, "half of the host's core taken by other work"),
    "io": Condition("io", 2.0, 1.0, "half of the host's I/O path taken by other work"),
    "both": Condition("both", 2.0, 2.0, "half of the host's core and I/O path taken"),
}


def profiles_toml(k_limit: int, conditions: list[Condition]) -> str:
    """The drive, and per condition the host (and, under I/O overload, the drive's port)."""
    lines = [
        f"[profiles.{DRIVE}]",
        'from = "kinetic"                 # 1 MiB key-values, 2.5 GbE port',
        f"internal_bytes_per_s = {DRIVE_READ_BYTES_PER_S:.6g}",
        "cores = 1",
        f"compute_factor = {DRIVE_COMPUTE_FACTOR:.6g}",
        "",
    ]
    for condition in conditions:
        if condition.sd_tx != 1:
            lines += [
                f"[profiles.{condition.drive_profile}]",
                f'from = "{DRIVE}"',
                f"external_bytes_per_s = {DRIVE_READ_BYTES_PER_S / condition.sd_tx:.6g}",
                "",
            ]
        lines += [
            f"[profiles.{condition.host_profile}]",
            'from = "host"',
            "cores = 1",
            f"compute_factor = {condition.sd_comp:.6g}",
            f"external_bytes_per_s = {k_limit * DRIVE_READ_BYTES_PER_S / condition.sd_tx:.6g}",
            "",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Point:
    """One system at one drive count: model against the median of the rounds."""

    system: str
    devices: int
    predicted_mb_per_s: float
    measured_mb_per_s: float
    measured_mb_per_s_min: float
    measured_mb_per_s_max: float
    error: float
    within_tolerance: bool
    working_set_bytes: int
    total_s: list[float]
    transfer_s_median: float
    compute_s_median: float


@dataclass(frozen=True)
class Bep:
    predicted: int
    predicted_value: float  # Eq. 5-7's crossing (the bus cap binds) or Eq. 8's value
    eq8: int  # Eq. 8 (Eq. 13 in ratio form) alone, without the bus cap
    eq13: int
    measured: int | None
    within_tolerance: bool


@dataclass(frozen=True)
class ConditionResult:
    """One kernel under one host condition."""

    kernel: str
    condition: str
    sd_tx_emulated: float
    sd_comp_emulated: float
    sd_tx_measured: float
    sd_comp_measured: float
    inputs: dict[str, Any]  # step 1 under this condition
    model_inputs: dict[str, Any]  # the normal host's SSD times, this condition's CSD times
    host: dict[str, Any]
    bep: Bep
    points: list[Point]
    max_abs_error: dict[str, float]
    all_points_within_tolerance: bool
    step1_host_runs: list[dict[str, Any]]
    step1_device_runs: list[dict[str, Any]]


@dataclass
class Collected:
    """What one kernel's runs under one condition produced."""

    kernel: str
    condition: Condition
    inputs: CapacityInputs
    step1_host: list[KernelRun]
    step1_device: list[KernelRun]
    runs: dict[str, dict[int, list[KernelRun]]]


def measured_bep(ssd: dict[int, float], csd: dict[int, float]) -> int | None:
    """The least m whose CSD throughput is at least the SSD array's (None: not within range)."""
    return next((m for m in sorted(ssd) if csd[m] >= ssd[m]), None)


def point_bytes(setup: KernelSetup, m: int) -> int:
    """The working set on m drives: the same whole number of ingest's row groups on every drive.

    Ingest deals rows to partitions round-robin in groups of ROW_GROUP_BYTES (1 MiB of these
    kernels' rows), so 48 MiB over 15 drives would give three drives 4 MiB and twelve 3 MiB, and
    the array would wait for the larger shares (25% over an even split). The total is therefore
    m x round(total / m) groups, and throughput is per byte. Page Rank's blocks are equal already.
    """
    if setup.kernel == "pagerank":
        return setup.mib << 20
    return m * max(1, round(setup.mib * 2**20 / ROW_GROUP_BYTES / m)) * ROW_GROUP_BYTES


def store_points(
    cluster: Cluster, setup: KernelSetup, devices: list[int]
) -> dict[int, tuple[Cluster, str]]:
    """The kernel's working set on the first m drives, for every m (reused when stored)."""
    points: dict[int, tuple[Cluster, str]] = {}
    with progress(console) as bars:
        task = bars.add_task(f"{setup.kernel}: working set on 1..{devices[-1]}", total=len(devices))
        for m in devices:
            sub = Cluster(cluster.specs[:m])
            points[m] = (sub, "")
            data_bytes = point_bytes(setup, m)
            name = dataset_name(setup.kernel, data_bytes, f"m{m}")
            entry = ingest_kernel_inputs(sub, setup.kernel, data_bytes, name, pagerank_blocks=True)
            assert len(entry.partitions_by_device()) == m, entry.partitions_by_device()
            points[m] = (sub, entry.qualified)
            bars.advance(task)
    return points


def check_pagerank(run: KernelRun) -> None:
    """Each drive's graph must have arrived whole: a column-stochastic block keeps its ranks'
    sum at 1, a block mixed with another's rows would not."""
    ranks = np.asarray(run.result)
    assert abs(float(ranks.sum()) - 1.0) < 1e-3, (run.dataset, float(ranks.sum()))


def run_point(system: str, cluster: Cluster, dataset: str, setup: KernelSetup) -> KernelRun:
    run = run_host if system == "ssd" else run_devices
    return run(cluster, dataset, setup.kernel, params=setup.params)


def sweep(
    setup: KernelSetup,
    step1: tuple[Cluster, str],
    points: dict[int, tuple[Cluster, str]],
    rounds: int,
) -> tuple[dict[str, list[KernelRun]], dict[str, dict[int, list[KernelRun]]]]:
    """A warm-up run per point, then ``rounds`` rounds of step 1 and every point, both systems."""
    step1_runs: dict[str, list[KernelRun]] = {"ssd": [], "csd": []}
    runs: dict[str, dict[int, list[KernelRun]]] = {"ssd": {}, "csd": {}}
    with progress(console) as bars:
        warm = bars.add_task(f"{setup.kernel}: warm-up", total=len(points))
        for cluster, dataset in points.values():
            for system in SYSTEMS:
                run = run_point(system, cluster, dataset, setup)
                if setup.kernel == "pagerank":
                    check_pagerank(run)
            bars.advance(warm)
        task = bars.add_task(f"{setup.kernel}: rounds", total=rounds * (len(points) + 1) * 2)
        for number in range(rounds):
            for system in SYSTEMS:
                step1_runs[system].append(run_point(system, *step1, setup))
            bars.advance(task, 2)
            for m, (cluster, dataset) in points.items():
                order = SYSTEMS if (number + m) % 2 == 0 else SYSTEMS[::-1]
                for system in order:
                    bars.update(task, description=f"{setup.kernel}: round {number + 1}, m={m}")
                    runs[system].setdefault(m, []).append(
                        run_point(system, cluster, dataset, setup)
                    )
                    bars.advance(task)
    return step1_runs, runs


def collect(
    cluster: Cluster, setup: KernelSetup, condition: Condition, devices: list[int], rounds: int
) -> Collected:
    """Step 1 and the sweep of one kernel under one condition, on a running cluster."""
    data_bytes = setup.mib << 20
    with progress(console) as bars:
        task = bars.add_task(f"{setup.kernel}: step 1 on one drive", total=2 * STEP1_REPEAT)
        first = measure_kernel(
            cluster,
            setup.kernel,
            data_bytes,
            device="dev0",
            repeat=STEP1_REPEAT,
            params=setup.params,
            on_run=lambda _: bars.advance(task),
        )
    single = single_device(cluster, "dev0")
    points: dict[int, tuple[Cluster, str]] = {}
    try:
        points = store_points(cluster, setup, devices)
        step1 = (single, dataset_name(setup.kernel, data_bytes, "dev0"))
        step1_runs, runs = sweep(setup, step1, points, rounds)
    finally:
        single.close()
        for sub, _ in points.values():
            sub.close()
    host_runs = first.host_runs + step1_runs["ssd"]
    device_runs = first.device_runs + step1_runs["csd"]
    inputs = inputs_from_runs(host_runs, device_runs, f"{setup.kernel}-{DRIVE}-{condition.name}")
    return Collected(setup.kernel, condition, inputs, host_runs, device_runs, runs)


def calibration_bep(cluster: Cluster, setup: KernelSetup, host: HostConfig) -> dict[str, Any]:
    """Count's BEP predicted from ``quarry calibrate`` alone (no kernel run on a drive)."""
    single = single_device(cluster, "dev0")
    try:
        with console.status("quarry calibrate on dev0"):
            reports = single.calibrate()
    finally:
        single.close()
    data_bytes = setup.mib << 20
    inputs = calibration_inputs(
        calibration_report(reports),
        data_bytes=data_bytes,
        host_compute_s=host_compute_s(setup.kernel, data_bytes, 1),
        name=f"{setup.kernel}-{DRIVE}-calibrated",
    )
    return {
        "report": reports[0].to_json(),
        "inputs": inputs.to_dict(),
        "bep": break_even(inputs, host).bep,
    }


def summarize_point(system: str, m: int, runs: list[KernelRun], predicted_mb_per_s: float) -> Point:
    totals = [r.total_s for r in runs]
    working_set = runs[0].bytes
    measured = working_set / statistics.median(totals) / 1e6
    error = measured / predicted_mb_per_s - 1
    return Point(
        system=system,
        devices=m,
        predicted_mb_per_s=predicted_mb_per_s,
        measured_mb_per_s=measured,
        measured_mb_per_s_min=working_set / max(totals) / 1e6,
        measured_mb_per_s_max=working_set / min(totals) / 1e6,
        error=error,
        within_tolerance=abs(error) <= THROUGHPUT_TOLERANCE,
        working_set_bytes=working_set,
        total_s=totals,
        transfer_s_median=statistics.median(r.transfer_s for r in runs),
        compute_s_median=statistics.median(r.compute_s for r in runs),
    )


def analyse(collected: Collected, normal: CapacityInputs, k_limit: int) -> ConditionResult:
    """The model for one condition against its measurements.

    The model's SSD times are the normal host's, slowed by the factors measured on one drive
    under this condition (§4.4); its CSD times are this condition's own step 1 (the drive is the
    same; measuring it again follows any drift of the machine's load).
    """
    measured = collected.inputs
    host = overloaded_host(normal, measured, HostConfig(host_cores=1, k_limit=k_limit))
    model = CapacityInputs(
        normal.t_ssd_tx_s,
        normal.t_ssd_comp_s,
        measured.t_csd_tx_s,
        measured.t_csd_comp_s,
        normal.data_bytes,
        f"{collected.kernel}-{collected.condition.name}-model",
    )
    data_bytes = model.data_bytes
    assert data_bytes is not None
    points: list[Point] = []
    medians: dict[str, dict[int, float]] = {"ssd": {}, "csd": {}}
    for system in SYSTEMS:
        for m, runs in sorted(collected.runs[system].items()):
            time_s = t_ssd_array_s(model, host, m) if system == "ssd" else t_csd_array_s(model, m)
            point = summarize_point(system, m, runs, data_bytes / time_s / 1e6)
            points.append(point)
            medians[system][m] = point.measured_mb_per_s
    predicted = break_even(model, host)
    ratios = model.ratios(1)
    bep_measured = measured_bep(medians["ssd"], medians["csd"])
    bep = Bep(
        predicted=predicted.bep,
        predicted_value=predicted.capped_value or predicted.eq8_value,
        eq8=predicted.bep_eq8,
        eq13=bep_eq13(ratios.r_tx, ratios.r_comp, ratios.r_ssd, host.sd_tx, host.sd_comp),
        measured=bep_measured,
        within_tolerance=bep_measured is not None
        and abs(bep_measured - predicted.bep) <= BEP_TOLERANCE_DEVICES,
    )
    return ConditionResult(
        kernel=collected.kernel,
        condition=collected.condition.name,
        sd_tx_emulated=collected.condition.sd_tx,
        sd_comp_emulated=collected.condition.sd_comp,
        sd_tx_measured=host.sd_tx,
        sd_comp_measured=host.sd_comp,
        inputs=measured.to_dict(),
        model_inputs=model.to_dict(),
        host=host.to_dict(),
        bep=bep,
        points=points,
        max_abs_error={s: max(abs(p.error) for p in points if p.system == s) for s in SYSTEMS},
        all_points_within_tolerance=all(p.within_tolerance for p in points),
        step1_host_runs=[r.to_dict() for r in collected.step1_host],
        step1_device_runs=[r.to_dict() for r in collected.step1_device],
    )


# ---- figure -----------------------------------------------------------------------------------

STYLES = {"normal": "-", "cpu": "--", "io": ":", "both": "-."}
COLORS = {"ssd": "tab:blue", "csd": "tab:red"}


def draw_kernel(axes: Any, kernel: str, results: list[ConditionResult]) -> None:
    """Figure 7 / 12 style: throughput against drives, model lines and measured medians."""
    for result in results:
        for system in SYSTEMS:
            if system == "csd" and result.condition != "normal":
                continue  # the CSD array is the same under every condition (Eq. 3); see JSON
            points = [p for p in result.points if p.system == system]
            devices = [p.devices for p in points]
            label = "SSD array, Host(1)" if system == "ssd" else "CSD array"
            if system == "ssd":
                label += f" [{result.condition}]"
            axes.plot(
                devices,
                [p.predicted_mb_per_s for p in points],
                STYLES[result.condition],
                color=COLORS[system],
                alpha=0.8,
                label=f"model: {label}",
            )
            marker = {"normal": "o", "cpu": "s", "io": "^", "both": "D"}[result.condition]
            axes.plot(
                devices,
                [p.measured_mb_per_s for p in points],
                marker,
                color=COLORS[system],
                markersize=4,
                label=f"measured: {label}",
            )
            axes.vlines(
                devices,
                [p.measured_mb_per_s_min for p in points],
                [p.measured_mb_per_s_max for p in points],
                color=COLORS[system],
                alpha=0.4,
            )
    normal = next(r for r in results if r.condition == "normal")
    axes.axvline(normal.bep.predicted, color="gray", linestyle="--", alpha=0.5)
    title = ", ".join(f"{r.condition}: BEP {r.bep.predicted}/{r.bep.measured}" for r in results)
    axes.set_title(f"{kernel} (BEP model/measured: {title})", fontsize=8.5)
    axes.set_xlabel("drives m")
    axes.set_ylabel("throughput (MB/s)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=6, loc="upper left", ncol=2)


def draw_bep(axes: Any, results: list[ConditionResult]) -> None:
    """Figure 14 style, one bar pair per kernel and condition: predicted and measured BEP."""
    labels = [
        f"{r.kernel}\n{r.condition}\nsd {r.sd_tx_measured:.2f}/{r.sd_comp_measured:.2f}"
        for r in results
    ]
    x = np.arange(len(results))
    axes.bar(x - 0.2, [r.bep.predicted for r in results], 0.4, label="predicted (Eq. 5-8/13)")
    axes.bar(
        x + 0.2,
        [r.bep.measured or 0 for r in results],
        0.4,
        label="measured",
        color="tab:orange",
    )
    axes.errorbar(
        x - 0.2,
        [r.bep.predicted for r in results],
        yerr=BEP_TOLERANCE_DEVICES,
        fmt="none",
        color="black",
        capsize=3,
        label=f"±{BEP_TOLERANCE_DEVICES} drive",
    )
    axes.set_xticks(x)
    axes.set_xticklabels(labels, fontsize=6)
    axes.set_ylabel("break-even point (drives)")
    axes.set_title("BEP under host overload (sd_tx/sd_comp measured on one drive)", fontsize=9)
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=7)


def draw_errors(axes: Any, results: list[ConditionResult]) -> None:
    x = np.arange(len(results))
    for offset, system in ((-0.2, "ssd"), (0.2, "csd")):
        axes.bar(
            x + offset,
            [100 * r.max_abs_error[system] for r in results],
            0.4,
            color=COLORS[system],
            label=f"{system.upper()} array",
        )
    axes.axhline(100 * THROUGHPUT_TOLERANCE, color="green", linestyle="--", label="15%")
    axes.set_xticks(x)
    axes.set_xticklabels([f"{r.kernel}\n{r.condition}" for r in results], fontsize=6)
    axes.set_ylabel("max |measured / model - 1| over m (%)")
    axes.set_title("largest throughput error per kernel and condition", fontsize=9)
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=7)


def draw(path: Path, results: list[ConditionResult], kernels: list[str]) -> None:
    columns = 3
    rows = -(-(len(kernels) + 2) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(6.2 * columns, 4.8 * rows), squeeze=False)
    panels = list(grid.flat)
    for axes, kernel in zip(panels, kernels, strict=False):
        draw_kernel(axes, kernel, [r for r in results if r.kernel == kernel])
    draw_bep(panels[len(kernels)], results)
    draw_errors(panels[len(kernels) + 1], results)
    for axes in panels[len(kernels) + 2 :]:
        axes.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---- report -----------------------------------------------------------------------------------


def report_kernel(kernel: str, results: list[ConditionResult]) -> None:
    table = Table(title=f"{kernel}: throughput MB/s, model / measured (median), error")
    table.add_column("m", justify="right")
    for result in results:
        table.add_column(f"SSD {result.condition}", justify="right")
        table.add_column(f"CSD {result.condition}", justify="right")
    devices = sorted({p.devices for p in results[0].points})
    for m in devices:
        cells = [str(m)]
        for result in results:
            for system in SYSTEMS:
                p = next(p for p in result.points if p.system == system and p.devices == m)
                mark = "" if p.within_tolerance else " !"
                cells.append(
                    f"{p.predicted_mb_per_s:.0f}/{p.measured_mb_per_s:.0f} "
                    f"{100 * p.error:+.0f}%{mark}"
                )
        table.add_row(*cells)
    console.print(table)


def report_summary(results: list[ConditionResult]) -> None:
    table = Table(title="summary: largest error over m, and the break-even point")
    for column in (
        "kernel",
        "condition",
        "sd_tx",
        "sd_comp",
        "max SSD err",
        "max CSD err",
        "BEP model",
        "Eq. 8/13",
        "BEP measured",
        "within",
    ):
        table.add_column(column, justify="right")
    for r in results:
        within = r.all_points_within_tolerance and r.bep.within_tolerance
        table.add_row(
            r.kernel,
            r.condition,
            f"{r.sd_tx_measured:.2f}",
            f"{r.sd_comp_measured:.2f}",
            f"{100 * r.max_abs_error['ssd']:.1f}%",
            f"{100 * r.max_abs_error['csd']:.1f}%",
            f"{r.bep.predicted} ({r.bep.predicted_value:.2f})",
            f"{r.bep.eq8}/{r.bep.eq13}",
            str(r.bep.measured),
            "yes" if within else "NO",
        )
    console.print(table)


# ---- main -------------------------------------------------------------------------------------


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kernels", default=",".join(SETUPS), help="comma-separated, of " + ", ".join(SETUPS)
    )
    parser.add_argument("--devices-max", type=int, default=16, help="drives, 1..N")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per point (median)")
    parser.add_argument("--k-limit", type=int, default=4, help="drives the host bus carries")
    parser.add_argument(
        "--conditions",
        default="normal,cpu,io",
        help="host conditions, of " + ", ".join(CONDITIONS) + " (normal always runs first)",
    )
    parser.add_argument(
        "--mib",
        type=int,
        default=None,
        help="working set of every kernel run, MiB (default: each kernel's own)",
    )
    parser.add_argument(
        "--name", default=NAME, help="results under bench/results/NAME.json and .png"
    )
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="also predict Count's BEP from quarry calibrate alone (0.5-3 minutes more)",
    )
    arguments = parser.parse_args()
    arguments.kernels = [k.strip() for k in arguments.kernels.split(",") if k.strip()]
    names = [c.strip() for c in arguments.conditions.split(",") if c.strip()]
    arguments.conditions = [CONDITIONS["normal"]] + [CONDITIONS[n] for n in names if n != "normal"]
    assert all(k in SETUPS and k in KERNELS for k in arguments.kernels), arguments.kernels
    assert all(n in CONDITIONS for n in names), names
    assert 1 <= arguments.rounds <= 50 and 1 <= arguments.devices_max <= 64
    assert arguments.k_limit >= 1
    return arguments


def main() -> None:
    arguments = parse_arguments()
    started = time.perf_counter()
    devices = list(range(1, arguments.devices_max + 1))
    conditions: list[Condition] = arguments.conditions
    toml = profiles_toml(arguments.k_limit, conditions)
    collected: list[Collected] = []
    calibration: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="quarry-capacity-") as scratch:
        profiles = Path(scratch) / "profiles.toml"
        profiles.write_text(toml)
        for condition in conditions:
            console.print(
                f"[bold]{condition.name}[/]: {condition.description}; {len(devices)} "
                f"'{condition.drive_profile}' drives, host '{condition.host_profile}'"
            )
            with quarry.local(
                devices=len(devices),
                profile=condition.drive_profile,
                profiles_file=str(profiles),
                host_profile=condition.host_profile,
                data=Path(scratch) / "data",  # kept between conditions: stored once
            ) as cluster:
                for kernel in arguments.kernels:
                    setup = SETUPS[kernel]
                    if arguments.mib is not None:
                        setup = replace(setup, mib=arguments.mib)
                    collected.append(collect(cluster, setup, condition, devices, arguments.rounds))
                if arguments.calibration and condition.name == "normal":
                    host = HostConfig(host_cores=1, k_limit=arguments.k_limit)
                    calibration = calibration_bep(cluster, SETUPS["count"], host)
    normal = {c.kernel: c.inputs for c in collected if c.condition.name == "normal"}
    results = [analyse(c, normal[c.kernel], arguments.k_limit) for c in collected]
    payload: dict[str, Any] = {
        "kernels": {
            k: {**asdict(SETUPS[k]), **({"mib": arguments.mib} if arguments.mib else {})}
            for k in arguments.kernels
        },
        "conditions": [asdict(c) for c in conditions],
        "profiles_toml": toml,
        "devices_max": arguments.devices_max,
        "rounds": arguments.rounds,
        "k_limit": arguments.k_limit,
        "fixed": "total working set per kernel, split evenly over the m drives (Figure 7)",
        "results": [asdict(r) for r in results],
        "all_within_tolerance": all(
            r.all_points_within_tolerance and r.bep.within_tolerance for r in results
        ),
        "calibration": calibration,
        "elapsed_s": time.perf_counter() - started,
    }
    draw(png_path(arguments.name), results, arguments.kernels)
    path = write_json(arguments.name, payload)
    for kernel in arguments.kernels:
        report_kernel(kernel, [r for r in results if r.kernel == kernel])
    report_summary(results)
    if calibration is not None:
        console.print(f"Count's BEP from quarry calibrate alone: {calibration['bep']}")
    console.print(
        f"all within tolerance: {payload['all_within_tolerance']}; wrote {path} and "
        f"{png_path(arguments.name)} in {payload['elapsed_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
