"""What redundancy costs: replicas 1, 2, 3 beside erasure-coded EC 4+2 and 8+2 (issue 33).

On one cluster of ten host-profile devices, the same particle table stored five ways:

1. Stored bytes: data and parity (or every replica), against one copy, beside the ideal
   (K + M) / K; and ingest throughput of each.
2. Query time (median of a few runs of three queries, pushdown auto, the layouts taking
   turns run by run): healthy; with one device lost; with two lost (M for both codes;
   replicas 2 loses data with two); replicas 2 with one lost beside them. A degraded read
   rebuilds each lost slice on the host from K survivors: its physical bound is K slices
   read and shipped per slice rebuilt, and one decode.
3. Rebuild throughput: a lost partition rebuilt on the host (read K survivors, decode, check),
   whole and one column of it (that column's run of each stripe), and ``quarry repair``
   (rebuilt and written to a live device), beside the library's raw decode rate; zfec and
   pyeclib (where installed) encode and decode rates at 4+2 and 8+2.

Writes bench/results/redundancy.json and .png. Run: python bench/redundancy.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

import quarry
from quarry.coordinator.reads.degraded import Rebuilder
from quarry.samples import particles
from quarry.store import parity

DEVICES = 10
LAYOUTS = (  # name, ingest options
    ("replicas 1", {"replicas": 1}),
    ("replicas 2", {"replicas": 2}),
    ("replicas 3", {"replicas": 3}),
    ("EC 4+2", {"redundancy": "ec:4+2"}),
    ("EC 8+2", {"redundancy": "ec:8+2"}),
)
QUERIES = (
    "SELECT count(*) AS n, sum(ke) AS ke FROM b.{name}",
    "SELECT floor(x) AS b, count(*) AS n, avg(ke) AS ke FROM b.{name} GROUP BY 1",
    "SELECT id, ke FROM b.{name} WHERE ke > 9.5",
)
BLOCK_BYTES = 1 << 20
ONE_COLUMN = "ke"  # a degraded read of one column rebuilds its bytes only
console = Console(stderr=True)


def _dataset(layout: str) -> str:
    return layout.replace(" ", "_").replace("+", "_").lower()


def stored_bytes(entry: Any) -> dict[str, Any]:
    data = sum(p.bytes_stored for p in entry.partitions)
    total = sum(p.bytes_stored * len(p.devices) for p in entry.partitions)
    total += entry.parity_bytes_stored
    code = parity.parse(entry.redundancy) if entry.redundancy.startswith("ec:") else None
    ideal = code.overhead if code else float(entry.ingests[0].replicas)
    return {
        "data_bytes": data,
        "stored_bytes": total,
        "overhead": total / data,
        "ideal_overhead": ideal,
        "partitions": len(entry.partitions),
        "parity_partitions": len(entry.parity),
    }


def query_times(cluster: Any, layouts: list[str], repeats: int) -> dict[str, float]:
    """Seconds for the three queries on each layout, each the median of ``repeats`` runs. The
    layouts take turns, run by run, so each meets the same machine (a shared one drifts)."""
    runs: dict[tuple[str, str], list[float]] = {(n, sql): [] for n in layouts for sql in QUERIES}
    for _ in range(repeats):
        for name in layouts:
            for sql in QUERIES:
                started = time.perf_counter()
                cluster.sql(sql.format(name=_dataset(name)), pushdown="auto").read_all()
                runs[(name, sql)].append(time.perf_counter() - started)
    return {n: sum(statistics.median(runs[(n, sql)]) for sql in QUERIES) for n in layouts}


def code_rates(repeats: int) -> list[dict[str, Any]]:
    """Encode and decode GB/s (of data) of zfec, and of pyeclib's backends where installed, on
    blocks of 1 MiB, one data block lost."""
    import zfec

    rows = []
    for k, m in ((4, 2), (8, 2)):
        blocks = [os.urandom(BLOCK_BYTES) for _ in range(k)]
        code = parity.Code(k, m)
        data_bytes = k * BLOCK_BYTES
        encode_s = _best(repeats, lambda code=code, blocks=blocks: parity.encode(code, blocks))
        coded, length = parity.encode(code, blocks)
        kept = {n: b for n, b in enumerate(blocks) if n != 0} | {k: coded[0]}
        decode_s = _best(
            repeats, lambda code=code, kept=kept, length=length: parity.decode(code, kept, length)
        )
        version = getattr(zfec, "__version__", "")
        rows.append(_rate(f"zfec {version}", k, m, data_bytes, encode_s, decode_s))
        rows.extend(_pyeclib(k, m, blocks, repeats))
    return rows


def _pyeclib(k: int, m: int, blocks: list[bytes], repeats: int) -> list[dict[str, Any]]:
    try:
        from pyeclib.ec_iface import ECDriver
    except ImportError:
        console.print("pyeclib is not installed: left out")
        return []
    rows = []
    data = b"".join(blocks)
    for backend in ("isa_l_rs_vand", "liberasurecode_rs_vand"):
        try:
            driver = ECDriver(k=k, m=m, ec_type=backend)
        except Exception as error:  # a backend this build lacks
            console.print(f"pyeclib {backend}: {error}")
            continue
        fragments = driver.encode(data)
        encode_s = _best(repeats, lambda driver=driver: driver.encode(data))
        survivors = fragments[1 : k + 1]
        decode_s = _best(repeats, lambda driver=driver, kept=survivors: driver.decode(kept))
        rows.append(_rate(f"pyeclib 1.8.0 {backend}", k, m, len(data), encode_s, decode_s))
    return rows


def _rate(library: str, k: int, m: int, data: int, encode_s: float, decode_s: float) -> dict:
    return {
        "library": library,
        "code": f"{k}+{m}",
        "encode_gb_per_s": data / encode_s / 1e9,
        "decode_gb_per_s": data / decode_s / 1e9,
    }


def _best(repeats: int, run: Any) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def rebuild_rate(cluster: Any, dataset: str) -> dict[str, Any]:
    """A lost data partition rebuilt on the host, whole: its bytes per second, and what was
    read to rebuild it (K slices per slice)."""
    entry = cluster.entry(dataset)
    lost = next(p for p in entry.partitions if p.lost)
    rebuilder = Rebuilder.of(cluster, lost)
    started = time.perf_counter()
    rows = sum(b.num_rows for b in rebuilder.scan(entry.domain, entry.name, lost.partition))
    seconds = time.perf_counter() - started
    rebuilt = sum(s.bytes_stored for s in rebuilder.meta().slices)
    one = Rebuilder.of(cluster, lost)  # one column of five: its run of each stripe only
    started = time.perf_counter()
    for _ in one.scan(entry.domain, entry.name, lost.partition, columns=[ONE_COLUMN]):
        pass
    one_s = time.perf_counter() - started
    column = sum(s.columns[entry.schema.get_field_index(ONE_COLUMN)] for s in one.meta().slices)
    return {
        "rows": rows,
        "bytes_rebuilt": rebuilt,
        "bytes_read": rebuilder.bytes_read,
        "read_per_rebuilt": rebuilder.bytes_read / max(1, rebuilt),
        "seconds": seconds,
        "decode_s": rebuilder.decode_s,
        "bytes_per_s": rebuilt / seconds,
        "one_column": {
            "column": ONE_COLUMN,
            "bytes_rebuilt": column,
            "bytes_read": one.bytes_read,
            "read_share_of_whole": one.bytes_read / max(1, rebuilder.bytes_read),
            "seconds": one_s,
            "decode_s": one.decode_s,
        },
    }


def run(rows: int, repeats: int) -> dict[str, Any]:
    table = particles.table(rows, seed=11)
    results: dict[str, Any] = {"rows": rows, "table_bytes": table.nbytes, "devices": DEVICES}
    layouts: dict[str, dict[str, Any]] = {}
    with quarry.local(devices=DEVICES) as cluster:
        for layout, options in LAYOUTS:
            name = _dataset(layout)
            started = time.perf_counter()
            entry = cluster.ingest(table, f"b/{name}", **options)
            seconds = time.perf_counter() - started
            layouts[layout] = {
                **stored_bytes(entry),
                "ingest_s": seconds,
                "ingest_mb_per_s": table.nbytes / seconds / 1e6,
            }
            console.print(f"{layout}: stored {layouts[layout]['overhead']:.2f}x, {seconds:.1f} s")
        names = [layout for layout, _ in LAYOUTS]
        query_times(cluster, names, 1)  # once to warm up (plans, sampled slices, page cache)
        for layout, seconds in query_times(cluster, names, repeats).items():
            layouts[layout]["query_healthy_s"] = seconds
        victims = _victims(cluster)
        cluster.kill_device(victims[0])
        cluster.refresh()
        for layout, seconds in query_times(cluster, names[1:], repeats).items():
            layouts[layout]["query_one_lost_s"] = seconds
        rebuilds = {
            layout: rebuild_rate(cluster, f"b/{_dataset(layout)}") for layout, _ in LAYOUTS[3:]
        }
        cluster.kill_device(victims[1])
        cluster.refresh()
        for layout, seconds in query_times(cluster, [names[2], *names[3:]], repeats).items():
            layouts[layout]["query_two_lost_s"] = seconds
        started = time.perf_counter()
        repaired = cluster.repair(bandwidth_bytes_per_s=1e12)
        repair_s = time.perf_counter() - started
    rebuilt = [c for c in repaired.copied if c.get("rebuilt_from")]
    results["repair"] = {
        "seconds": repair_s,
        "partitions_rebuilt": len(rebuilt),
        "bytes_rebuilt": sum(c["bytes"] for c in rebuilt),
        "partitions_copied": len(repaired.copied) - len(rebuilt),
        "bytes_copied": repaired.bytes_copied,
        "failed": repaired.failed,
    }
    results["victims"] = victims
    results["layouts"] = layouts
    results["rebuild"] = rebuilds
    for layout, rebuild in rebuilds.items():
        lost_share = rebuild["bytes_rebuilt"] / layouts[layout]["data_bytes"]
        k = parity.parse("ec:" + layout.split()[1]).k
        # a degraded read moves K slices per slice rebuilt: the bytes of the whole query grow
        # from 1 to 1 + (K - 1) x the lost share
        rebuild["degraded_bytes_bound"] = 1 + (k - 1) * lost_share
        rebuild["lost_share"] = lost_share
        rebuild["k"] = k
    return results


def _victims(cluster: Any) -> list[str]:
    """Two devices holding data of both erasure-coded datasets (their degraded reads)."""
    held = []
    for layout in ("EC 4+2", "EC 8+2"):
        entry = cluster.entry(f"b/{_dataset(layout)}")
        held.append({p.devices[0] for p in entry.partitions})
    both = sorted(held[0] & held[1])
    return both[:2]


def plot(results: dict[str, Any], rates: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = results["layouts"]
    names = list(layouts)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    ax.bar(names, [layouts[n]["overhead"] for n in names], label="stored / data")
    ax.plot(names, [layouts[n]["ideal_overhead"] for n in names], "k_", ms=30, label="ideal")
    ax.set_ylabel("bytes stored per byte of data")
    ax.set_title("stored bytes")
    ax.legend()
    ax = axes[1]
    width = 0.27
    for i, (key, label) in enumerate(
        (
            ("query_healthy_s", "healthy"),
            ("query_one_lost_s", "1 lost"),
            ("query_two_lost_s", "2 lost"),
        )
    ):
        xs = [j + (i - 1) * width for j in range(len(names))]
        ax.bar(xs, [layouts[n].get(key, 0.0) for n in names], width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("seconds, three queries")
    ax.set_title("query time (replicas 1 and 2 lose data with 1 and 2 lost)")
    ax.legend()
    ax = axes[2]
    bars = {f"rebuild {k}": v["bytes_per_s"] / 1e9 for k, v in results["rebuild"].items()}
    if results["repair"]["seconds"]:
        bars["repair (all)"] = (
            results["repair"]["bytes_copied"] / results["repair"]["seconds"] / 1e9
        )
    for row in rates:
        library = row["library"].replace(" 1.8.0", "").replace(" 1.6.0.0", "")
        bars[f"{library} {row['code']} decode"] = row["decode_gb_per_s"]
    ax.barh(list(bars), list(bars.values()))
    ax.set_xlabel("GB/s")
    ax.set_title("rebuild on the host vs raw decode")
    fig.tight_layout()
    path = png_path("redundancy")
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small table, few repeats")
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    rows = 200_000 if args.quick else args.rows
    repeats = 2 if args.quick else 5
    rates = code_rates(repeats)
    results = run(rows, repeats)
    results["code_rates"] = rates
    json_path = write_json("redundancy", results)
    console.print(f"wrote {json_path} and {plot(results, rates)}")


if __name__ == "__main__":
    main()
