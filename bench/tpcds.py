"""TPC-DS on a quarry cluster beside DuckDB on the same tables as Parquet files, per query.

    python bench/tpcds.py [--sf 1] [--devices 4] [--repeat 3] [--queries 1,2,...]
                          [--tables DIR]

DuckDB's tpcds extension (the pinned ``duckdb-ext-tpcds`` package) generates the 24 tables
(``dsdgen``, into a file) and gives the 99 queries; each table is written as one Parquet file.
DuckDB answers the queries over views of those files; quarry ingests the same files into a
local cluster of ``--devices`` host-profile devices and answers them under ``pushdown="auto"``.
Per query: the median of ``--repeat`` runs each (after a warm-up run of each), DuckDB's time
over quarry's, bytes the devices shipped, and whether the answers agree. The summary is the
geometric mean of the ratios (issue 34: at least 0.8 at SF 1). Results:
``bench/results/tpcds.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, png_path, progress, write_json
from polardb import same
from tpch import Run, geometric_mean

import quarry
from quarry.errors import QuarryError

console = Console(width=170)


def duckdb_with_tpcds(database: str) -> duckdb.DuckDBPyConnection:
    """DuckDB with the tpcds extension of its pinned package (the ``duckdb_ext`` namespace may
    span several folders)."""
    locations = importlib.util.find_spec("duckdb_ext").submodule_search_locations
    for location in locations:
        folder = os.path.join(location, "extensions")
        if glob.glob(os.path.join(folder, "*", "*", "tpcds.duckdb_extension")):
            connection = duckdb.connect(
                database,
                config={"extension_directory": folder, "autoinstall_known_extensions": False},
            )
            connection.execute("LOAD tpcds")
            return connection
    raise SystemExit("no tpcds extension: install duckdb-ext-tpcds")


def generated(sf: float, folder: Path) -> tuple[list[str], dict[int, str]]:
    """The tables as Parquet files in ``folder`` (generated unless an earlier run left them)
    and the queries' text."""
    texts = folder / "queries.json"
    if texts.exists():
        saved = json.loads(texts.read_text())
        return saved["tables"], {int(n): q for n, q in saved["queries"].items()}
    folder.mkdir(parents=True, exist_ok=True)
    console.print(f"SF {sf}: generating with DuckDB ...")
    connection = duckdb_with_tpcds(str(folder / "generated.duckdb"))
    connection.execute(f"CALL dsdgen(sf={sf})")
    tables = [row[0] for row in connection.execute("SHOW TABLES").fetchall()]
    for name in tables:
        connection.execute(f"COPY {name} TO '{folder / name}.parquet' (FORMAT parquet)")
    queries = dict(connection.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall())
    connection.close()
    (folder / "generated.duckdb").unlink()
    texts.write_text(json.dumps({"tables": tables, "queries": queries}))
    return tables, queries


def run_quarry(cluster: Any, sql: str, repeat: int) -> Run:
    planned: dict[str, Any] = {}

    def run() -> Any:
        planned["query"] = cluster.query(sql, "auto")
        return planned["query"].execute().read_all()

    try:
        seconds, answer = median_time(repeat, run)
    except QuarryError as error:
        return Run(error=f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
    explained = planned["query"].explain(analyze=True).to_json()
    return Run(seconds, answer, explained["analyze"], explained["join_filters"])


def one_scale(
    sf: float, devices: int, repeat: int, numbers: list[int], tables_folder: Path | None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tpcds-") as tmp:
        folder = tables_folder / f"sf{sf:g}" if tables_folder is not None else Path(tmp)
        names, queries = generated(sf, folder)
        duck = duckdb.connect()
        for name in names:
            duck.execute(
                f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{folder / name}.parquet')"
            )
        with quarry.local(devices=devices) as cluster:
            started = time.perf_counter()
            for name in names:
                cluster.ingest(folder / f"{name}.parquet", f"tpcds/{name}")
            ingest_s = time.perf_counter() - started
            console.print(f"  ingested into {devices} devices in {ingest_s:.0f} s")
            os.sync()
            with progress(console) as bar:
                task = bar.add_task(f"SF {sf}: {len(numbers)} queries", total=len(numbers))
                for number in numbers:
                    sql = queries[number]
                    duck_s, expected = median_time(
                        repeat, lambda s=sql: duck.execute(s).fetch_arrow_table()
                    )
                    run = run_quarry(cluster, sql, repeat)
                    rows.append(
                        {
                            "sf": sf,
                            "query": number,
                            "duckdb_s": duck_s,
                            "quarry_s": run.seconds,
                            "ratio": duck_s / run.seconds if run.seconds else None,
                            "bytes_shipped": run.analyzed.get("bytes_shipped"),
                            "bytes_read": run.analyzed.get("bytes_read"),
                            "bytes_cached": run.analyzed.get("bytes_cached"),
                            "error": run.error,
                            "agree": run.error is None and same(run.answer, expected),
                        }
                    )
                    bar.advance(task)
        duck.close()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_sf: dict[str, Any] = {}
    for sf in sorted({r["sf"] for r in rows}):
        mine = [r for r in rows if r["sf"] == sf]
        by_sf[str(sf)] = {
            "geometric_mean_duckdb_over_quarry": geometric_mean(
                [r["ratio"] for r in mine if r["ratio"]]
            ),
            "failed": [r["query"] for r in mine if r["error"]],
            "disagree": [r["query"] for r in mine if not r["agree"] and not r["error"]],
            "duckdb_total_s": sum(r["duckdb_s"] for r in mine),
            "quarry_total_s": sum(r["quarry_s"] or 0 for r in mine),
            "queries": len(mine),
        }
    return by_sf


def report(rows: list[dict[str, Any]], summed: dict[str, Any]) -> None:
    table = Table(title="TPC-DS: DuckDB on Parquet / quarry (auto), per query")
    for column in ("SF", "query", "DuckDB s", "quarry s", "DuckDB / quarry", "MB", "agree"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r["sf"]),
            f"Q{r['query']}",
            f"{r['duckdb_s']:.3f}",
            "failed" if r["quarry_s"] is None else f"{r['quarry_s']:.3f}",
            "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
            "-" if r["bytes_shipped"] is None else f"{r['bytes_shipped'] / 1e6:.1f}",
            "yes" if r["agree"] else "NO",
        )
    console.print(table)
    for sf, s in summed.items():
        console.print(
            f"SF {sf}: geometric mean DuckDB/quarry {s['geometric_mean_duckdb_over_quarry']:.2f}; "
            f"totals {s['duckdb_total_s']:.1f} s / {s['quarry_total_s']:.1f} s; failed "
            f"{s['failed']}, disagree {s['disagree']}"
        )


def draw(path: Path, rows: list[dict[str, Any]], summed: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = sorted({r["sf"] for r in rows})
    figure, axes = plt.subplots(len(scales), 1, figsize=(22, 4 * len(scales)), squeeze=False)
    for axis, sf in zip(axes[:, 0], scales, strict=True):
        mine = [r for r in rows if r["sf"] == sf]
        x = range(len(mine))
        axis.bar([i - 0.2 for i in x], [r["duckdb_s"] for r in mine], 0.4, label="DuckDB")
        axis.bar([i + 0.2 for i in x], [r["quarry_s"] or 0 for r in mine], 0.4, label="quarry")
        axis.set_xticks(list(x), [str(r["query"]) for r in mine], fontsize=6)
        axis.set_yscale("log")
        axis.set_ylabel("seconds (median)")
        mean = summed[str(sf)]["geometric_mean_duckdb_over_quarry"]
        axis.set_title(f"TPC-DS SF {sf}: geometric mean of DuckDB / quarry = {mean:.2f}")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", default="1", help="scale factors, comma-separated")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queries", default=",".join(str(n) for n in range(1, 100)))
    parser.add_argument("--name", default="tpcds")
    parser.add_argument("--tables", type=Path, help="keep the Parquet files here, and reuse them")
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
