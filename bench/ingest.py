"""Ingest throughput: quarry (4 local devices) beside pyarrow.parquet.write_table, one run.

    python bench/ingest.py [--rows N] [--devices N] [--repeat K]

Both write the same in-memory particle table; quarry's figure includes slicing, zone maps,
Flight transfer to device processes, LMDB commits and the two-phase commit. Ratios > 1 mean
quarry is slower than writing one local Parquet file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import matplotlib
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

import quarry
from quarry.samples import particles

matplotlib.use("Agg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    table = particles.table(args.rows)
    megabytes = table.nbytes / 1e6
    runs = []
    with tempfile.TemporaryDirectory() as tmp, quarry.local(devices=args.devices) as cluster:
        for compression in ("none", "zstd"):
            for attempt in range(args.repeat):
                started = time.perf_counter()
                pq.write_table(
                    table,
                    Path(tmp) / "p.parquet",
                    compression=None if compression == "none" else compression,
                )
                parquet_s = time.perf_counter() - started
                name = f"bench/ingest_{compression}_{attempt}"
                started = time.perf_counter()
                cluster.ingest(table, name.replace("bench/", "bench/"), compression=compression)
                quarry_s = time.perf_counter() - started
                cluster.drop(name)
                runs.append(
                    {
                        "compression": compression,
                        "attempt": attempt,
                        "quarry_s": quarry_s,
                        "parquet_s": parquet_s,
                    }
                )
                print(
                    f"{compression:5s} #{attempt}: quarry {megabytes / quarry_s:7.1f} MB/s   "
                    f"parquet {megabytes / parquet_s:7.1f} MB/s   "
                    f"ratio {quarry_s / parquet_s:5.2f}x"
                )
    summary = {}
    for compression in ("none", "zstd"):
        chosen = [r for r in runs if r["compression"] == compression]
        quarry_s = min(r["quarry_s"] for r in chosen)
        parquet_s = min(r["parquet_s"] for r in chosen)
        summary[compression] = {
            "quarry_mb_per_s": megabytes / quarry_s,
            "parquet_mb_per_s": megabytes / parquet_s,
            "time_ratio_quarry_over_parquet": quarry_s / parquet_s,
        }
    path = write_json(
        "ingest",
        {
            "rows": args.rows,
            "megabytes_arrow": megabytes,
            "devices": args.devices,
            "runs": runs,
            "best": summary,
        },
    )
    _plot(summary)
    print(f"wrote {path}")


def _plot(summary: dict) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = list(summary)
    x = range(len(labels))
    ax.bar(
        [i - 0.2 for i in x],
        [summary[k]["quarry_mb_per_s"] for k in labels],
        0.4,
        label="quarry ingest (4 devices)",
    )
    ax.bar(
        [i + 0.2 for i in x],
        [summary[k]["parquet_mb_per_s"] for k in labels],
        0.4,
        label="pyarrow.parquet.write_table",
    )
    ax.set_xticks(list(x), [f"compression: {k}" for k in labels])
    ax.set_ylabel("throughput (MB/s of Arrow data)")
    ax.set_title("Ingest throughput, same table, one run")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path("ingest"), dpi=120)


if __name__ == "__main__":
    main()
