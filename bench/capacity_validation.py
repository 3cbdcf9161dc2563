"""CSDPLAN validated on our own cluster: Count on 1..8 emulated drives vs the host-only path.

Run: python bench/capacity_validation.py [--rounds 5] [--mib 256] [--k-limit 2] [--skip-calibration]

1. Step 1 (CSDPLAN §3.2): on one drive, measure T_SSD-tx, T_SSD-comp (one host core), T_CSD-tx
   and T_CSD-comp of Count (``quarry.capacity.measure.measure_kernel``): 3 runs of each system
   before the sweep, then one more of each in every round; the inputs are the medians of all.
2. Predict with the model (Eq. 5-7, ``break_even``): throughput of the SSD array (the host reads
   raw from m drives, then counts on one core) and of the CSD array (m drives count their share),
   for m = 1..8, and the break-even point.
3. Measure the same 16 configurations on the live cluster, in rounds (each round visits every m,
   alternating the order of the two systems), and take medians: other work on this machine moves
   single runs, and a round-robin spreads its effect over all points instead of one.
4. Compare: throughput within 15% at every point; measured BEP within 1 drive of the predicted.
   Optionally (default on) also predict from ``quarry calibrate``'s numbers alone.

Working set: the *total* is fixed (``--mib``, default 256 MiB of int32) and split evenly over the m
drives, as in the paper's Figure 7 (one 4.8 GB Count working set, throughput against the number
of devices) and as Eq. 5 and 7 assume (one working set whose times divide by m).

The drive: a user-defined profile (written to a temporary TOML file) derived from ``kinetic``:
its HDD-class links, but an internal read of 100 MB/s, one core and a 60x compute factor (a
Cortex-R-class controller, like the Smart SSD prototype of the paper's Table 1). Why not kinetic
itself: Count runs at ~6 GB/s on one host core, so with kinetic's figures a drive loses to the host
by only a few percent of a tiny computation time and the BEP swings by several drives with noise
(Eq. 8's denominator is T_SSD-comp). The slower controller makes one drive clearly slower than the
host path (the paper's situation with Newport), so the curves cross at a readable point.

The host bus: a real host saturates its PCIe root complex at k_limit SSDs (Eq. 6). On this
machine the host-only path has no crisp limit (loopback and CPU, shared with anything else
running), so the host's reads pass an emulated bus (``HostBus``) that carries exactly k_limit
drives' raw reads: k_limit x the one-drive read rate of step 1's first runs, as the paper's
32 GB/s bus over 4 GB/s SSDs gives k_limit = 8.

Writes bench/results/capacity_validation.json and .png. A benchmark measures and reports: the
"within" flags say whether the acceptance bounds held on this run; it does not fail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

import quarry
from quarry.capacity.break_even import break_even
from quarry.capacity.measure import (
    HostBus,
    KernelRun,
    Measurement,
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
from quarry.capacity.model import (
    CapacityInputs,
    HostConfig,
    t_csd_array_s,
    t_ssd_array_s,
)
from quarry.coordinator.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

NAME = "capacity_validation"
KERNEL = "count"
PROFILE = "r4drive"
PROFILE_TOML = """\
[profiles.r4drive]
from = "kinetic"                 # 1 MiB key-values, 2.5 GbE link (312.5 MB/s), 1 GiB memory
internal_bytes_per_s = 1.0e8     # reads its medium at 100 MB/s
cores = 1
compute_factor = 60.0            # a Cortex-R-class controller against one host core
"""
DEVICES_MAX = 8
STEP1_REPEAT = 3  # before the sweep; one more pair per round
THROUGHPUT_TOLERANCE = 0.15
BEP_TOLERANCE_DEVICES = 1
console = Console()


def predicted_times_s(inputs: CapacityInputs, host: HostConfig, m: int) -> dict[str, float]:
    return {"ssd": t_ssd_array_s(inputs, host, m), "csd": t_csd_array_s(inputs, m)}


def measured_bep(ssd: dict[int, float], csd: dict[int, float]) -> int | None:
    """The least m whose CSD throughput is at least the SSD array's (None: not within range)."""
    return next((m for m in sorted(ssd) if csd[m] >= ssd[m]), None)


def run_sweep(
    step1: tuple[Cluster, str],
    points: dict[int, tuple[Cluster, str]],
    rounds: int,
    bus: HostBus,
) -> tuple[dict[str, list[KernelRun]], dict[str, dict[int, list[KernelRun]]]]:
    """``rounds`` rounds; each measures step 1 once more, then every point with both systems."""
    step1_runs: dict[str, list[KernelRun]] = {"ssd": [], "csd": []}
    runs: dict[str, dict[int, list[KernelRun]]] = {"ssd": {}, "csd": {}}
    with progress(console) as bars:
        warm = bars.add_task("warm-up (one untimed run per point)", total=len(points))
        for cluster, dataset in points.values():
            run_host(cluster, dataset, KERNEL, host_bus=bus)
            run_devices(cluster, dataset, KERNEL)
            bars.advance(warm)
        task = bars.add_task("rounds", total=rounds * (len(points) + 1) * 2)
        for number in range(rounds):
            bars.update(task, description=f"round {number + 1}/{rounds}: step 1")
            cluster, dataset = step1
            # No bus for step 1: one drive never fills it, and step 1 is the bare SSD system.
            step1_runs["ssd"].append(run_host(cluster, dataset, KERNEL))
            step1_runs["csd"].append(run_devices(cluster, dataset, KERNEL))
            bars.advance(task, 2)
            for m, (cluster, dataset) in points.items():
                systems = ("ssd", "csd") if (number + m) % 2 == 0 else ("csd", "ssd")
                for system in systems:
                    bars.update(task, description=f"round {number + 1}/{rounds}: {system}, m={m}")
                    run = (
                        run_host(cluster, dataset, KERNEL, host_bus=bus)
                        if system == "ssd"
                        else run_devices(cluster, dataset, KERNEL)
                    )
                    runs[system].setdefault(m, []).append(run)
                    bars.advance(task)
    return step1_runs, runs


def calibration_prediction(
    cluster: Cluster, data_bytes: int, host: HostConfig, k_limit: int
) -> dict[str, Any]:
    single = single_device(cluster, "dev0")
    try:
        started = time.perf_counter()
        with console.status("quarry calibrate on dev0 (its compute factor takes a while)"):
            reports = single.calibrate()
        calibrate_s = time.perf_counter() - started
    finally:
        single.close()
    report = calibration_report(reports)
    inputs = calibration_inputs(
        report,
        data_bytes=data_bytes,
        host_compute_s=host_compute_s(KERNEL, data_bytes, 1),
        name=f"{KERNEL}-{PROFILE}-calibrated",
    )
    return {
        "report": reports[0],
        "inputs": inputs.to_dict(),
        "calibrate_s": calibrate_s,
        "bep": break_even(inputs, host).bep,
        "k_limit": k_limit,
        "model": inputs,
    }


def draw(path: Path, devices: list[int], result: dict[str, Any]) -> None:
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]}
    )
    colors = {"ssd": "tab:blue", "csd": "tab:red"}
    labels = {
        "ssd": f"Host(1) + m drives, host bus = {result['k_limit']} drives (SSD array)",
        "csd": "m computational drives (CSD array)",
    }
    points = result["points"]
    for system in ("ssd", "csd"):
        predicted = [points[str(m)][system]["predicted_mb_per_s"] for m in devices]
        measured = [points[str(m)][system]["measured_mb_per_s"] for m in devices]
        low = [points[str(m)][system]["measured_mb_per_s_min"] for m in devices]
        high = [points[str(m)][system]["measured_mb_per_s_max"] for m in devices]
        left.plot(devices, predicted, "--", color=colors[system], label=f"model: {labels[system]}")
        left.plot(
            devices,
            measured,
            "o",
            color=colors[system],
            label=f"measured (median of {result['rounds']}; bar: min-max)",
        )
        left.vlines(devices, low, high, color=colors[system], alpha=0.5)
        if result.get("calibration"):
            from_calibration = [points[str(m)][system]["calibration_mb_per_s"] for m in devices]
            left.plot(
                devices,
                from_calibration,
                ":",
                color=colors[system],
                alpha=0.6,
                label="model from quarry calibrate alone",
            )
    bep_predicted, bep_measured = result["bep"]["predicted"], result["bep"]["measured"]
    left.axvline(bep_predicted, color="gray", linestyle="--", alpha=0.6)
    left.annotate(
        f"BEP: predicted {bep_predicted}, measured {bep_measured}",
        (bep_predicted, left.get_ylim()[1] * 0.95),
        xytext=(6, 0),
        textcoords="offset points",
        fontsize=9,
    )
    left.set_xlabel("drives m (the working set split evenly over them)")
    left.set_ylabel(f"throughput (MB/s) on the {result['working_set_mib']} MiB working set")
    left.set_title(f"Count on '{PROFILE}' drives: model (Eq. 5-7) vs measured")
    left.set_xticks(devices)
    left.grid(alpha=0.3)
    left.legend(fontsize=7.5, loc="lower right")
    width = 0.38
    for offset, system in ((-width / 2, "ssd"), (width / 2, "csd")):
        errors = [100 * points[str(m)][system]["error"] for m in devices]
        right.bar(
            [m + offset for m in devices],
            errors,
            width,
            color=colors[system],
            label=system.upper() + " array",
        )
    bound = 100 * THROUGHPUT_TOLERANCE
    right.axhspan(-bound, bound, color="green", alpha=0.08, label=f"within ±{bound:.0f}%")
    right.axhline(0, color="black", linewidth=0.8)
    right.set_xlabel("drives m")
    right.set_ylabel("measured vs predicted throughput (%)")
    right.set_title("error at every point")
    right.set_xticks(devices)
    right.set_ylim(-2 * bound, 2 * bound)
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def summarize(runs: list[KernelRun]) -> dict[str, Any]:
    totals = [r.total_s for r in runs]
    return {
        "total_s_median": statistics.median(totals),
        "total_s": totals,
        "transfer_s_median": statistics.median(r.transfer_s for r in runs),
        "compute_s_median": statistics.median(r.compute_s for r in runs),
        "bytes_to_host_median": statistics.median(r.bytes_to_host for r in runs),
    }


def collect(
    cluster: Cluster, data_bytes: int, arguments: argparse.Namespace, devices: list[int]
) -> dict[str, Any]:
    """Step 1, the sweep, and (optionally) calibration, on a running cluster.

    Step 1 starts before the sweep (its first runs size the host bus) and goes on inside it, one
    pair of runs per round: on a machine shared with other work the load drifts over minutes,
    and the prediction should see the same drift as the measurements it is compared with.
    """
    with progress(console) as bars:
        task = bars.add_task(
            f"step 1: {KERNEL} on one drive, host and drive", total=2 * STEP1_REPEAT
        )
        first = measure_kernel(
            cluster,
            KERNEL,
            data_bytes,
            device="dev0",
            repeat=STEP1_REPEAT,
            on_run=lambda _: bars.advance(task),
        )
    read_rate_bytes_per_s = first.inputs.data_bytes / first.inputs.t_ssd_tx_s
    bus = HostBus(arguments.k_limit * read_rate_bytes_per_s)
    host = HostConfig(host_cores=1, k_limit=arguments.k_limit)
    single = single_device(cluster, "dev0")
    # The same working set on the first m drives, for every m.
    points: dict[int, tuple[Cluster, str]] = {}
    try:
        with progress(console) as bars:
            task = bars.add_task("storing the working set on 1..8 drives", total=len(devices))
            for m in devices:
                sub = Cluster(cluster.spec[:m])
                points[m] = (sub, "")
                entry = ingest_kernel_inputs(
                    sub, KERNEL, data_bytes, dataset_name(KERNEL, data_bytes, f"m{m}")
                )
                assert len(entry.partitions_by_device()) == m, entry.partitions_by_device()
                points[m] = (sub, entry.qualified)
                bars.advance(task)
        step1_dataset = dataset_name(KERNEL, data_bytes, "dev0")
        step1_runs, runs = run_sweep((single, step1_dataset), points, arguments.rounds, bus)
    finally:
        single.close()
        for sub, _ in points.values():
            sub.close()
    host_runs = first.host_runs + step1_runs["ssd"]
    device_runs = first.device_runs + step1_runs["csd"]
    measurement = Measurement(
        inputs_from_runs(host_runs, device_runs, first.inputs.name),
        first.device,
        first.profile,
        first.device_threads,
        host_runs,
        device_runs,
    )
    calibration = (
        None
        if arguments.skip_calibration
        else calibration_prediction(cluster, measurement.inputs.data_bytes, host, arguments.k_limit)
    )
    return {
        "measurement": measurement,
        "first_inputs": first.inputs,
        "runs": runs,
        "calibration": calibration,
        "bus": bus,
        "host": host,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="measurements per point (median)")
    parser.add_argument("--mib", type=int, default=256, help="working set, MiB (total, fixed)")
    parser.add_argument("--k-limit", type=int, default=2, help="drives the host bus carries")
    parser.add_argument(
        "--skip-calibration",
        action="store_true",
        help="skip the prediction from quarry calibrate (saves 0.5-3 minutes)",
    )
    arguments = parser.parse_args()
    assert 1 <= arguments.rounds <= 50 and 1 <= arguments.mib <= 4096 and arguments.k_limit >= 1
    data_bytes = arguments.mib << 20
    started = time.perf_counter()
    devices = list(range(1, DEVICES_MAX + 1))

    with tempfile.TemporaryDirectory(prefix="quarry-capacity-") as scratch:
        profiles = Path(scratch) / "profiles.toml"
        profiles.write_text(PROFILE_TOML)
        console.print(f"starting {DEVICES_MAX} '{PROFILE}' devices")
        with quarry.local(
            devices=DEVICES_MAX, profile=PROFILE, profiles_file=str(profiles)
        ) as cluster:
            collected = collect(cluster, data_bytes, arguments, devices)
    measurement, runs = collected["measurement"], collected["runs"]
    calibration = collected["calibration"]
    bus, host = collected["bus"], collected["host"]
    inputs = measurement.inputs
    k_limit = arguments.k_limit
    predicted = break_even(inputs, host)

    result: dict[str, Any] = {
        "kernel": KERNEL,
        "profile": PROFILE,
        "profile_toml": PROFILE_TOML,
        "working_set_mib": arguments.mib,
        "working_set_bytes": inputs.data_bytes,
        "fixed": "total working set, split evenly over the m drives (CSDPLAN Figure 7)",
        "rounds": arguments.rounds,
        "k_limit": k_limit,
        "host_bus_bytes_per_s": bus.bytes_per_s,
        "host": host.to_dict(),
        "step1": measurement.to_dict(),
        "inputs": inputs.to_dict(),
        "inputs_before_the_sweep": collected["first_inputs"].to_dict(),
        "model_break_even": predicted.to_dict(),
        "points": {},
    }
    medians: dict[str, dict[int, float]] = {"ssd": {}, "csd": {}}
    for m in devices:
        entry: dict[str, Any] = {}
        times = predicted_times_s(inputs, host, m)
        from_calibration = predicted_times_s(calibration["model"], host, m) if calibration else None
        for system in ("ssd", "csd"):
            summary = summarize(runs[system][m])
            measured_s = summary["total_s_median"]
            medians[system][m] = inputs.data_bytes / measured_s
            predicted_mb_per_s = inputs.data_bytes / times[system] / 1e6
            measured_mb_per_s = inputs.data_bytes / measured_s / 1e6
            entry[system] = {
                **summary,
                "predicted_s": times[system],
                "predicted_mb_per_s": predicted_mb_per_s,
                "measured_mb_per_s": measured_mb_per_s,
                "measured_mb_per_s_min": inputs.data_bytes / max(summary["total_s"]) / 1e6,
                "measured_mb_per_s_max": inputs.data_bytes / min(summary["total_s"]) / 1e6,
                "error": measured_mb_per_s / predicted_mb_per_s - 1,
                "within_tolerance": abs(measured_mb_per_s / predicted_mb_per_s - 1)
                <= THROUGHPUT_TOLERANCE,
            }
            if from_calibration is not None:
                entry[system]["calibration_mb_per_s"] = (
                    inputs.data_bytes / from_calibration[system] / 1e6
                )
        result["points"][str(m)] = entry
    bep_measured = measured_bep(medians["ssd"], medians["csd"])
    result["bep"] = {
        "predicted": predicted.bep,
        "predicted_value": predicted.capped_value or predicted.eq8_value,
        "eq8": predicted.bep_eq8,
        "measured": bep_measured,
        "within_tolerance": bep_measured is not None
        and abs(bep_measured - predicted.bep) <= BEP_TOLERANCE_DEVICES,
    }
    if calibration is not None:
        calibration.pop("model")
        result["calibration"] = calibration
    result["all_points_within_tolerance"] = all(
        result["points"][str(m)][s]["within_tolerance"] for m in devices for s in ("ssd", "csd")
    )
    result["elapsed_s"] = time.perf_counter() - started
    draw(png_path(NAME), devices, result)
    path = write_json(NAME, result)
    report(result, devices, path)


def report(result: dict[str, Any], devices: list[int], path: Path) -> None:
    inputs = result["inputs"]
    console.print(
        f"step 1 on one '{PROFILE}' drive, {inputs['data_bytes'] / 2**20:.0f} MiB: "
        f"T_SSD-tx {inputs['t_ssd_tx_s']:.3f} s, T_SSD-comp {inputs['t_ssd_comp_s']:.3f} s, "
        f"T_CSD-tx {inputs['t_csd_tx_s']:.3f} s, T_CSD-comp {inputs['t_csd_comp_s']:.3f} s; "
        f"host bus {result['host_bus_bytes_per_s'] / 1e6:.0f} MB/s (k_limit {result['k_limit']})"
    )
    table = Table(title="Count: throughput MB/s, model vs measured (median)")
    for column in ("m", "SSD model", "SSD measured", "error", "CSD model", "CSD measured", "error"):
        table.add_column(column, justify="right")
    for m in devices:
        point = result["points"][str(m)]
        cells = [str(m)]
        for system in ("ssd", "csd"):
            value = point[system]
            mark = "" if value["within_tolerance"] else " !"
            cells += [
                f"{value['predicted_mb_per_s']:.1f}",
                f"{value['measured_mb_per_s']:.1f}",
                f"{100 * value['error']:+.1f}%{mark}",
            ]
        table.add_row(*cells)
    console.print(table)
    bep = result["bep"]
    console.print(
        f"BEP: predicted {bep['predicted']} (value {bep['predicted_value']:.2f}, "
        f"Eq. 8 alone {bep['eq8']}), measured {bep['measured']}; "
        f"all points within 15%: {result['all_points_within_tolerance']}"
    )
    if "calibration" in result:
        console.print(
            f"from quarry calibrate alone: BEP {result['calibration']['bep']} "
            f"(calibrate took {result['calibration']['calibrate_s']:.0f} s)"
        )
    console.print(f"wrote {path} and {png_path(NAME)} in {result['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
