"""How time grows with rows and with devices: quarry beside DuckDB on the same particles.

    python bench/scale.py [--rows 20000000,100000000,200000000] [--devices 1,2,4,8,16]
                          [--device-rows 20000000] [--repeat 3]

Part ``rows``: the particle table (id, x, y, z, ke) at each size, written to one Parquet file in
batches (never whole in memory), ingested into 4 devices from that file, and queried by both:
``SELECT sum(ke) ... WHERE ke > X`` at 1% and ``SELECT * ... WHERE ke > X`` at 1%. DuckDB reads
the Parquet file (its page cache as the OS keeps it: past about half of this machine's memory
the file no longer fits beside everything else). Part ``devices``: ``--device-rows`` rows on 1,
2, 4, 8 and 16 devices (the same two queries, ``auto``). Per point: the median time, rows per
second, bytes the devices shipped, and for the row sweep the ratio to DuckDB. Results:
``bench/results/scale.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, png_path, write_json

import quarry
from quarry.samples import particles

console = Console(width=150)
SELECTIVITY = 0.01
ROW_DEVICES = 4


def queries() -> dict[str, str]:
    x = particles.ke_threshold(SELECTIVITY)
    return {
        "sum(ke) 1%": f"SELECT sum(ke) AS s FROM {{table}} WHERE ke > {x}",
        "select * 1%": f"SELECT * FROM {{table}} WHERE ke > {x}",
    }


def write_parquet(rows: int, path: Path) -> int:
    """The table in batches, so no size has to fit in memory; returns the file's bytes."""
    with pq.ParquetWriter(path, particles.SCHEMA) as writer:
        for batch in particles.batches(rows, seed=7):
            writer.write_batch(batch)
    return path.stat().st_size


def quarry_point(cluster, sql: str, repeat: int) -> dict[str, Any]:
    holder: dict[str, Any] = {}

    def run():
        holder["q"] = cluster.query(sql.format(table="physics.particles"), "auto")
        return holder["q"].execute().read_all().num_rows

    seconds, rows_out = median_time(repeat, run)
    analyzed = holder["q"].explain(analyze=True).to_json()["analyze"]
    return {
        "quarry_s": seconds,
        "rows_out": rows_out,
        "bytes_shipped": analyzed["bytes_shipped"],
        "bytes_read": analyzed["bytes_read"],
    }


def rows_sweep(sizes: list[int], repeat: int, folder: Path) -> list[dict[str, Any]]:
    points = []
    for rows in sizes:
        path = folder / f"particles_{rows}.parquet"
        console.print(f"{rows:,} rows: writing Parquet ...")
        file_bytes = write_parquet(rows, path)
        duck = duckdb.connect()
        with quarry.local(devices=ROW_DEVICES, data=folder / f"cluster_{rows}") as cluster:
            started = time.perf_counter()
            cluster.ingest(path, "physics/particles")
            ingest_s = time.perf_counter() - started
            console.print(f"  ingested in {ingest_s:.0f} s")
            for name, sql in queries().items():
                point = quarry_point(cluster, sql, repeat)
                on_file = sql.format(table=f"read_parquet('{path}')")
                duck_s, _ = median_time(
                    repeat, lambda s=on_file, d=duck: d.execute(s).fetch_arrow_table()
                )
                point.update(
                    part="rows",
                    rows=rows,
                    devices=ROW_DEVICES,
                    query=name,
                    duckdb_s=duck_s,
                    ratio=duck_s / point["quarry_s"],
                    rows_per_s=rows / point["quarry_s"],
                    parquet_bytes=file_bytes,
                    ingest_s=ingest_s,
                )
                console.print(
                    f"  {name}: quarry {point['quarry_s']:.2f} s, DuckDB {duck_s:.2f} s, "
                    f"ratio {point['ratio']:.2f}"
                )
                points.append(point)
        duck.close()
        path.unlink()
    return points


def devices_sweep(counts: list[int], rows: int, repeat: int, folder: Path) -> list[dict[str, Any]]:
    points = []
    for devices in counts:
        with quarry.local(devices=devices, data=folder / f"devices_{devices}") as cluster:
            cluster.ingest(particles.reader(rows, seed=7), "physics/particles")
            for name, sql in queries().items():
                point = quarry_point(cluster, sql, repeat)
                point.update(
                    part="devices",
                    rows=rows,
                    devices=devices,
                    query=name,
                    rows_per_s=rows / point["quarry_s"],
                )
                console.print(f"{devices} devices, {name}: {point['quarry_s']:.2f} s")
                points.append(point)
    return points


def draw(path: Path, points: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for name in queries():
        mine = [p for p in points if p["part"] == "rows" and p["query"] == name]
        if mine:
            x = [p["rows"] for p in mine]
            left.plot(x, [p["quarry_s"] for p in mine], "o-", label=f"quarry {name}")
            left.plot(x, [p["duckdb_s"] for p in mine], "s--", label=f"DuckDB {name}")
        mine = [p for p in points if p["part"] == "devices" and p["query"] == name]
        if mine:
            right.plot([p["devices"] for p in mine], [p["quarry_s"] for p in mine], "o-",
                       label=name)  # fmt: skip
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("rows")
    left.set_ylabel("seconds (median)")
    left.set_title(f"time against rows ({ROW_DEVICES} devices)")
    for axis in (left, right):
        if axis.get_legend_handles_labels()[0]:  # a part not run leaves its side empty
            axis.legend(fontsize=8)
    right.set_xscale("log", base=2)
    right.set_xlabel("devices")
    right.set_ylabel("seconds (median)")
    right.set_title("time against devices (same rows)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="20000000,100000000,200000000")
    parser.add_argument("--devices", default="1,2,4,8,16")
    parser.add_argument("--device-rows", type=int, default=20_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parts", default="rows,devices")
    parser.add_argument("--name", default="scale")
    args = parser.parse_args()
    started = time.perf_counter()
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quarry-scale-") as tmp:
        folder = Path(tmp)
        if "rows" in args.parts:
            sizes = [int(n) for n in args.rows.split(",")]
            points += rows_sweep(sizes, args.repeat, folder)
        if "devices" in args.parts:
            counts = [int(n) for n in args.devices.split(",")]
            points += devices_sweep(counts, args.device_rows, args.repeat, folder)
    write_json(args.name, {"points": points, "elapsed_s": time.perf_counter() - started})
    draw(png_path(args.name), points)


if __name__ == "__main__":
    main()
