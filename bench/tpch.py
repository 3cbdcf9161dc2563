"""TPC-H on a quarry cluster beside DuckDB on the same tables as Parquet files, per query.

    python bench/tpch.py [--sf 1,10] [--devices 4] [--repeat 3] [--queries 1,2,...]
                         [--tables DIR]

For each scale factor DuckDB generates the eight tables (``dbgen``, spilling to a file) and
writes one Parquet file per table. DuckDB then answers the 22 queries over views of those files
(what a user with the data on local disk gets); quarry ingests the same files into a local
cluster (``--devices`` host-profile devices) and answers them with ``pushdown="auto"``. For each
query: the median of ``--repeat`` runs each (after one warm-up run of each), the ratio DuckDB
time / quarry time, bytes the devices shipped to the host, and whether the answers agree; and
quarry again without join keys (``join_filters=False``), time and bytes, side by side. The
summary is the geometric mean of the ratios per scale factor (issue 14: at least 0.8 at SF 1,
at least 1 at SF 10). Results: ``bench/results/tpch.json`` and ``.png``.

Beside them, the engine's bound: DataFusion (the engine every device and the host run) over the
same tables held in memory in one process, on every core, with no store, slices, devices or
transport: what quarry's own machinery costs on top of its engine. Up to SF 1
(``ENGINE_BOUND_SF_MAX``): past that the tables in memory beside the cluster's store would not
fit this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, png_path, progress, write_json
from load import duckdb_with_tpch
from polardb import TPCH_TABLES, same

import quarry
from quarry.errors import QuarryError

console = Console(width=170)
ENGINE_BOUND_SF_MAX = 1.0
BATCH_ROWS = 65_536


def generate(sf: float, folder: Path) -> dict[int, str]:
    """The eight tables as Parquet files in ``folder``; the 22 queries' text."""
    generator = duckdb_with_tpch(sf, str(folder / "generated.duckdb"))
    for name in TPCH_TABLES:
        generator.execute(f"COPY {name} TO '{folder / name}.parquet' (FORMAT parquet)")
    queries = dict(generator.execute("SELECT query_nr, query FROM tpch_queries()").fetchall())
    generator.close()
    (folder / "generated.duckdb").unlink()
    return queries


def on_parquet(folder: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB over the Parquet files, as a user with them on local disk would query them."""
    connection = duckdb.connect()
    for name in TPCH_TABLES:
        connection.execute(
            f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{folder / name}.parquet')"
        )
    return connection


def generated(sf: float, folder: Path) -> dict[int, str]:
    """The tables in ``folder``, generated there unless an earlier run left them (with the
    queries' text beside them)."""
    texts = folder / "queries.json"
    if texts.exists() and all((folder / f"{name}.parquet").exists() for name in TPCH_TABLES):
        console.print(f"SF {sf}: the tables in {folder}")
        return {int(n): q for n, q in json.loads(texts.read_text()).items()}
    folder.mkdir(parents=True, exist_ok=True)
    console.print(f"SF {sf}: generating with DuckDB ...")
    started = time.perf_counter()
    queries = generate(sf, folder)
    texts.write_text(json.dumps(queries))
    console.print(f"  {time.perf_counter() - started:.0f} s")
    return queries


def one_scale(
    sf: float, devices: int, repeat: int, numbers: list[int], tables: Path | None = None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tpch-") as tmp:
        folder = tables / f"sf{sf:g}" if tables is not None else Path(tmp)
        queries = generated(sf, folder)
        duck = on_parquet(folder)
        with quarry.local(devices=devices) as cluster:
            started = time.perf_counter()
            for name in TPCH_TABLES:
                cluster.ingest(folder / f"{name}.parquet", f"tpch/{name}")
            ingest_s = time.perf_counter() - started
            console.print(f"  ingested into {devices} devices in {ingest_s:.0f} s")
            # the ingest's pages reach the disk now, not while the first queries are timed (a
            # run right after SF 10's 13 GB timed quarry's Q1 at 3.5 s, 2.6 s a while later)
            os.sync()
            with progress(console) as bar:
                task = bar.add_task(f"SF {sf}: 22 queries", total=len(numbers))
                for number in numbers:
                    sql = queries[number]
                    duck_s, expected = median_time(
                        repeat, lambda s=sql: duck.execute(s).fetch_arrow_table()
                    )
                    cut = _quarry(cluster, sql, repeat, True)
                    plain = _quarry(cluster, sql, repeat, False)
                    rows.append(
                        {
                            "sf": sf,
                            "query": number,
                            "duckdb_s": duck_s,
                            "quarry_s": cut.seconds,
                            "ratio": duck_s / cut.seconds if cut.seconds else None,
                            "bytes_shipped": cut.analyzed.get("bytes_shipped"),
                            "bytes_read": cut.analyzed.get("bytes_read"),
                            "bytes_cached": cut.analyzed.get("bytes_cached"),
                            "join_keys": cut.pairs,
                            "error": cut.error,
                            "no_join_keys_s": plain.seconds,
                            "no_join_keys_bytes_shipped": plain.analyzed.get("bytes_shipped"),
                            "no_join_keys_error": plain.error,
                            "agree": cut.agrees(expected) and plain.agrees(expected),
                            "ingest_s": ingest_s,
                        }
                    )
                    bar.advance(task)
        duck.close()
        if sf <= ENGINE_BOUND_SF_MAX:
            console.print(f"SF {sf}: DataFusion over the tables in memory ...")
            bound = engine_bound(folder, queries, numbers, repeat)
            for row in rows:
                row["datafusion_memory_s"] = bound.get(row["query"])
    return rows


def engine_bound(
    folder: Path, queries: dict[int, str], numbers: list[int], repeat: int
) -> dict[int, float | None]:
    """Each query's median seconds in DataFusion alone over the tables in memory, one process,
    every core (None: DataFusion could not run it)."""
    import os

    import datafusion
    import pyarrow.parquet as pq

    config = datafusion.SessionConfig().with_target_partitions(len(os.sched_getaffinity(0)))
    context = datafusion.SessionContext(config)
    for name in TPCH_TABLES:
        table = pq.read_table(folder / f"{name}.parquet")
        context.register_record_batches(name, [table.to_batches(max_chunksize=BATCH_ROWS)])
    seconds: dict[int, float | None] = {}
    for number in numbers:
        try:
            seconds[number], _ = median_time(
                repeat, lambda s=queries[number]: context.sql(s).collect()
            )
        except Exception:  # a query the engine alone cannot run is a result
            seconds[number] = None
    return seconds


@dataclass
class Run:
    """quarry's median seconds, answer, EXPLAIN ANALYZE and join keys; or why it failed."""

    seconds: float | None = None
    answer: Any = None
    analyzed: dict = field(default_factory=dict)
    pairs: list = field(default_factory=list)
    error: str | None = None

    def agrees(self, expected: Any) -> bool:
        return self.error is not None or same(self.answer, expected)


def _quarry(cluster: Any, sql: str, repeat: int, join_keys: bool) -> Run:
    """The query under auto, with or without join keys. A failure (a super-plan past the host's
    memory budget) is a result, not the end of the benchmark."""
    planned: dict[str, Any] = {}

    def run() -> Any:
        planned["query"] = cluster.query(sql, "auto", join_filters=join_keys)
        return planned["query"].execute().read_all()

    try:
        seconds, answer = median_time(repeat, run)
    except QuarryError as error:
        return Run(error=f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
    explained = planned["query"].explain(analyze=True).to_json()
    return Run(seconds, answer, explained["analyze"], explained["join_filters"])


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_sf: dict[str, Any] = {}
    for sf in sorted({r["sf"] for r in rows}):
        mine = [r for r in rows if r["sf"] == sf]
        by_sf[str(sf)] = {
            "geometric_mean_duckdb_over_quarry": geometric_mean(
                [r["ratio"] for r in mine if r["ratio"]]
            ),
            "geometric_mean_duckdb_over_quarry_without_join_keys": geometric_mean(
                [r["duckdb_s"] / r["no_join_keys_s"] for r in mine if r["no_join_keys_s"]]
            ),
            "failed": [r["query"] for r in mine if r["error"]],
            "failed_without_join_keys": [r["query"] for r in mine if r["no_join_keys_error"]],
            "bytes_shipped": sum(r["bytes_shipped"] or 0 for r in mine),
            "bytes_shipped_without_join_keys": sum(
                r["no_join_keys_bytes_shipped"] or 0 for r in mine
            ),
            "quarry_total_s": sum(r["quarry_s"] or 0 for r in mine),
            "geometric_mean_duckdb_over_datafusion_in_memory": _bound_mean(mine),
            "duckdb_total_s": sum(r["duckdb_s"] for r in mine),
            "all_agree": all(r["agree"] for r in mine),
            "queries": len(mine),
        }
    return by_sf


def _bound_mean(rows: list[dict[str, Any]]) -> float | None:
    bound = [r["duckdb_s"] / r["datafusion_memory_s"] for r in rows if r.get("datafusion_memory_s")]
    return geometric_mean(bound) if bound else None


def report(rows: list[dict[str, Any]], summed: dict[str, Any]) -> None:
    table = Table(title="TPC-H: DuckDB on Parquet / quarry (auto), per query")
    columns = ("SF", "query", "DuckDB s", "quarry s", "DuckDB / quarry", "shipped MB")
    for column in (*columns, "no join keys: s", "MB", "DataFusion in memory s", "agree"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r["sf"]),
            f"Q{r['query']}",
            f"{r['duckdb_s']:.3f}",
            _shown(r["quarry_s"], "{:.3f}"),
            _shown(r["ratio"], "{:.2f}"),
            _shown(r["bytes_shipped"] and r["bytes_shipped"] / 1e6, "{:.1f}"),
            _shown(r["no_join_keys_s"], "{:.3f}"),
            _shown(
                r["no_join_keys_bytes_shipped"] and r["no_join_keys_bytes_shipped"] / 1e6, "{:.1f}"
            ),
            "-" if r.get("datafusion_memory_s") is None else f"{r['datafusion_memory_s']:.3f}",
            "yes" if r["agree"] else "NO",
        )
    console.print(table)
    for sf, s in summed.items():
        console.print(
            f"SF {sf}: geometric mean DuckDB/quarry {s['geometric_mean_duckdb_over_quarry']:.2f} "
            f"({s['geometric_mean_duckdb_over_quarry_without_join_keys']:.2f} without join keys); "
            f"shipped {s['bytes_shipped'] / 1e6:.0f} MB "
            f"({s['bytes_shipped_without_join_keys'] / 1e6:.0f} MB without); "
            f"totals {s['duckdb_total_s']:.1f} s / {s['quarry_total_s']:.1f} s; "
            f"all agree: {s['all_agree']}"
        )
        if s["geometric_mean_duckdb_over_datafusion_in_memory"] is not None:
            console.print(
                f"SF {sf}: the engine alone over the tables in memory: geometric mean DuckDB / "
                f"DataFusion {s['geometric_mean_duckdb_over_datafusion_in_memory']:.2f}"
            )


def _shown(value: float | None, form: str) -> str:
    return "failed" if value is None else form.format(value)


def draw(path: Path, rows: list[dict[str, Any]], summed: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = sorted({r["sf"] for r in rows})
    figure, axes = plt.subplots(len(scales), 1, figsize=(13, 4 * len(scales)), squeeze=False)
    for axis, sf in zip(axes[:, 0], scales, strict=True):
        mine = [r for r in rows if r["sf"] == sf]
        x = range(len(mine))
        axis.bar(
            [i - 0.27 for i in x], [r["duckdb_s"] for r in mine], 0.27, label="DuckDB (Parquet)"
        )
        cut = [r["quarry_s"] or 0 for r in mine]
        axis.bar([i for i in x], cut, 0.27, label="quarry (auto)")
        plain = [r["no_join_keys_s"] or 0 for r in mine]
        axis.bar([i + 0.27 for i in x], plain, 0.27, label="quarry, no join keys")
        bound = [r.get("datafusion_memory_s") for r in mine]
        if any(bound):
            axis.scatter(
                list(x),
                [b or float("nan") for b in bound],
                marker="_",
                s=300,
                color="black",
                label="DataFusion alone, tables in memory",
                zorder=3,
            )
        axis.set_xticks(list(x), [f"Q{r['query']}" for r in mine])
        axis.set_yscale("log")
        axis.set_ylabel("seconds (median)")
        mean = summed[str(sf)]["geometric_mean_duckdb_over_quarry"]
        axis.set_title(f"TPC-H SF {sf}: geometric mean of DuckDB / quarry = {mean:.2f}")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", default="1,10", help="scale factors, comma-separated")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queries", default=",".join(str(n) for n in range(1, 23)))
    parser.add_argument("--name", default="tpch")
    parser.add_argument(
        "--tables", type=Path, help="keep the generated Parquet files here (sfN/), and reuse them"
    )
    args = parser.parse_args()
    numbers = [int(n) for n in args.queries.split(",")]
    started = time.perf_counter()
    rows = []
    for sf in (float(s) for s in args.sf.split(",")):
        rows.extend(one_scale(sf, args.devices, args.repeat, numbers, args.tables))
    summed = summary(rows)
    report(rows, summed)
    write_json(
        args.name,
        {
            "devices": args.devices,
            "repeat": args.repeat,
            "rows": rows,
            "summary": summed,
            "elapsed_s": time.perf_counter() - started,
        },
    )
    draw(png_path(args.name), rows, summed)


if __name__ == "__main__":
    main()
