"""POLARDB on computational storage drives, on a quarry hierarchy: storage servers in front of
ScaleFlux drives, CPU-based against CSD-based scans (issue 13).

Run: python bench/polardb.py [--sf 1] [--repeat 3] [--parts scans,tpch]
     [--requests 32,64,128] [--queries 1,3,6]

Part ``scans`` (§4.2, Figures 6 and 7): LINEITEM on ScaleFlux drives behind one storage server,
(a) one drive and a server of 4 cores, (b) two drives and 8 cores (the server profile's cores),
each without and with lz4. TS-1..TS-6 run as CPU-based pushdown (``pushdown="server"``: the
drives read, the server scans) and CSD-based pushdown (``"always"``: the drives' scan engines
filter, the server checks the full condition), side by side in one run: latency, the server
process's CPU utilization (its CPU seconds over the wall time, in %, as ``top`` counts it), the
bytes over the drive links ("PCIe") and through the server's memory (in from the drives and
out to the host). Every answer is checked against DuckDB's.

Part ``tpch`` (§4.3, Figures 8-11): the 22 TPC-H queries over 3 servers x 4 drives with
LINEITEM and ORDERS cut into n partitions (n parallel scan requests, 32 / 64 / 128), under no
pushdown (``never``: servers ship raw slices), CPU-based (``server``) and CSD-based
(``always``): latency per query, bytes on the drive links and on the network.

This machine has two cores: the emulated server cores share them with the drives and the host.
Figures are ratios taken in one run, not the paper's absolute seconds.

Writes bench/results/polardb.json and .png.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

import quarry
from quarry import settings
from quarry.errors import QuarryError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json
from load import duckdb_with_tpch

NAME = "polardb"
# The host's memory for the super-plan: at SF 1, no pushdown brings whole tables to the host and
# a join's build side outgrows the 384 MiB default (this machine has 24 GiB).
os.environ.setdefault(settings.SUPER_PLAN_MEMORY_MIB.name, "4096")
console = Console(width=150)
SCANS = {
    "TS-1": "SELECT l_partkey, l_extendedprice, l_discount FROM tpch.lineitem "
    "WHERE l_shipdate >= DATE '1994-06-01' AND l_shipdate < DATE '1994-07-01'",
    "TS-2": "SELECT l_partkey, l_suppkey, l_quantity FROM tpch.lineitem "
    "WHERE l_shipdate >= DATE '1993-01-01' AND l_shipdate < DATE '1994-01-01'",
    "TS-3": "SELECT l_orderkey, l_suppkey, l_extendedprice, l_discount, l_shipdate "
    "FROM tpch.lineitem WHERE l_shipdate >= DATE '1995-01-01' AND l_shipdate <= DATE '1996-12-31'",
    "TS-4": "SELECT l_orderkey, l_extendedprice, l_discount FROM tpch.lineitem "
    "WHERE l_shipdate <= DATE '1995-03-12'",
    "TS-5": "SELECT l_orderkey FROM tpch.lineitem WHERE l_commitdate < l_receiptdate",
    "TS-6": "SELECT l_partkey, l_suppkey, l_quantity FROM tpch.lineitem",
}
WAYS = {"never": "no pushdown", "server": "CPU-based", "always": "CSD-based"}
SCAN_WAYS = ("server", "always")
CONFIGS = ({"drives": 1, "cores": 4}, {"drives": 2, "cores": 8})
PROFILES = "\n".join(
    f'[profiles.storage{cores}]\nfrom = "host"\ncores = {cores}\n' for cores in (4, 8)
)
TPCH_TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")
SPLIT = ("lineitem", "orders")  # the tables cut into n partitions (n parallel requests)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far (Linux)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def same(actual: pa.Table, expected: pa.Table) -> bool:
    """Equal as multisets of rows, numbers to 1e-6 relative (quarry's avg of a decimal is a
    decimal of 6 places, DuckDB's a double). Vectorised: the scans return millions of rows."""
    if actual.num_rows != expected.num_rows or actual.num_columns != expected.num_columns:
        return False
    expected = expected.rename_columns(actual.column_names)
    keys = [(name, "ascending") for name in actual.column_names]
    left, right = actual.sort_by(keys), expected.sort_by(keys)
    for a, b in zip(left.columns, right.columns, strict=True):
        numeric = pa.types.is_floating(a.type) or pa.types.is_decimal(a.type)
        if numeric or pa.types.is_floating(b.type) or pa.types.is_decimal(b.type):
            x = pc.cast(a, pa.float64()).to_numpy(zero_copy_only=False)
            y = pc.cast(b, pa.float64()).to_numpy(zero_copy_only=False)
            if not np.allclose(x, y, rtol=1e-6, atol=1e-6, equal_nan=True):
                return False
        elif not a.equals(b.cast(a.type) if a.type != b.type else b):
            return False
    return True


def run_query(cluster: Any, sql: str, way: str, servers: list[int]) -> dict[str, Any]:
    """One run: latency, the servers' CPU seconds, bytes per link, the answer."""
    cpu_before = [cpu_seconds(pid) for pid in servers]
    started = time.perf_counter()
    planned = cluster.query(sql, pushdown=way)
    table = planned.execute().read_all()
    wall = time.perf_counter() - started
    server_cpu = sum(cpu_seconds(pid) for pid in servers) - sum(cpu_before)
    analyzed = planned.explain(analyze=True).to_json()["analyze"]
    levels = analyzed.get("levels") or {}
    network = int(analyzed["bytes_shipped"])
    drive_links = int(levels.get("drive_links_bytes", 0))
    return {
        "table": table,
        "latency_s": wall,
        "server_cpu_s": server_cpu,
        "server_cpu_percent": 100.0 * server_cpu / wall,
        "drive_links_bytes": drive_links,
        "network_bytes": network,
        "server_memory_bytes": drive_links + network,
        "drives_bytes_read": int(levels.get("drives_bytes_read", 0)),
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[0]["error"]}
    keys = [k for k in good[0] if k != "table"]
    return {k: statistics.median(r[k] for r in good) for k in keys}


def attempt(cluster: Any, sql: str, way: str, servers: list[int]) -> dict[str, Any]:
    """``run_query``, or what stopped it (a result too: the way could not answer)."""
    try:
        return run_query(cluster, sql, way, servers)
    except QuarryError as error:
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}


def agrees(runs: list[dict[str, Any]], expected: pa.Table) -> bool:
    return all("error" not in r and same(r["table"], expected) for r in runs)


def scans(duck: Any, data: dict[str, pa.Table], repeat: int, scratch: Path) -> list[dict]:
    profiles = scratch / "profiles.toml"
    profiles.write_text(PROFILES)
    expected = {
        name: duck.execute(sql.replace("tpch.", "")).fetch_arrow_table()
        for name, sql in SCANS.items()
    }
    rows = data["tpch/lineitem"].num_rows
    results = []
    for config in CONFIGS:
        with quarry.local(
            servers=1,
            drives_per_server=config["drives"],
            server_profile=f"storage{config['cores']}",
            drive_profile="scaleflux",
            profiles_file=str(profiles),
        ) as cluster:
            servers = [int(s.pid) for s in cluster.specs]
            for compression in ("none", "lz4"):
                cluster.ingest(
                    data["tpch/lineitem"],
                    "tpch/lineitem",
                    partitions=4 * config["drives"],
                    compression=compression,
                )
                for sql in SCANS.values():  # untimed: first plans, imports, page cache
                    for way in SCAN_WAYS:
                        cluster.sql(sql, pushdown=way).read_all()
                with progress(console) as bar:
                    task = bar.add_task(
                        f"{config['drives']} drive(s), {config['cores']} cores, {compression}",
                        total=len(SCANS) * len(SCAN_WAYS) * repeat,
                    )
                    for name, sql in SCANS.items():
                        for way in SCAN_WAYS:
                            runs = []
                            for _ in range(repeat):
                                runs.append(attempt(cluster, sql, way, servers))
                                bar.advance(task)
                            results.append(
                                {
                                    **config,
                                    "compression": compression,
                                    "scan": name,
                                    "way": way,
                                    "selectivity": expected[name].num_rows / rows,
                                    "agrees": agrees(runs, expected[name]),
                                    **medians(runs),
                                }
                            )
                cluster.drop("tpch/lineitem")
    return results


def tpch(
    duck: Any,
    data: dict[str, pa.Table],
    repeat: int,
    requests: list[int],
    queries: list[int],
) -> list[dict]:
    texts = dict(duck.execute("SELECT query_nr, query FROM tpch_queries()").fetchall())
    expected = {n: duck.execute(texts[n]).fetch_arrow_table() for n in queries}
    results = []
    with quarry.local(servers=3, drives_per_server=4, drive_profile="scaleflux") as cluster:
        servers = [int(s.pid) for s in cluster.specs]
        for name in TPCH_TABLES:
            if name not in SPLIT:
                cluster.ingest(data[f"tpch/{name}"], f"tpch/{name}")
        for n in requests:
            for name in SPLIT:
                cluster.ingest(data[f"tpch/{name}"], f"tpch/{name}", partitions=n)
            with progress(console) as bar:
                task = bar.add_task(f"{n} parallel requests", total=len(queries) * 3 * repeat)
                for number in queries:
                    for way in WAYS:
                        runs = []
                        for _ in range(repeat):
                            runs.append(attempt(cluster, texts[number], way, servers))
                            bar.advance(task)
                        results.append(
                            {
                                "requests": n,
                                "query": number,
                                "way": way,
                                "agrees": agrees(runs, expected[number]),
                                **medians(runs),
                            }
                        )
            for name in SPLIT:
                cluster.drop(f"tpch/{name}")
    return results


def scan_shapes(results: list[dict]) -> dict[str, Any]:
    """The acceptance's shapes of Figures 6/7, per configuration and compression."""
    index = {(r["drives"], r["compression"], r["scan"], r["way"]): r for r in results}
    out: dict[str, Any] = {}
    for drives, compression, scan, way in index:
        if way != "server" or "error" in index[(drives, compression, scan, way)]:
            continue
        cpu, csd = (
            index[(drives, compression, scan, "server")],
            index[(drives, compression, scan, "always")],
        )
        if "error" in csd:
            continue
        out.setdefault(f"{drives} drive(s), {compression}", {})[scan] = {
            "server_cpu_ratio": cpu["server_cpu_s"] / max(csd["server_cpu_s"], 1e-9),
            "latency_ratio": cpu["latency_s"] / csd["latency_s"],
            "drive_link_reduction": 1 - csd["drive_links_bytes"] / max(cpu["drive_links_bytes"], 1),
        }
    for scans in out.values():
        measures = {name: dict(v) for name, v in scans.items()}
        benefit = {n: v["latency_ratio"] * v["server_cpu_ratio"] for n, v in measures.items()}
        scans["benefits_least"] = min(benefit, key=benefit.get)
        # and by each of the paper's measures alone: Figure 6 (latency, server CPU), Figure 7
        # (drive-link traffic)
        for measure in ("latency_ratio", "server_cpu_ratio", "drive_link_reduction"):
            least = min(measures, key=lambda n, m=measure: measures[n][m])
            scans[f"benefits_least_by_{measure}"] = least
    return out


def tpch_shapes(results: list[dict]) -> dict[str, Any]:
    """Figure 11's count: queries whose drive-link bytes fall by more than 50% (CSD-based
    against CPU-based) and whose network bytes fall by more than 70% (against no pushdown)."""
    out: dict[str, Any] = {}
    for n in sorted({r["requests"] for r in results}):
        by = {(r["query"], r["way"]): r for r in results if r["requests"] == n}
        links, network = [], []
        for query in sorted({q for q, _ in by}):
            cpu, csd, none = by[(query, "server")], by[(query, "always")], by[(query, "never")]
            if any("error" in r for r in (cpu, csd)):
                continue
            if 1 - csd["drive_links_bytes"] / max(cpu["drive_links_bytes"], 1) > 0.5:
                links.append(query)
            if (
                "error" not in none
                and 1 - csd["network_bytes"] / max(none["network_bytes"], 1) > 0.7
            ):
                network.append(query)
        out[str(n)] = {
            "drive_links_over_50_percent": links,
            "network_over_70_percent": network,
        }
    return out


def report_scans(results: list[dict]) -> None:
    table = Table(title="Figures 6/7: CPU-based vs CSD-based scans (medians)")
    for column in (
        "config",
        "lz4",
        "scan",
        "sel %",
        "latency CPU/CSD s",
        "server CPU % CPU/CSD",
        "PCIe MB CPU/CSD",
        "agree",
    ):
        table.add_column(column, justify="right")
    index = {(r["drives"], r["compression"], r["scan"], r["way"]): r for r in results}
    for (drives, compression, scan, way), r in index.items():
        if way != "server":
            continue
        csd = index[(drives, compression, scan, "always")]
        table.add_row(
            f"{drives} drive(s), {r['cores']} cores",
            "yes" if compression == "lz4" else "no",
            scan,
            f"{100 * r['selectivity']:.2f}",
            f"{r['latency_s']:.2f} / {csd['latency_s']:.2f}",
            f"{r['server_cpu_percent']:.0f} / {csd['server_cpu_percent']:.0f}",
            f"{r['drive_links_bytes'] / 1e6:.1f} / {csd['drive_links_bytes'] / 1e6:.1f}",
            "yes" if r["agrees"] and csd["agrees"] else "NO",
        )
    console.print(table)


def report_tpch(results: list[dict]) -> None:
    table = Table(title="Figures 8-11: TPC-H latency per way (geometric mean over queries)")
    for column in ("requests", *WAYS.values(), "PCIe MB", "network MB", "all agree"):
        table.add_column(column, justify="right")
    for n in sorted({r["requests"] for r in results}):
        row = [str(n)]
        for way in WAYS:
            mine = [r for r in results if r["requests"] == n and r["way"] == way]
            done = [r["latency_s"] for r in mine if "error" not in r]
            failed = len(mine) - len(done)
            mean = math.exp(statistics.fmean(math.log(x) for x in done)) if done else math.nan
            row.append(f"{mean:.2f}" + (f" ({failed} failed)" if failed else ""))
        mine = [r for r in results if r["requests"] == n]
        pcie = {
            w: sum(r.get("drive_links_bytes", 0) for r in mine if r["way"] == w) / 1e6 for w in WAYS
        }
        net = {w: sum(r.get("network_bytes", 0) for r in mine if r["way"] == w) / 1e6 for w in WAYS}
        row.append(" / ".join(f"{pcie[w]:.0f}" for w in WAYS))
        row.append(" / ".join(f"{net[w]:.0f}" for w in WAYS))
        row.append("yes" if all(r["agrees"] for r in mine) else "NO")
        table.add_row(*row)
    console.print(table)


def draw(path: Path, scan_results: list[dict], tpch_results: list[dict]) -> None:
    panels = (3 if scan_results else 0) + (2 if tpch_results else 0)
    figure, axes = plt.subplots(1, max(panels, 1), figsize=(5.5 * max(panels, 1), 4.5))
    axes = list(axes) if panels > 1 else [axes]
    position = 0
    if scan_results:
        names = list(SCANS)
        for metric, label in (
            ("latency_s", "latency (s)"),
            ("server_cpu_percent", "server CPU (%)"),
            ("drive_links_bytes", "drive links (bytes)"),
        ):
            axis = axes[position]
            position += 1
            series = sorted({(r["drives"], r["compression"], r["way"]) for r in scan_results})
            width = 0.8 / len(series)
            for k, (drives, compression, way) in enumerate(series):
                values = [
                    next(
                        r.get(metric, math.nan)
                        for r in scan_results
                        if (r["drives"], r["compression"], r["way"], r["scan"])
                        == (drives, compression, way, name)
                    )
                    for name in names
                ]
                axis.bar(
                    [i + k * width for i in range(len(names))],
                    values,
                    width,
                    label=f"{drives}d {compression} {WAYS[way]}",
                )
            axis.set_xticks([i + 0.4 for i in range(len(names))], names)
            axis.set_ylabel(label)
            axis.set_title(f"Fig. 6/7: {label}")
        axes[0].legend(fontsize=6)
    if tpch_results:
        for metric, label in (("latency_s", "latency (s)"), ("network_bytes", "network (bytes)")):
            axis = axes[position]
            position += 1
            for way in WAYS:
                for n in sorted({r["requests"] for r in tpch_results}):
                    mine = sorted(
                        (r for r in tpch_results if r["way"] == way and r["requests"] == n),
                        key=lambda r: r["query"],
                    )
                    axis.plot(
                        [r["query"] for r in mine],
                        [r.get(metric, math.nan) for r in mine],
                        marker="o",
                        label=f"{WAYS[way]}, {n} requests",
                    )
            axis.set_yscale("log")
            axis.set_xlabel("TPC-H query")
            axis.set_ylabel(label)
            axis.set_title(f"Fig. 8-11: {label}")
        axes[-1].legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def strip(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "table"} for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each scan (medians)")
    parser.add_argument("--tpch-repeat", type=int, default=1, help="runs of each TPC-H query")
    parser.add_argument("--parts", default="scans,tpch")
    parser.add_argument("--requests", default="32,64,128")
    parser.add_argument("--queries", default=",".join(str(n) for n in range(1, 23)))
    arguments = parser.parse_args()
    parts = {p.strip() for p in arguments.parts.split(",")}
    requests = [int(n) for n in arguments.requests.split(",")]
    queries = [int(n) for n in arguments.queries.split(",")]
    assert parts <= {"scans", "tpch"} and 1 <= arguments.repeat <= 20
    started = time.perf_counter()
    duck = duckdb_with_tpch(arguments.sf)
    data = {
        f"tpch/{t}": duck.execute(f"SELECT * FROM {t}").fetch_arrow_table() for t in TPCH_TABLES
    }
    with tempfile.TemporaryDirectory(prefix="quarry-polardb-") as scratch:
        scan_results = (
            scans(duck, data, arguments.repeat, Path(scratch)) if "scans" in parts else []
        )
    if scan_results:  # kept even if the TPC-H part stops
        partial = {"sf": arguments.sf, "scans": strip(scan_results), "partial": True}
        write_json(NAME, {**partial, "scan_shapes": scan_shapes(scan_results)})
    tpch_results = (
        tpch(duck, data, arguments.tpch_repeat, requests, queries) if "tpch" in parts else []
    )
    payload = {
        "sf": arguments.sf,
        "repeat": arguments.repeat,
        "tpch_repeat": arguments.tpch_repeat,
        "scans": strip(scan_results),
        "tpch": tpch_results,
        "all_agree": all(r["agrees"] for r in scan_results + tpch_results),
        "scan_shapes": scan_shapes(scan_results) if scan_results else {},
        "tpch_shapes": tpch_shapes(tpch_results) if tpch_results else {},
        "elapsed_s": time.perf_counter() - started,
    }
    draw(png_path(NAME), scan_results, tpch_results)
    path = write_json(NAME, payload)
    if scan_results:
        report_scans(scan_results)
    if tpch_results:
        report_tpch(tpch_results)
    console.print_json(data={"scans": payload["scan_shapes"], "tpch": payload["tpch_shapes"]})
    console.print(
        f"all answers agree with DuckDB: {payload['all_agree']}; wrote {path} and "
        f"{png_path(NAME)} in {payload['elapsed_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
