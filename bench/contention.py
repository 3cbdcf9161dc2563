"""Static offload loses under contention; adaptive pushdown does not (ActivePy Fig. 2).

    python bench/contention.py [--rows 20000000] [--devices 4] [--profile kinetic]

A filter + aggregate query over the particle table on a cluster of emulated Kinetic drives, with
emulated background load on every drive at 0%, 50% and 90%. For each load level the same query
runs with pushdown never (host does everything), always (devices do everything) and auto (the
cost model picks the cut, devices adapt at run time), side by side, in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import matplotlib
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

import quarry
from quarry.samples import particles

matplotlib.use("Agg")
LOADS = (0.0, 0.5, 0.9)
MODES = ("never", "always", "auto")
QUERY = (
    "SELECT CAST(x / 10 AS INT) AS cell, count(*) AS n, avg(ke) AS ke_avg, "
    "max(ke) AS ke_max FROM physics.particles WHERE ke > {x} GROUP BY 1 ORDER BY 1"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--profile", default="kinetic")
    parser.add_argument("--selectivity", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sql = QUERY.format(x=particles.ke_threshold(args.selectivity))

    results = []
    with quarry.local(devices=args.devices, profile=args.profile) as cluster:
        print(f"ingesting {args.rows:,} particles into {args.devices} {args.profile} devices ...")
        cluster.ingest(particles.reader(args.rows), "physics/particles", progress=True)
        calibration = [r.to_json() for r in cluster.calibrate()]
        reference = None
        with Progress() as progress:
            task = progress.add_task("contention", total=len(LOADS) * len(MODES) * args.repeat)
            for load in LOADS:
                for device in cluster.devices:
                    cluster.load(device, load, seconds=3600) if load else cluster.load(
                        device, 0.0, seconds=1
                    )
                row: dict = {"load": load}
                for mode in MODES:
                    times, shipped, decisions = [], [], []
                    for _ in range(args.repeat):
                        planned = cluster.query(sql, pushdown=mode)
                        started = time.perf_counter()
                        table = planned.execute().read_all()
                        times.append(time.perf_counter() - started)
                        report = planned.explain(analyze=True).to_json()
                        shipped.append(report["analyze"]["bytes_shipped"])
                        decisions.append(_summarize(report))
                        if reference is None:
                            reference = table
                        assert table.equals(reference) or _close(table, reference), mode
                        progress.advance(task)
                    row[f"{mode}_s"] = statistics.median(times)
                    row[f"{mode}_times_s"] = times
                    row[f"{mode}_bytes_shipped"] = statistics.median(shipped)
                    row[f"{mode}_decisions"] = decisions[-1]
                best = min(row["never_s"], row["always_s"])
                row["auto_over_best"] = row["auto_s"] / best
                row["always_over_auto"] = row["always_s"] / row["auto_s"]
                results.append(row)
        for device in cluster.devices:
            cluster.load(device, 0.0, seconds=1)
    for r in results:
        print(
            f"load {r['load']:4.0%}: never {r['never_s']:6.2f}s  always {r['always_s']:6.2f}s  "
            f"auto {r['auto_s']:6.2f}s  auto/best {r['auto_over_best']:4.2f}  "
            f"always/auto {r['always_over_auto']:5.2f}  auto did {r['auto_decisions']}"
        )
    path = write_json(
        "contention",
        {
            "rows": args.rows,
            "devices": args.devices,
            "profile": args.profile,
            "sql": sql,
            "calibration": calibration,
            "results": results,
        },
    )
    plot(results, args)
    print(f"wrote {path}")


def _close(a, b) -> bool:
    import numpy as np

    if a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x = np.asarray(a.column(name).to_pylist(), dtype=float)
        y = np.asarray(b.column(name).to_pylist(), dtype=float)
        if not np.allclose(x, y, rtol=1e-9, atol=0):
            return False
    return True


def _summarize(report: dict) -> dict:
    """Slices executed vs pushed back, over all devices: what auto actually did."""
    devices = report["analyze"]["devices"]
    return {
        "executed": sum(d["slices_executed"] for d in devices),
        "pushed_back": sum(d["slices_pushed_back"] for d in devices),
        "cut": {k: v["cut"] for k, v in report.get("cost_model", {}).items()},
    }


def plot(results: list[dict], args: argparse.Namespace) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.26
    x = range(len(results))
    for i, mode in enumerate(MODES):
        bars = ax.bar(
            [v + (i - 1) * width for v in x],
            [r[f"{mode}_s"] for r in results],
            width,
            label=f"pushdown {mode}",
        )
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(list(x), [f"device load {r['load']:.0%}" for r in results])
    ax.set_ylabel("query wall time (s, median)")
    ax.set_title(
        f"Filter + aggregate over {args.rows:,} rows, {args.devices} {args.profile} devices"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path("contention"), dpi=120)


if __name__ == "__main__":
    main()
