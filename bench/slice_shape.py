"""Skytether Exp 1 (Figure 5) and Exp 3 (Figure 7) on quarry's emulated devices.

Exp 1, slice dimensions: the total latency of Accumulate over every slice of one partition of
14,400 genes, for slice widths (cells) from 100 to 3,200 and heights (genes per slice) of 48
and 480 rows (300 vs 30 slices), on the host profile and on the kinetic profile (Cortex-A53,
~15x slower). Slices are in quarry's stored layout (`layout.rows_batch`, dense rows) and are
in memory before timing starts: IO is left out, as in the paper.

Exp 3, selection vs projection: a 2,000-column x 12,000-row table (a dense-wide expression
matrix; every column a cell, values drawn so that `col > 10` keeps 16.9% of rows), projection
of 3%, 7% and 14% of the columns, alone and followed by the selection `SRR3052220 > 10`;
average of 10 runs, in pyarrow.compute and in DataFusion (the devices' query engine), host vs
kinetic profile.

Device time is what a device would take: the work runs for real inside the device emulator's
slot, which is then held for (compute factor - 1) x the work's CPU seconds
(`quarry.device.emulation`, the mechanism `UnitContext.compute` uses on a running device). Writes
bench/results/slice_shape.json and .png. Run: python bench/slice_shape.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

from quarry.device.emulation import Emulator
from quarry.device.profile import get_profile
from quarry.genes.layout import rows_batch, stored_schema
from quarry.genes.stats import accumulate

PROFILES = ("host", "kinetic")
# Exp 1
PARTITION_GENES = 14_400  # 300 slices of 48 rows, or 30 of 480
HEIGHTS = (48, 480)
WIDTHS = (100, 200, 400, 800, 1_600, 3_200)
GROUPS = 2  # a t-test compares two groups
HOST_REPEATS = 3  # the host's minimum of a few runs; a kinetic run is 15x longer, one suffices
# Exp 3
TABLE_COLUMNS = 2_000
TABLE_ROWS = 12_000
SELECTIVITY = 0.169
PREDICATE_COLUMN = "SRR3052220"
PROJECTION_FRACTIONS = (0.03, 0.07, 0.14)
RUNS = 10

console = Console(stderr=True)


def on_device(emulator: Emulator, work: Callable[[], Any]) -> float:
    """Seconds the work takes on the emulated device (host: its real time).

    The stretch is computed from the calling thread's CPU seconds, as the devices do: other
    processes competing for this machine's cores must not count as the drive's slowness.
    """
    started = time.perf_counter()
    with emulator.slot():
        cpu_started = time.thread_time()
        work()
        emulator.stretch(time.thread_time() - cpu_started)
    return time.perf_counter() - started


# ---- Exp 1 ------------------------------------------------------------------------------------


def exp1(widths: tuple[int, ...], genes: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    rows = []
    with progress(console) as bar:
        task = bar.add_task(
            "Exp 1: Accumulate per slice shape", total=len(widths) * len(HEIGHTS) * len(PROFILES)
        )
        for width in widths:
            values = np.log1p(rng.poisson(2.0, (genes, width))).astype(np.float32)
            schema = stored_schema("genes", pa.float32(), width)
            group_of_cell = rng.integers(0, GROUPS, width).astype(np.int32)
            for height in HEIGHTS:
                slices = [
                    rows_batch(
                        values, schema, start, min(start + height, genes), density_threshold=0.0
                    )
                    for start in range(0, genes, height)
                ]
                assert all(b.column(1).null_count == b.num_rows for b in slices), "dense rows"
                for profile in PROFILES:
                    emulator = Emulator(get_profile(profile))
                    repeats = HOST_REPEATS if profile == "host" else 1
                    totals = []
                    for _ in range(repeats):
                        totals.append(
                            sum(
                                on_device(
                                    emulator, lambda b=b, g=group_of_cell: accumulate(b, g, GROUPS)
                                )
                                for b in slices
                            )
                        )
                    rows.append(
                        {
                            "profile": profile,
                            "width": width,
                            "height": height,
                            "slices": len(slices),
                            "total_s": min(totals),
                            "per_slice_ms": 1e3 * min(totals) / len(slices),
                            "bytes": sum(pa.ipc.get_record_batch_size(b) for b in slices),
                        }
                    )
                    bar.advance(task)
    return rows


# ---- Exp 3 ------------------------------------------------------------------------------------


def exp3_table(rows: int, columns: int) -> pa.Table:
    rng = np.random.default_rng(3)
    # Exponential values with P(x > 10) = SELECTIVITY, so the predicate keeps 16.9% of rows.
    scale = 10.0 / np.log(1.0 / SELECTIVITY)
    block = rng.exponential(scale, (columns, rows)).astype(np.float32)
    names = [PREDICATE_COLUMN] + [f"SRR{3052221 + i}" for i in range(columns - 1)]
    return pa.table({name: block[i] for i, name in enumerate(names)})


def exp3(table: pa.Table, runs: int) -> list[dict[str, Any]]:
    import datafusion

    session = datafusion.SessionContext()
    session.register_record_batches("t", [table.to_batches()])
    results = []
    with progress(console) as bar:
        task = bar.add_task(
            "Exp 3: selection vs projection", total=len(PROJECTION_FRACTIONS) * len(PROFILES) * 2
        )
        for fraction in PROJECTION_FRACTIONS:
            count = round(fraction * table.num_columns)
            # The projected cells include the one the predicate reads.
            columns = table.column_names[:count]
            quoted = ", ".join(f'"{c}"' for c in columns)
            work = {
                "arrow": {
                    "projection": lambda c=columns: table.select(c).combine_chunks(),
                    "projection_selection": lambda c=columns: _arrow_select(table, c),
                },
                "datafusion": {
                    "projection": lambda q=quoted: session.sql(f"SELECT {q} FROM t").collect(),
                    "projection_selection": lambda q=quoted: session.sql(
                        f'SELECT {q} FROM t WHERE "{PREDICATE_COLUMN}" > 10'
                    ).collect(),
                },
            }
            kept = _arrow_select(table, columns).num_rows
            for profile in PROFILES:
                emulator = Emulator(get_profile(profile))
                for engine, operations in work.items():
                    row: dict[str, Any] = {
                        "profile": profile,
                        "engine": engine,
                        "projection_fraction": fraction,
                        "columns": count,
                        "rows_kept": kept,
                        "selectivity": kept / table.num_rows,
                    }
                    for name, operation in operations.items():
                        operation()  # warm-up: plan caches, allocator (Exp 2's first slices)
                        times = [on_device(emulator, operation) for _ in range(runs)]
                        row[f"{name}_ms"] = 1e3 * statistics.mean(times)
                    row["selection_ms"] = row["projection_selection_ms"] - row["projection_ms"]
                    results.append(row)
                    bar.advance(task)
    return results


def _arrow_select(table: pa.Table, columns: list[str]) -> pa.Table:
    projected = table.select(columns)
    return projected.filter(pc.greater(projected.column(PREDICATE_COLUMN), 10.0))


# ---- plot -------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(17, 7.5))
    grid = figure.add_gridspec(2, 3, width_ratios=[1.3, 1, 1])
    ax = figure.add_subplot(grid[:, 0])
    styles = {
        ("kinetic", 48): ("tab:purple", ":"),
        ("kinetic", 480): ("tab:purple", "-"),
        ("host", 48): ("tab:orange", ":"),
        ("host", 480): ("tab:orange", "-"),
    }
    for (profile, height), (color, line) in styles.items():
        points = [r for r in result["exp1"] if r["profile"] == profile and r["height"] == height]
        ax.plot(
            [r["width"] for r in points],
            [1e3 * r["total_s"] for r in points],
            color=color,
            linestyle=line,
            marker="o",
            label=f"{height} rows/slice ({points[0]['slices']} slices), {profile}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("slice width (cells)")
    ax.set_ylabel("total Accumulate latency over the partition (ms, log)")
    genes = result["setup"]["partition_genes"]
    ax.set_title(f"Exp 1 (Fig. 5): Accumulate over {genes:,} genes, slices in memory")
    ax.legend(fontsize=8)

    # Exp 3: one panel per engine and profile, linear scale, so bars compare by length.
    for row, profile in enumerate(PROFILES):
        for column, engine in enumerate(("arrow", "datafusion")):
            ax = figure.add_subplot(grid[row, column + 1])
            rows = [r for r in result["exp3"] if r["engine"] == engine and r["profile"] == profile]
            x = np.arange(len(rows))
            projection = [r["projection_ms"] for r in rows]
            both = [r["projection_selection_ms"] for r in rows]
            ax.bar(x - 0.2, projection, width=0.4, color="tab:blue", label="projection")
            ax.bar(x + 0.2, both, width=0.4, color="tab:red", label="projection + selection")
            for i, value in enumerate(both):
                ax.annotate(f"{value:.3g}", (i + 0.2, value), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(
                x,
                [f"{r['columns']} cols ({r['projection_fraction']:.0%})" for r in rows],
                fontsize=8,
            )
            ax.set_ylabel("mean latency (ms)")
            ax.set_title(f"Exp 3 (Fig. 7): {engine}, {profile}", fontsize=10)
            if row == 0 and column == 0:
                ax.legend(fontsize=8)
    figure.suptitle(
        f"Skytether Exp 1 and Exp 3 on emulated devices (Exp 3: {TABLE_COLUMNS:,}"
        f" columns x {TABLE_ROWS:,} rows, selection keeps "
        f"{result['summary']['exp3_selectivity']:.1%})"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    exp1_rows = result["exp1"]

    def total(profile: str, height: int, width: int) -> float:
        return next(
            r["total_s"]
            for r in exp1_rows
            if (r["profile"], r["height"], r["width"]) == (profile, height, width)
        )

    widths = sorted({r["width"] for r in exp1_rows})
    slowdown = [total("kinetic", h, w) / total("host", h, w) for h in HEIGHTS for w in widths]
    height_penalty = {p: [total(p, 48, w) / total(p, 480, w) for w in widths] for p in PROFILES}
    width_growth = {p: total(p, 480, widths[-1]) / total(p, 480, widths[0]) for p in PROFILES}
    exp3_rows = result["exp3"]
    engines = sorted({r["engine"] for r in exp3_rows})
    share = {
        engine: statistics.median(
            r["projection_ms"] / r["projection_selection_ms"]
            for r in exp3_rows
            if r["engine"] == engine
        )
        for engine in engines
    }
    exp3_slowdown = {
        engine: statistics.median(
            k["projection_selection_ms"] / h["projection_selection_ms"]
            for h in exp3_rows
            if h["profile"] == "host" and h["engine"] == engine
            for k in exp3_rows
            if k["profile"] == "kinetic" and (k["engine"], k["columns"]) == (engine, h["columns"])
        )
        for engine in engines
    }
    return {
        "exp1_kinetic_slowdown_median": statistics.median(slowdown),
        "exp1_48_vs_480_rows_ratio_median": {
            p: statistics.median(v) for p, v in height_penalty.items()
        },
        "exp1_latency_growth_480_rows_widest_vs_narrowest": width_growth,
        "exp3_projection_share_of_total_median": share,
        "exp3_kinetic_slowdown_median": exp3_slowdown,
        "exp3_selectivity": exp3_rows[0]["selectivity"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer widths and runs")
    args = parser.parse_args()
    widths = WIDTHS[:3] if args.quick else WIDTHS
    genes = 2_400 if args.quick else PARTITION_GENES
    runs = 3 if args.quick else RUNS
    started = time.perf_counter()
    result: dict[str, Any] = {
        "exp1": exp1(widths, genes),
        "exp3": exp3(exp3_table(TABLE_ROWS, TABLE_COLUMNS), runs),
        "setup": {
            "partition_genes": genes,
            "heights": HEIGHTS,
            "widths": widths,
            "groups": GROUPS,
            "table": [TABLE_COLUMNS, TABLE_ROWS],
            "runs": runs,
            "compute_factor": {p: get_profile(p).compute_factor for p in PROFILES},
        },
    }
    result["summary"] = summarize(result)
    result["bench_s"] = time.perf_counter() - started
    name = "slice_shape" if not args.quick else "slice_shape_quick"
    path = write_json(name, result)
    plot(result, png_path(name))
    console.print(f"wrote {path} and {png_path(name)}")
    console.print(result["summary"])


if __name__ == "__main__":
    main()
