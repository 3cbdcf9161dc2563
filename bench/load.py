"""Load and admission: many concurrent queries, and a user's small scans beside them.

    python bench/load.py [--devices 4] [--concurrency 64] [--rounds 3] [--rows 2000000]

A local cluster holds TPC-H at scale factor ``--sf`` and ``--rows`` particles. First a
foreground stream of small scans (``SELECT id, ke ... WHERE id BETWEEN a AND a + 99``: zone maps
keep it to one slice) runs alone: its latency when idle. Then ``--concurrency`` threads each run
``--rounds`` queries of a mix (TPC-H Q1, Q3, Q5, Q6, Q10, Q12, Q14, Q19; particle queries
``SELECT *`` at 1%, ``sum(ke)``, a group-by) while the foreground stream goes on: its latency
under load. Every answer is checked against DuckDB on the same data; a query that does not
finish within ``--deadline-s`` is a hang.

Devices bound their concurrent exchanges (``device.admission``); beyond it they answer "busy,
retry after N ms" and the coordinator backs off: the run reports how often and how long. The
host gives long queries turns (``coordinator.workload``): it reports how many ran at once and
how many waited.
Writes bench/results/load.json and load.png (latency distributions, idle against loaded).
"""

from __future__ import annotations

import argparse
import decimal
import importlib.util
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import duckdb
import matplotlib
import numpy as np
import pyarrow as pa
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

import quarry
from quarry.device.admission import exchanges_for
from quarry.errors import QuarryError
from quarry.samples import particles

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TPCH = (1, 3, 5, 6, 10, 12, 14, 19)
TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")
FOREGROUND_SQL = "SELECT id, ke FROM physics.particles WHERE id BETWEEN {a} AND {b}"
FOREGROUND_ROWS = 100
IDLE_SAMPLES = 100
FOREGROUND_PAUSE_S = 0.05


def duckdb_with_tpch(sf: float, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """DuckDB with the tpch extension of the pinned ``duckdb-ext-tpch`` package, holding TPC-H
    at ``sf`` (in a file ``database`` when the tables would not fit in memory)."""
    locations = importlib.util.find_spec("duckdb_ext").submodule_search_locations
    folder = os.path.join(list(locations)[0], "extensions")
    con = duckdb.connect(
        database, config={"extension_directory": folder, "autoinstall_known_extensions": False}
    )
    con.execute("LOAD tpch")
    con.execute(f"CALL dbgen(sf={sf})")
    return con


def particle_queries() -> dict[str, str]:
    x = particles.ke_threshold(0.01)
    return {
        "select * 1%": f"SELECT * FROM physics.particles WHERE ke > {x}",
        "sum(ke)": f"SELECT sum(ke) AS s, count(*) AS n FROM physics.particles WHERE ke > {x}",
        "group by": "SELECT id % 100 AS g, avg(ke) AS a FROM physics.particles GROUP BY 1",
    }


def same_rows(actual: pa.Table, expected: pa.Table) -> bool:
    """Equal as bags of rows: floats within 1e-6 relative, decimals within a cent."""
    if actual.num_rows != expected.num_rows or actual.num_columns != expected.num_columns:
        return False
    key = lambda row: tuple(  # noqa: E731
        (0, round(float(v), 2)) if isinstance(v, float | int | decimal.Decimal) else (1, str(v))
        for v in row
    )
    got = sorted((tuple(r.values()) for r in actual.to_pylist()), key=key)
    want = sorted((tuple(r.values()) for r in expected.to_pylist()), key=key)
    return all(_close(a, b) for g, w in zip(got, want) for a, b in zip(g, w))


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float | decimal.Decimal) or isinstance(b, float | decimal.Decimal):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=0.01)
    return a == b


class Foreground:
    """Small scans one after another, each timed and checked, until stopped."""

    def __init__(self, cluster: Any, rows: int):
        self.cluster = cluster
        self.rows = rows
        self.latencies: list[float] = []
        self.wrong = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._count = 0

    def one(self) -> None:
        a = (self._count * 7919) % (self.rows - FOREGROUND_ROWS)
        self._count += 1
        started = time.perf_counter()
        try:
            table = self.cluster.sql(FOREGROUND_SQL.format(a=a, b=a + FOREGROUND_ROWS - 1))
            ids = sorted(table.read_all().column("id").to_pylist())
        except QuarryError as error:
            self.errors.append(str(error)[:200])
            return
        self.latencies.append(time.perf_counter() - started)
        self.wrong += ids != list(range(a, a + FOREGROUND_ROWS))

    def run_until_stopped(self) -> None:
        while not self._stop.is_set():
            self.one()
            self._stop.wait(FOREGROUND_PAUSE_S)

    def stop(self) -> None:
        self._stop.set()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ms = np.array(values) * 1000
    return {
        "count": len(values),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p90_ms": round(float(np.percentile(ms, 90)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "max_ms": round(float(ms.max()), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--deadline-s", type=float, default=1200.0)
    args = parser.parse_args()
    console = Console(stderr=True)

    duck = duckdb_with_tpch(args.sf)
    rows = particles.table(args.rows, seed=5)
    duck.register("particles", rows)
    tpch_sql = dict(duck.execute("SELECT query_nr, query FROM tpch_queries()").fetchall())
    queries = {f"tpch q{n}": tpch_sql[n] for n in TPCH} | particle_queries()
    expected = {
        name: duck.execute(sql.replace("physics.particles", "particles")).fetch_arrow_table()
        for name, sql in queries.items()
    }
    mix = list(queries)

    with quarry.local(devices=args.devices) as cluster:
        with progress(console) as bar:
            task = bar.add_task("ingest", total=len(TABLES) + 1)
            for name in TABLES:
                cluster.ingest(
                    duck.execute(f"SELECT * FROM {name}").fetch_arrow_table(), f"tpch/{name}"
                )
                bar.advance(task)
            cluster.ingest(rows, "physics/particles")
            bar.advance(task)

        idle = Foreground(cluster, args.rows)
        for _ in range(5):  # warm: first plans, connections
            idle.one()
        idle.latencies.clear()
        for _ in range(IDLE_SAMPLES):
            idle.one()

        loaded = Foreground(cluster, args.rows)
        results: list[dict[str, Any]] = []
        lock = threading.Lock()

        def background(worker: int) -> None:
            for round_ in range(args.rounds):
                name = mix[(worker + round_ * 5) % len(mix)]
                started = time.perf_counter()
                try:
                    answer = cluster.sql(queries[name]).read_all()
                    outcome = "right" if same_rows(answer, expected[name]) else "wrong"
                except QuarryError as error:
                    outcome = f"error: {str(error)[:200]}"
                with lock:
                    results.append(
                        {"query": name, "s": time.perf_counter() - started, "outcome": outcome}
                    )
                    bar.advance(task)

        foreground = threading.Thread(target=loaded.run_until_stopped, daemon=True)
        started = time.perf_counter()
        hung = 0
        with progress(console) as bar:
            task = bar.add_task("queries under load", total=args.concurrency * args.rounds)
            foreground.start()
            with ThreadPoolExecutor(args.concurrency) as pool:
                futures = [pool.submit(background, w) for w in range(args.concurrency)]
                for future in futures:
                    try:
                        future.result(
                            timeout=max(1.0, args.deadline_s - (time.perf_counter() - started))
                        )
                    except FutureTimeout:
                        hung += 1
            loaded.stop()
            foreground.join(timeout=60)
        load_s = time.perf_counter() - started
        busy = {
            name: {"retries": device.busy.retries, "waited_s": round(device.busy.waited_s, 2)}
            for name, device in cluster.devices.items()
        }
        host_turns = cluster.workload.status()

    by_query: dict[str, list[float]] = {}
    for result in results:
        by_query.setdefault(result["query"], []).append(result["s"])
    outcomes = [r["outcome"] for r in results]
    body = {
        "devices": args.devices,
        "exchanges_max_per_device": exchanges_for(None),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "particles": args.rows,
        "tpch_sf": args.sf,
        "queries": len(results),
        "right": outcomes.count("right"),
        "wrong": outcomes.count("wrong"),
        "errors": [o for o in outcomes if o.startswith("error")][:10],
        "hangs": hung,
        "load_seconds": round(load_s, 1),
        "queries_per_s": round(len(results) / load_s, 2),
        "foreground_idle": percentiles(idle.latencies),
        "foreground_loaded": percentiles(loaded.latencies),
        "foreground_wrong": idle.wrong + loaded.wrong,
        "foreground_errors": (idle.errors + loaded.errors)[:10],
        "p99_loaded_over_idle": _ratio(loaded.latencies, idle.latencies, 99),
        "p50_loaded_over_idle": _ratio(loaded.latencies, idle.latencies, 50),
        "busy": busy,
        "host_turns": host_turns,
        "per_query": {name: percentiles(values) for name, values in sorted(by_query.items())},
    }
    path = write_json("load", body)
    plot(idle.latencies, loaded.latencies, by_query, png_path("load"))
    console.print(
        f"{body['queries']} queries in {load_s:.1f} s: {body['right']} right, {body['wrong']} "
        f"wrong, {len(body['errors'])} errors, {hung} hangs; foreground p50/p99 idle "
        f"{body['foreground_idle'].get('p50_ms')}/{body['foreground_idle'].get('p99_ms')} ms, "
        f"loaded {body['foreground_loaded'].get('p50_ms')}/"
        f"{body['foreground_loaded'].get('p99_ms')} ms; busy retries "
        f"{sum(b['retries'] for b in busy.values())} -> {path}"
    )


def _ratio(loaded: list[float], idle: list[float], q: int) -> float | None:
    if not loaded or not idle:
        return None
    return round(float(np.percentile(loaded, q) / np.percentile(idle, q)), 2)


def plot(
    idle: list[float], loaded: list[float], by_query: dict[str, list[float]], path: Path
) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for label, values in (("idle", idle), ("under load", loaded)):
        if values:
            ms = np.sort(np.array(values) * 1000)
            left.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=f"{label} (n={len(ms)})")
    left.set_xscale("log")
    left.set_xlabel("foreground small scan latency (ms)")
    left.set_ylabel("fraction of scans")
    left.set_title("A user's small scans, alone and beside the load")
    left.legend()
    names = sorted(by_query)
    right.boxplot(
        [np.array(by_query[n]) for n in names], orientation="horizontal", tick_labels=names
    )
    right.set_xscale("log")
    right.set_xlabel("seconds")
    right.set_title("Background queries under load")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
