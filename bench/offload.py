"""ActivePy §V on quarry: plain Python programs offloaded, against host-only and every cut.

    python bench/offload.py [--scale 1] [--devices 4] [--profiles newport,activepy]
                            [--workloads tpch_q6,...] [--repeat 1]

For each drive profile (``newport``; ``activepy``, the paper's CSD: 8 cores about 3.5x slower,
9 GB/s to flash, 5 GB/s NVMe) a local cluster holds the workloads' inputs
(``quarry.samples.workloads``, Table I as plain Python). For each workload, in one run:

- **Figure 4**: host-only (every line here, the stored data over the links), the cut Algorithm 1
  chooses (``auto``), and every contiguous cut (a stored read and the lines after it, up to
  each line that may move) tried exhaustively: the auto cut's time beside the best, the speedup
  over host-only, and the bytes each moved;
- **the model**: each line's predicted host time and output bytes (fitted on the samples)
  beside what a profiled full-scale run measured; each cut's predicted time beside its
  measured time;
- **Figure 5**: the device part run again while the devices' CPU is loaded to 50% and to 90%
  (``quarry device load``) from halfway through it, with migration (each device's controller
  hands the rest back when the host would finish sooner) and without (``--migrate never``):
  the loss against host-only.

Every run's printed output is checked against the program's plain run. Results go to
``bench/results/offload.json`` and ``offload.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

import quarry
from quarry.offload import profile as line_profile
from quarry.offload.assign import time_of
from quarry.offload.program import Program
from quarry.offload.reads import Mounts, Reads
from quarry.offload.run import plan, run
from quarry.samples import workloads

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# slices of 1 MiB: enough of them per partition for a device to judge its rate and migrate
PROFILES_TOML = """
[profiles.newport]
from = "newport"
kv_bytes_max = 1048576

[profiles.activepy]
from = "activepy"
kv_bytes_max = 1048576
"""
LOADS = (0.5, 0.9)  # the devices' CPU taken by other work: 50% and 10% available
LINE_S_MIN = 0.005  # lines faster than this are left out of the model's error
CSR_LINE = "order = np.argsort"  # PageRank's CSR build, the paper's outlier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--profiles", default="newport,activepy")
    parser.add_argument("--workloads", default=",".join(sorted(workloads.PROGRAMS)))
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement (the least)")
    args = parser.parse_args()
    console = Console()
    names = args.workloads.split(",")
    results: dict[str, Any] = {"scale": args.scale, "devices": args.devices, "profiles": {}}
    with tempfile.TemporaryDirectory(prefix="quarry-offload-") as folder:
        console.print(f"writing the workloads' inputs at scale {args.scale} ...")
        paths = workloads.write(folder, args.scale)
        results["inputs"] = {stem: path.stat().st_size for stem, path in paths.items()}
        profiles_file = Path(folder) / "profiles.toml"
        profiles_file.write_text(PROFILES_TOML)
        for profile in args.profiles.split(","):
            with quarry.local(
                devices=args.devices, profile=profile, profiles_file=str(profiles_file)
            ) as cluster:
                for stem, path in paths.items():
                    cluster.ingest(str(path), f"workloads/{stem}", partitions=args.devices)
                results["profiles"][profile] = bench_profile(
                    cluster, folder, names, args.repeat, console, profile
                )
    summarise(results)
    path = write_json("offload", results)
    plot(results)
    console.print(f"wrote {path} and {png_path('offload')}")


def bench_profile(
    cluster: Any, folder: str, names: list[str], repeat: int, console: Console, profile: str
) -> dict[str, Any]:
    found = {}
    with progress(console) as bar:
        task = bar.add_task(f"{profile}: workloads", total=len(names))
        for name in names:
            found[name] = bench_workload(cluster, folder, name, repeat)
            bar.advance(task)
            row = found[name]
            console.print(
                f"  {name:13s} host {row['host_s']:.2f} s, auto {row['auto']['s']:.2f} s, "
                f"best {row['best']['s']:.2f} s ({row['best']['cut']}), "
                f"auto/best {row['auto_over_best']:.3f}"
            )
    return found


def timed(script: Path, cluster: Any, argv: list[str], expected: str, repeat: int, **options):
    """The least wall time of ``repeat`` runs, the last run's report; the output checked."""
    best, report = math.inf, []
    for _ in range(repeat):
        out, report = io.StringIO(), []
        started = time.perf_counter()
        with contextlib.redirect_stdout(out):
            run(script, cluster, argv, report=report, **options)
        best = min(best, time.perf_counter() - started)
        assert out.getvalue() == expected, (script.name, options, out.getvalue()[:300])
    return best, report


def moved(report: list[Any]) -> dict[str, Any]:
    return {
        "bytes_read": sum(p.bytes_read for p in report),
        "bytes_shipped": sum(p.bytes_shipped for p in report),
        "device_part_s": sum(p.wall_s for p in report),
        "lines": [list(p.lines) for p in report],
        "migrations": [
            {"device": m.device, "slices": m.slices, "of": m.slices_total, "at_s": m.at_s}
            for p in report
            for m in p.migrations
        ],
    }


def bench_workload(cluster: Any, folder: str, name: str, repeat: int) -> dict[str, Any]:
    script, argv = workloads.script(name), workloads.argv(name, folder)
    plain = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr
    started = time.perf_counter()
    planned = plan(script, cluster, argv)
    sampling_s = time.perf_counter() - started
    link = planned.devices.link_bytes_per_s
    host_s, _ = timed(script, cluster, argv, plain.stdout, repeat, offload="host")
    auto_s, auto_report = timed(script, cluster, argv, plain.stdout, repeat, planned=planned)
    cuts = [{"cut": "host", "s": host_s, "predicted_s": planned.cut.host_s, "lines": []}]
    for lines in contiguous_cuts(planned):
        seconds, report = timed(
            script, cluster, argv, plain.stdout, repeat, planned=planned, device_lines=lines
        )
        cuts.append(
            {
                "cut": f"{min(lines)}-{max(lines)}",
                "s": seconds,
                "predicted_s": time_of(planned.lines, set(lines), link),
                "lines": sorted(lines),
                **moved(report),
            }
        )
    best = min(cuts, key=lambda c: c["s"])
    return {
        "sampling_s": sampling_s,
        "host_s": host_s,
        "auto": {
            "s": auto_s,
            "predicted_s": planned.cut.csd_s,
            "lines": sorted(planned.cut.device_lines),
            **moved(auto_report),
        },
        "cuts": cuts,
        "best": {"cut": best["cut"], "s": best["s"]},
        "auto_over_best": auto_s / best["s"],
        "speedup": host_s / auto_s,
        "model": model_errors(cluster, script, argv, planned),
        "migration": migration(cluster, script, argv, plain.stdout, planned, host_s, auto_report),
    }


def contiguous_cuts(planned: Any) -> list[list[int]]:
    """Every run of lines that starts at a stored read and may move, to each of its ends."""
    lines = planned.lines
    reads = {r.line for r in planned.check.reads}
    found = []
    for first, line in enumerate(lines):
        if line.number not in reads or not line.movable:
            continue
        end = first
        while (
            end < len(lines)
            and lines[end].movable
            and (end == first or lines[end].number not in reads)
        ):
            found.append([lines[i].number for i in range(first, end + 1)])
            end += 1
    return found


def model_errors(cluster: Any, script: Path, argv: list[str], planned: Any) -> dict[str, Any]:
    """Each line's predicted host time and output bytes beside a full-scale profiled run."""
    program = Program.read(script)
    measured = line_profile.run(program, Reads(cluster, Mounts.of(cluster)), argv, quiet=True).lines
    rows = []
    for estimate, actual in zip(planned.lines, measured):
        rows.append(
            {
                "line": estimate.number,
                "text": " ".join(estimate.text.split())[:60],
                "time": estimate.time_fit.curve,
                "predicted_s": estimate.host_s,
                "measured_s": actual.compute_s,
                "predicted_bytes": estimate.out_bytes,
                "measured_bytes": actual.out_bytes,
            }
        )

    def error(predicted: float, measured: float) -> float:
        return abs(predicted - measured) / measured

    timed_rows = [r for r in rows if r["measured_s"] >= LINE_S_MIN]
    sized_rows = [r for r in rows if r["measured_bytes"] >= 1024]
    usual = [r for r in timed_rows if not r["text"].startswith(CSR_LINE)]
    return {
        "lines": rows,
        "time_error_geomean": geomean([error(r["predicted_s"], r["measured_s"]) for r in usual]),
        "bytes_error_geomean": geomean(
            [error(r["predicted_bytes"], r["measured_bytes"]) for r in sized_rows]
        ),
    }


def geomean(values: list[float]) -> float | None:
    values = [max(v, 1e-4) for v in values]
    return float(math.exp(sum(math.log(v) for v in values) / len(values))) if values else None


def migration(
    cluster: Any,
    script: Path,
    argv: list[str],
    expected: str,
    planned: Any,
    host_s: float,
    auto_report: list[Any],
) -> dict[str, Any]:
    """The device part under load from halfway, with and without migration."""
    device_s = sum(p.wall_s for p in auto_report)
    if not auto_report or device_s <= 0:
        return {"note": "no lines ran on the devices"}
    found: dict[str, Any] = {}
    for fraction in LOADS:
        for mode in ("auto", "never"):
            timer = threading.Timer(device_s / 2, load_all, args=(cluster, fraction))
            timer.start()
            try:
                seconds, report = timed(
                    script, cluster, argv, expected, 1, planned=planned, migrate=mode
                )
            finally:
                timer.cancel()
                load_all(cluster, 0.0)
            found[f"{round((1 - fraction) * 100)}%_{'with' if mode == 'auto' else 'without'}"] = {
                "s": seconds,
                "loss_vs_host": seconds / host_s - 1.0,
                **moved(report),
            }
    return found


def load_all(cluster: Any, fraction: float) -> None:
    for device in cluster.info:
        cluster.load(device, fraction, seconds=600 if fraction else 0.01)


def summarise(results: dict[str, Any]) -> None:
    for profile, rows in results["profiles"].items():
        speedups = [r["speedup"] for r in rows.values()]
        ratios = [r["auto_over_best"] for r in rows.values()]
        same = [same_cut(r) for r in rows.values()]
        errors = [
            r["model"]["time_error_geomean"]
            for r in rows.values()
            if r["model"]["time_error_geomean"]
        ]
        summary: dict[str, Any] = {
            "speedup_geomean": geomean(speedups),
            "auto_over_best_max": max(ratios),
            "within_5_percent": sum(r <= 1.05 for r in ratios),
            # the auto cut is the best one itself (its time then differs only by run-to-run noise)
            "same_cut_as_best": sum(same),
            "same_cut_or_within_5_percent": sum(s or r <= 1.05 for s, r in zip(same, ratios)),
            "workloads": len(ratios),
            "time_error_geomean": geomean(errors),
        }
        for key in ("50%_with", "50%_without", "10%_with", "10%_without"):
            losses = [
                r["migration"][key]["loss_vs_host"] for r in rows.values() if key in r["migration"]
            ]
            summary[f"loss_{key}_mean"] = float(np.mean(losses)) if losses else None
        results.setdefault("summary", {})[profile] = summary


def same_cut(row: dict[str, Any]) -> bool:
    """Auto chose the exhaustive best's lines (host-only: none)."""
    best = next(c for c in row["cuts"] if c["cut"] == row["best"]["cut"])
    return sorted(best["lines"]) == sorted(row["auto"]["lines"])


def plot(results: dict[str, Any]) -> None:
    profiles = list(results["profiles"])
    figure, axes = plt.subplots(2, len(profiles), figsize=(7 * len(profiles), 9), squeeze=False)
    for column, profile in enumerate(profiles):
        rows = results["profiles"][profile]
        names = list(rows)
        x = np.arange(len(names))
        ax = axes[0][column]
        ax.bar(x - 0.2, [1.0] * len(names), 0.2, label="host-only")
        ax.bar(x, [r["speedup"] for r in rows.values()], 0.2, label="auto (Algorithm 1)")
        ax.bar(
            x + 0.2,
            [r["host_s"] / r["best"]["s"] for r in rows.values()],
            0.2,
            label="best cut (exhaustive)",
        )
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel("speedup over host-only")
        ax.set_title(f"Figure 4 — {profile}")
        ax.legend(fontsize=8)
        ax = axes[1][column]
        keys = ("50%_with", "50%_without", "10%_with", "10%_without")
        for offset, key in zip((-0.3, -0.1, 0.1, 0.3), keys):
            heights = [
                1.0 / (1.0 + r["migration"][key]["loss_vs_host"]) if key in r["migration"] else 0
                for r in rows.values()
            ]
            ax.bar(
                x + offset,
                heights,
                0.2,
                label=key.replace("_", " migration, ").replace("%", "% available"),
            )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel("speedup over host-only")
        ax.set_title(f"Figure 5 — {profile}: device CPU loaded from halfway")
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(png_path("offload"), dpi=110)


if __name__ == "__main__":
    main()
