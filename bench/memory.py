"""Host memory of super-plans: each query's peak RSS in a fresh process, beside the budget.

    python bench/memory.py [--rows 20000000] [--devices 4] [--budget-mib N]

A local cluster (``quarry.local``) in a temporary folder holds ``--rows`` particles (id, x, y,
z, ke), ingested from a Parquet file written chunk by chunk. For each query

    top-k     SELECT * FROM particles WHERE ke > X ORDER BY ke LIMIT 100
    group by  SELECT id % 1000000 AS g, sum(ke), count(*) FROM particles GROUP BY g

and each pushdown (never, always, auto), a fresh child Python process connects to the cluster
(``quarry.connect(cluster_file)``), notes its RSS after import and connect (the baseline), runs
the query reading the answer batch by batch, and reports its peak RSS (``VmHWM``), wall
time, rows and bytes shipped from the devices. The super-plan's budget is passed to the child
as $QUARRY_SUPER_PLAN_MEMORY_MIB. Writes bench/results/memory.json and memory.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

import quarry
from quarry import settings
from quarry.plan.memory import (
    QUERY_HOST_MEMORY_BYTES_MAX,
    SPOOL_MEMORY_SHARE,
    SUPER_PLAN_MEMORY_BYTES_MAX,
)
from quarry.samples import particles

matplotlib.use("Agg")
MIB = 1024 * 1024
QUERIES = {
    "top-k": "SELECT * FROM physics.particles WHERE ke > {x} ORDER BY ke LIMIT 100",
    "group by": (
        "SELECT id % 1000000 AS g, sum(ke) AS ke_sum, count(*) AS n "
        "FROM physics.particles GROUP BY g"
    ),
}
MODES = ("never", "always", "auto")
CHILD_TIMEOUT_S = 1800  # one query on 20 M rows under "never" takes well under a minute


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes_now() -> int:
    return _status_bytes("VmRSS:")


def rss_bytes_peak() -> int:
    """The process's own high-water mark. Not ``ru_maxrss``: that survives exec, so a child
    started by a large parent would report the parent's size."""
    return _status_bytes("VmHWM:")


def child(cluster_file: str, sql: str, pushdown: str) -> dict[str, Any]:
    """One query in this (fresh) process; what it cost in memory and time."""
    import datafusion  # noqa: F401  (loaded before the baseline: every query needs it)

    import quarry.plan.superplan

    cluster = quarry.connect(cluster_file)
    cluster.refresh()
    baseline_peak, baseline_now = rss_bytes_peak(), rss_bytes_now()
    started = time.perf_counter()
    planned = cluster.query(sql, pushdown=pushdown)
    rows = 0
    for batch in planned.execute():  # batch by batch: the answer is not held
        rows += batch.num_rows
    wall_s = time.perf_counter() - started
    peak = rss_bytes_peak()
    report = planned.explain(analyze=True).to_json()
    return {
        "baseline_rss_bytes": baseline_peak,
        "baseline_rss_now_bytes": baseline_now,
        "peak_rss_bytes": peak,
        "peak_over_baseline_bytes": peak - baseline_peak,
        "wall_s": wall_s,
        "rows": rows,
        "bytes_shipped": report["analyze"]["bytes_shipped"],
        "plan_line": report["plan"].splitlines()[1],
    }


def run_child(cluster_file: Path, sql: str, pushdown: str, budget_mib: int) -> dict[str, Any]:
    environment = {**os.environ, settings.SUPER_PLAN_MEMORY_MIB.name: str(budget_mib)}
    command = [sys.executable, __file__, "--child", str(cluster_file), sql, pushdown]
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{pushdown} {sql!r} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_particles(path: Path, rows: int) -> None:
    """Chunk by chunk, so that generating never holds the table."""
    writer = None
    for batch in particles.batches(rows):
        if writer is None:
            writer = pq.ParquetWriter(path, batch.schema)
        writer.write_batch(batch)
    assert writer is not None, "no rows to write"
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--profile", default="host")
    parser.add_argument(
        "--budget-mib",
        type=int,
        default=SUPER_PLAN_MEMORY_BYTES_MAX // MIB,
        help="the super-plan's budget; a query's host memory adds the completion's share",
    )
    parser.add_argument("--selectivity", type=float, default=0.5, help="of ke > X in top-k")
    args = parser.parse_args()
    budget_bytes = args.budget_mib * MIB
    query_budget_bytes = budget_bytes + QUERY_HOST_MEMORY_BYTES_MAX - SUPER_PLAN_MEMORY_BYTES_MAX
    args.query_budget_mib = query_budget_bytes // MIB
    x = particles.ke_threshold(args.selectivity)

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quarry-bench-memory-") as tmp:
        folder = Path(tmp)
        parquet = folder / "particles.parquet"
        write_particles(parquet, args.rows)
        with quarry.local(
            devices=args.devices, profile=args.profile, data=folder / "cluster"
        ) as cluster:
            print(f"ingesting {args.rows:,} particles into {args.devices} devices ...")
            cluster.ingest(parquet, "physics/particles")
            parquet.unlink()
            for name, template in QUERIES.items():
                sql = template.format(x=x)
                for mode in MODES:
                    measured = run_child(cluster.cluster_file, sql, mode, args.budget_mib)
                    row = {"query": name, "sql": sql, "pushdown": mode, **measured}
                    row["budget_bytes"] = budget_bytes
                    row["query_budget_bytes"] = query_budget_bytes
                    results.append(row)
                    print(
                        f"{name:9s} {mode:6s} peak {measured['peak_rss_bytes'] / MIB:7.0f} MiB "
                        f"(+{measured['peak_over_baseline_bytes'] / MIB:6.0f} over "
                        f"{measured['baseline_rss_bytes'] / MIB:4.0f}) budget "
                        f"{args.query_budget_mib} MiB | {measured['wall_s']:6.2f} s | "
                        f"{measured['rows']:>9,} rows | shipped "
                        f"{measured['bytes_shipped'] / 1e6:8.1f} MB"
                    )
                answers = {r["rows"] for r in results if r["query"] == name}
                if len(answers) != 1:
                    print(f"warning: {name} answered {sorted(answers)} rows across pushdowns")
    path = write_json(
        "memory",
        {
            "rows": args.rows,
            "devices": args.devices,
            "profile": args.profile,
            "budget_bytes": budget_bytes,
            "query_budget_bytes": query_budget_bytes,
            "spool_memory_bytes_max": budget_bytes // SPOOL_MEMORY_SHARE,
            "selectivity": args.selectivity,
            "results": results,
        },
    )
    plot(results, args)
    print(f"wrote {path}")


def plot(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    width = 0.8 / len(MODES)
    names = list(QUERIES)
    for offset, mode in enumerate(MODES):
        chosen = [
            next(r for r in results if r["query"] == q and r["pushdown"] == mode) for q in names
        ]
        positions = [i + (offset - (len(MODES) - 1) / 2) * width for i in range(len(names))]
        heights = [r["peak_over_baseline_bytes"] / MIB for r in chosen]
        bars = ax.bar(positions, heights, width, label=f"pushdown {mode}")
        for bar, r in zip(bars, chosen):
            shipped_mb = r["bytes_shipped"] / 1e6
            ax.annotate(
                f"{shipped_mb:,.{0 if shipped_mb >= 10 else 1}f} MB\nshipped",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.axhline(
        args.query_budget_mib,
        color="black",
        linestyle="--",
        label=f"query budget {args.query_budget_mib} MiB (super-plan {args.budget_mib})",
    )
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("peak RSS over baseline (MiB)")
    ax.set_title(f"Host memory of a query: {args.rows:,} particles, {args.devices} devices")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path("memory"), dpi=120)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:5])))
    else:
        main()
