"""Per-query overhead: a 1,000-row aggregate on four local devices, auto / always / never.

    python bench/overhead.py [--queries 60] [--devices 4] [--telemetry]

The work itself is nothing (250 rows per device); what is measured is everything around it:
the catalog's check, planning (or the kept plan), opening the exchanges, the devices' loop,
the host's completion and the super-plan. Each query is timed from ``cluster.query`` to its
last row read; modes take turns in rounds, so a busy moment of the machine falls on all three.
Alongside: the median of each part of EXPLAIN ANALYZE's time section, so the figures can be
explained, and the figures before the catalog, plans and threads were kept (``BEFORE_MS``).

``--telemetry``: the same queries on two clusters up at once, one with metrics and tracing off,
one with both on (every device serving Prometheus metrics, scraped as a Prometheus would, and
every query traced, host and devices, to a file: ``common.Telemetry``), taking turns within
each round (ABBA), so the ratio on / off per mode is the cost of watching a cluster
(``overhead_telemetry``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import matplotlib
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ARMS, png_path, telemetry_clusters, write_json

import quarry

matplotlib.use("Agg")
SQL = "SELECT k % 10 AS g, sum(v) FROM t.small GROUP BY k % 10"
MODES = ("auto", "always", "never")
TARGET_MS = 10.0
ROUND_QUERIES = 5  # queries of one mode before the next mode's turn
WARMUP_QUERIES = 10  # per mode, not counted: the devices import their engines on first use
# The same run at cb6aaf0, before the catalog, plans and threads were kept between queries.
BEFORE_MS = {"auto": 32.0, "always": 22.1, "never": 20.4}
PARTS = (  # the time section's parts shown in the chart, host path first
    "planning",
    "fragments",
    "super_plan",
    "host_completion",
    "device_queueing",
    "store_read",
    "decode",
    "execute",
    "ship",
)


def run(queries: int, devices: int) -> dict:
    table = pa.table({"k": pa.array(range(1000)), "v": pa.array([float(i) for i in range(1000)])})
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    parts: dict[str, dict[str, list[float]]] = {
        mode: {**{p: [] for p in PARTS}, "wall_s": [], "cpu_s": []} for mode in MODES
    }
    with quarry.local(devices=devices) as cluster:
        cluster.ingest(table, "t/small", partitions=devices)
        for mode in MODES:
            for _ in range(WARMUP_QUERIES):
                cluster.query(SQL, pushdown=mode).execute().read_all()
        load_before = os.getloadavg()[0]
        while min(len(s) for s in seconds.values()) < queries:
            for mode in MODES:
                for _ in range(min(ROUND_QUERIES, queries - len(seconds[mode]))):
                    started = time.perf_counter()
                    planned = cluster.query(SQL, pushdown=mode)
                    planned.execute().read_all()
                    seconds[mode].append(time.perf_counter() - started)
                    spent = planned.breakdown()
                    for part in PARTS:
                        parts[mode][part].append(getattr(spent, part).wall_s)
                    parts[mode]["wall_s"].append(spent.wall_s)
                    parts[mode]["cpu_s"].append(spent.cpu_s)
        load_after = os.getloadavg()[0]
    summary = {}
    for mode in MODES:
        ordered = sorted(seconds[mode])
        summary[mode] = {
            "queries": len(ordered),
            "median_ms": 1e3 * statistics.median(ordered),
            "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))],
            "min_ms": 1e3 * ordered[0],
            "before_median_ms": BEFORE_MS[mode],
            "parts_median_ms": {
                name: 1e3 * statistics.median(values) for name, values in parts[mode].items()
            },
        }
    return {
        "sql": SQL,
        "rows": table.num_rows,
        "devices": devices,
        "target_ms": TARGET_MS,
        "load_average": {"before": load_before, "after": load_after},
        "modes": summary,
        "seconds": seconds,
    }


def run_telemetry(queries: int, devices: int) -> dict:
    """Each mode's queries on both clusters, in turns: medians per arm and their ratio."""
    table = pa.table({"k": pa.array(range(1000)), "v": pa.array([float(i) for i in range(1000)])})
    seconds = {arm: {mode: [] for mode in MODES} for arm in ARMS}
    with telemetry_clusters(devices) as telemetry:
        for arm in ARMS:
            with telemetry.turn(arm) as cluster:
                cluster.ingest(table, "t/small", partitions=devices)
                for mode in MODES:
                    for _ in range(WARMUP_QUERIES):
                        cluster.query(SQL, pushdown=mode).execute().read_all()
        load_before = os.getloadavg()[0]
        telemetry.cpu_s = telemetry.no_cpu()  # the warm-up's not counted
        rounds = 0
        while min(len(s) for s in seconds["on"].values()) < queries:
            order = ARMS if rounds % 2 == 0 else ARMS[::-1]  # ABBA: a drift falls on both
            rounds += 1
            for mode in MODES:
                count = min(ROUND_QUERIES, queries - len(seconds["on"][mode]))
                for arm in order:
                    with telemetry.turn(arm) as cluster:
                        for _ in range(count):
                            started = time.perf_counter()
                            cluster.query(SQL, pushdown=mode).execute().read_all()
                            seconds[arm][mode].append(time.perf_counter() - started)
        load_after = os.getloadavg()[0]
        recorded = telemetry.figures()
    summary = {}
    for mode in MODES:
        off, on = (statistics.median(seconds[arm][mode]) for arm in ARMS)
        summary[mode] = {
            "off_median_ms": 1e3 * off,
            "on_median_ms": 1e3 * on,
            "on_over_off": on / off,
        }
    total = {arm: sum(statistics.median(seconds[arm][m]) for m in MODES) for arm in ARMS}
    counted = {arm: sum(len(seconds[arm][m]) for m in MODES) for arm in ARMS}
    cpu_ms = {
        arm: {part: 1e3 * s / counted[arm] for part, s in telemetry.cpu_s[arm].items()}
        for arm in ARMS
    }
    return {
        "sql": SQL,
        "rows": table.num_rows,
        "devices": devices,
        "queries_per_mode_and_arm": queries,
        "load_average": {"before": load_before, "after": load_after},
        "on": recorded,
        "modes": summary,
        "on_over_off": total["on"] / total["off"],  # the modes' medians summed
        # CPU a query costs, host and devices (every mode), and its ratio: not moved by other
        # processes' work on a busy machine as the times are
        "cpu_ms_per_query": cpu_ms,
        "cpu_on_over_off": sum(cpu_ms["on"].values()) / sum(cpu_ms["off"].values()),
        "seconds": seconds,
    }


def plot_telemetry(result: dict) -> None:
    import matplotlib.pyplot as plt

    modes = result["modes"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = range(len(MODES))
    for offset, arm in ((-0.2, "off"), (0.2, "on")):
        heights = [modes[m][f"{arm}_median_ms"] for m in MODES]
        ax.bar([i + offset for i in x], heights, width=0.4, label=f"metrics and tracing {arm}")
    for i, mode in enumerate(MODES):
        top = max(modes[mode]["off_median_ms"], modes[mode]["on_median_ms"])
        ax.annotate(f"x{modes[mode]['on_over_off']:.3f}", (i, top), ha="center", va="bottom")
    ax.set_xticks(list(x), MODES)
    ax.set_ylabel("median ms per query (to the last row)")
    ax.set_title(
        f"{result['rows']:,}-row aggregate on {result['devices']} devices: on / off "
        f"x{result['on_over_off']:.3f}"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path("overhead_telemetry"), dpi=120)


def plot(result: dict) -> None:
    import matplotlib.pyplot as plt

    modes = result["modes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = range(len(MODES))
    medians = [modes[m]["median_ms"] for m in MODES]
    p90 = [modes[m]["p90_ms"] - modes[m]["median_ms"] for m in MODES]
    before = [modes[m]["before_median_ms"] for m in MODES]
    left.bar([i - 0.2 for i in x], before, width=0.4, color="#bbbbbb", label="before")
    left.bar([i + 0.2 for i in x], medians, width=0.4, yerr=[[0] * 3, p90], label="now (p90)")
    left.axhline(result["target_ms"], color="red", linestyle="--", label="target")
    left.set_xticks(list(x), MODES)
    left.set_ylabel("median ms per query (to the last row)")
    left.set_title(f"{result['rows']:,}-row aggregate on {result['devices']} devices")
    left.legend()
    groups = (  # one bar each per mode: the host's path, then what the devices did
        ("host", ("planning", "fragments", "super_plan"), -0.27),
        ("host completing", ("host_completion",), 0.0),
        ("devices (summed)", ("device_queueing", "store_read", "decode", "execute", "ship"), 0.27),
    )
    colors = dict(zip(PARTS, plt.cm.tab10.colors, strict=False))
    for _, parts, offset in groups:
        bottom = [0.0] * len(MODES)
        for part in parts:
            heights = [modes[m]["parts_median_ms"][part] for m in MODES]
            right.bar(
                [i + offset for i in x],
                heights,
                width=0.25,
                bottom=bottom,
                color=colors[part],
                label=part.replace("_", " "),
            )
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    right.scatter(
        list(x),
        [modes[m]["parts_median_ms"]["wall_s"] for m in MODES],
        color="black",
        marker="_",
        s=400,
        label="query wall",
        zorder=3,
    )
    right.set_xticks(list(x), MODES)
    right.set_ylabel("median ms")
    right.set_title(
        "time section, median per part\nper mode: host path · host completing · devices summed",
        fontsize=10,
    )
    right.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(png_path("overhead"), dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, default=60, help="timed queries per mode")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument(
        "--telemetry", action="store_true", help="compare metrics and tracing on and off"
    )
    args = parser.parse_args()
    if args.telemetry:
        result = run_telemetry(args.queries, args.devices)
        print_telemetry(result)
        name, draw = "overhead_telemetry", plot_telemetry
    else:
        result = run(args.queries, args.devices)
        print_overhead(result)
        name, draw = "overhead", plot
    path = write_json(name, result)
    draw(result)
    print(f"wrote {path}")


def print_telemetry(result: dict) -> None:
    for mode, s in result["modes"].items():
        print(
            f"{mode:7s} off {s['off_median_ms']:6.2f} ms  on {s['on_median_ms']:6.2f} ms  "
            f"on/off {s['on_over_off']:.3f}"
        )
    print(f"on/off (medians summed) {result['on_over_off']:.3f}; on recorded {result['on']}")
    cpu = result["cpu_ms_per_query"]
    print(
        "CPU a query, host + devices: "
        + ", ".join(f"{arm} {c['host']:.2f} + {c['devices']:.2f} ms" for arm, c in cpu.items())
        + f"; on/off {result['cpu_on_over_off']:.3f}"
    )


def print_overhead(result: dict) -> None:
    for mode, s in result["modes"].items():
        print(
            f"{mode:7s} median {s['median_ms']:6.2f} ms  p90 {s['p90_ms']:6.2f} ms  "
            f"(before {s['before_median_ms']:.1f} ms)"
        )
    print(f"load average {result['load_average']}")


if __name__ == "__main__":
    main()
