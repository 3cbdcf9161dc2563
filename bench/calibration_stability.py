"""Calibration on a busy machine: back-to-back calibrations of a Kinetic cluster, the first right
after a heavy job, every figure against its profile.

    python bench/calibration_stability.py [--runs 20] [--devices 2] [--heavy-s 20]

The heavy job: one process per core sorting and multiplying large arrays for ``--heavy-s``
seconds (caches, memory bus and clocks all disturbed), ended just before the first calibration.
Each calibration measures every device's compute factor, internal read and external link
(``quarry calibrate``); a figure that does not settle is measured again (``Measured.attempts``)
or reported unsettled. Reported: each figure over its profile's, how many landed within 10%, how
many needed another attempt, how many never settled. Writes
``bench/results/calibration_stability.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from rich.console import Console

import quarry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

matplotlib.use("Agg")
NAME = "calibration_stability"
FIGURES = ("compute_factor", "internal_bytes_per_s", "external_bytes_per_s")
TOLERANCE = 0.10
console = Console()


def heavy(seconds: float) -> None:
    """Sorts and products of arrays far larger than the caches, until ``seconds`` pass."""
    generator = np.random.default_rng(0)
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        values = generator.random(4_000_000)
        values.sort()
        matrix = generator.random((600, 600))
        matrix @ matrix


def heavy_job(seconds: float) -> None:
    workers = [
        multiprocessing.Process(target=heavy, args=(seconds,))
        for _ in range(multiprocessing.cpu_count())
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--profile", default="kinetic")
    parser.add_argument("--heavy-s", type=float, default=20.0)
    args = parser.parse_args()

    entries: list[dict[str, Any]] = []
    with quarry.local(devices=args.devices, profile=args.profile) as cluster:
        console.print(f"heavy job: {multiprocessing.cpu_count()} processes for {args.heavy_s} s")
        heavy_job(args.heavy_s)
        with progress(console) as bars:
            task = bars.add_task("back-to-back calibrations", total=args.runs)
            for run in range(args.runs):
                started = time.perf_counter()
                reports = [r.to_json() for r in cluster.calibrate()]
                seconds = time.perf_counter() - started
                for report in reports:
                    for figure in FIGURES:
                        entry = report[figure]
                        entries.append(
                            {
                                "run": run,
                                "device": report["device"],
                                "figure": figure,
                                "expected": entry["expected"],
                                "measured": entry["measured"],
                                "ratio": entry["measured"] / entry["expected"],
                                "within": abs(entry["measured"] / entry["expected"] - 1)
                                <= TOLERANCE,
                                "settled": entry.get("settled", True),
                                "attempts": entry.get("attempts", 1),
                                "seconds": seconds,
                            }
                        )
                bars.advance(task)
    summary = summarise(entries)
    path = write_json(NAME, {**vars(args), "summary": summary, "figures": entries})
    plot(entries, args)
    console.print(summary)
    console.print(f"wrote {path} and {png_path(NAME)}")


def summarise(entries: list[dict[str, Any]]) -> dict[str, Any]:
    settled = [e for e in entries if e["settled"]]
    worst = max(entries, key=lambda e: abs(e["ratio"] - 1))
    return {
        "figures": len(entries),
        "within_10_percent": sum(e["within"] for e in entries),
        "settled": len(settled),
        "settled_and_within": sum(e["within"] for e in settled),
        "settled_but_off": [e for e in settled if not e["within"]],
        "measured_again": sum(e["attempts"] > 1 for e in entries),
        "unsettled": [e for e in entries if not e["settled"]],
        "worst": worst,
        "first_run_worst_ratio": max(
            (abs(e["ratio"] - 1) for e in entries if e["run"] == 0), default=0.0
        ),
        "seconds_per_calibration": sorted({e["seconds"] for e in entries}),
    }


def plot(entries: list[dict[str, Any]], args: Any) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(13, 4), sharey=True)
    for ax, figure in zip(axes, FIGURES, strict=True):
        chosen = [e for e in entries if e["figure"] == figure]
        for device in sorted({e["device"] for e in chosen}):
            mine = [e for e in chosen if e["device"] == device]
            ax.plot(
                [e["run"] + 1 for e in mine],
                [e["ratio"] for e in mine],
                marker="o",
                label=device,
            )
            again = [e for e in mine if e["attempts"] > 1]
            ax.scatter(
                [e["run"] + 1 for e in again],
                [e["ratio"] for e in again],
                s=120,
                facecolors="none",
                edgecolors="red",
            )
        ax.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="green", alpha=0.1)
        ax.set_title(figure.replace("_", " "), fontsize=10)
        ax.set_xlabel("calibration (1 = right after the heavy job)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("measured / profile (band: within 10%; red ring: measured again)")
    fig.suptitle(
        f"{args.runs} back-to-back calibrations of {args.devices} {args.profile} drives after "
        f"a {args.heavy_s:.0f} s heavy job",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png_path(NAME), dpi=120)


if __name__ == "__main__":
    main()
