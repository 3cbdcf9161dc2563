"""What checking every slice's checksum costs a device, beside what reading it costs anyway.

Two parts, on this machine:

1. Hash rates: XXH3-64 (xxhash, the one quarry uses), XXH64, CRC-32C (the crc32c package and
   google-crc32c where installed) and zlib's CRC-32, over buffers of 64 KiB (in cache) to
   64 MiB (out of it), GB/s: why XXH3-64.
2. CPU seconds per GB of stored slice bytes, on the device's own read path
   (``store.partition.fetch_slice`` then ``decode_read``) over a particle table stored as a
   device stores it (4 MiB key-values), uncompressed and zstd: reading the bytes off LMDB
   (page cache), checking their checksums, decoding them, and a query's work on them
   (DataFusion, ``SELECT count(*), sum(ke) ... WHERE ke > 10`` over chunks of 16 slices, as a
   device runs a sub-plan). Also ``decode_read`` as a whole with the checksums and without
   them (a partition written before checksums): the overhead in the very code that runs.
   The verify share is verify / (read + verify + decode + query). And where the check costs
   what it does: each stream hashed a second time at once (from cache), and the scan with
   its checks made after the query ran over the chunk instead of before it.

Writes bench/results/checksum.json and .png. Run: python bench/checksum.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, write_json

from quarry.samples import particles
from quarry.store import checksum
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore

SIZES = (64 << 10, 1 << 20, 4 << 20, 64 << 20)
KV_BYTES_MAX = 4 << 20  # the host profile's key-value size: slices of about 4 MiB
CHUNK_SLICES = 16
REPEATS = 5
console = Console(stderr=True)


def _hashers() -> dict[str, Callable[[Any], Any]]:
    hashers: dict[str, Callable[[Any], Any]] = {
        "xxh3_64 (xxhash, quarry's)": xxhash.xxh3_64_intdigest,
        "xxh64 (xxhash)": xxhash.xxh64_intdigest,
    }
    try:
        import crc32c

        hashers[
            f"crc32c (crc32c {crc32c.__version__ if hasattr(crc32c, '__version__') else ''})"
        ] = crc32c.crc32c
    except ImportError:
        console.print("crc32c (the package) is not installed: left out")
    try:
        import google_crc32c

        hashers["crc32c (google-crc32c, copies first)"] = lambda b: google_crc32c.value(bytes(b))
    except ImportError:
        console.print("google-crc32c is not installed: left out")
    hashers["crc32 (zlib)"] = zlib.crc32
    return hashers


def hash_rates(repeats: int) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(1)
    for size in SIZES:
        data = pa.py_buffer(rng.bytes(size))
        times = max(1, (256 << 20) // size)  # about 256 MiB hashed per figure
        for name, hasher in _hashers().items():
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(times):
                    hasher(data)
                best = min(best, time.perf_counter() - started)
            rate = size * times / best / 1e9
            rows.append({"algorithm": name, "bytes": size, "gb_per_s": round(rate, 2)})
            console.print(f"{name:40s} {size >> 10:>7} KiB  {rate:6.1f} GB/s")
    return rows


def _store(folder: Path, table: pa.Table, compression: str) -> tuple[KeyValueStore, Any]:
    store = KeyValueStore(folder, kv_bytes_max=KV_BYTES_MAX)
    meta = partitions.PartitionMeta(
        domain="b",
        dataset="particles",
        partition=0,
        ingest={"id": "bench", "first_partition": 0, "partitions": 1, "replicas": 1},
        schema=table.schema,
        compression=compression,
    )
    writer = partitions.PartitionWriter(store, meta)
    for batch in table.to_batches(max_chunksize=1 << 18):
        writer.write(batch)
    writer.finish()
    partitions.commit(store, "bench", "dev0")
    return store, partitions.read_meta(store, "b", "particles", 0)


def _cpu(run: Callable[[], Any], repeats: int) -> float:
    """The least CPU seconds of ``repeats`` runs of ``run`` (every thread of this process: the
    engine runs on threads of its own), after a warm-up: on a shared machine, the run least
    disturbed by the others."""
    return _cpus([run], repeats)[0]


def _cpus(runs: list[Callable[[], Any]], repeats: int) -> list[float]:
    """``_cpu`` of several runs, taken in turns, so each meets the same machine."""
    for run in runs:
        run()
    spent: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for index, run in enumerate(runs):
            started = time.process_time()
            run()
            spent[index].append(time.process_time() - started)
    return [min(times) for times in spent]


QUERIES = {
    # reads one column of five: the cheapest work a device does per byte it reads
    "light": "SELECT count(*) AS n, sum(ke) AS s FROM t WHERE ke > 10",
    # reads every column, groups them: closer to an analytic query's work
    "group": (
        "SELECT floor(x / 10) AS b, count(*) AS n, avg(ke) AS k, max(y) AS y, min(z) AS z "
        "FROM t WHERE ke > 0.5 GROUP BY floor(x / 10)"
    ),
}
COLUMNS = {"light": ["ke"], "group": ["x", "y", "z", "ke"]}


def _scan(
    store, meta, columns: list[str], query: str, checked_after: Any = None
) -> Callable[[], None]:
    """What a device does for a sub-plan, minus its emulation: per chunk of slices, read them
    in place through one snapshot (``Chunk``), check and decode them (``decode_read``), and
    run the query over them. ``checked_after`` (the metadata with checksums, ``meta`` without):
    the checks once the query has run over the chunk instead, while its bytes may still be
    in cache (what a device must not do: it would compute on unchecked bytes; measured to see
    whether the order would pay)."""
    import datafusion

    def run() -> None:
        context = datafusion.SessionContext()
        for first in range(0, len(meta.slices), CHUNK_SLICES):
            snapshot = store.snapshot()
            numbers = range(first, min(first + CHUNK_SLICES, len(meta.slices)))
            fetched = [partitions.fetch_slice(store, meta, n, columns, snapshot) for n in numbers]
            batches = [partitions.decode_read(meta, f) for f in fetched]
            context.register_record_batches("t", [batches])
            context.sql(query).collect()
            context.deregister_table("t")
            if checked_after is not None:
                for f in fetched:
                    partitions.verify_parts(checked_after, f.number, f.parts, f.indices)
            del batches, fetched, snapshot

    return run


def read_path(table: pa.Table, compression: str, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        store, meta = _store(Path(folder), table, compression)
        numbers = range(len(meta.slices))
        bare = replace(meta, slices=[replace(s, checksums=None) for s in meta.slices])
        bare._columns = {}
        fetched = [partitions.fetch_slice(store, meta, n) for n in numbers]

        def verify() -> None:
            for f in fetched:
                partitions.verify_parts(meta, f.number, f.parts, f.indices)

        def verify_twice() -> None:  # each stream (about 1 MiB) again at once, from cache
            for f in fetched:
                for part, index in zip(f.parts, f.indices, strict=True):
                    partitions.verify_parts(meta, f.number, [part], [index])
                    partitions.verify_parts(meta, f.number, [part], [index])

        def crc32c_instead() -> None:
            import crc32c

            for f in fetched:
                for part in f.parts:
                    crc32c.crc32c(part)

        verify_s, twice_s = _cpus([verify, verify_twice], repeats)
        parts = {  # every column, the slices read beforehand (out of cache by the time)
            "verify_s": verify_s,
            "verify_in_cache_s": twice_s - verify_s,  # the second pass over each stream
            "decode_s": _cpu(lambda: [partitions.decode_read(bare, f) for f in fetched], repeats),
        }
        with contextlib.suppress(ImportError):
            parts["crc32c_instead_s"] = _cpu(crc32c_instead, repeats)
        stored_gb = meta.bytes_stored / 1e9
        result: dict[str, Any] = {
            "compression": compression,
            "rows": table.num_rows,
            "slices": len(meta.slices),
            "bytes_stored": meta.bytes_stored,
            **{f"{k}_per_gb": round(v / stored_gb, 5) for k, v in parts.items()},
            "scans": [],
        }
        for name, query in QUERIES.items():
            columns = COLUMNS[name]
            read_gb = sum(partitions.read_bytes(meta, n, columns) for n in numbers) / 1e9
            with_s, without_s, after_s = _cpus(
                [
                    _scan(store, meta, columns, query),
                    _scan(store, bare, columns, query),
                    _scan(store, bare, columns, query, checked_after=meta),
                ],
                repeats,
            )
            scan = {
                "query": name,
                "sql": query,
                "columns": columns,
                "bytes_read": round(read_gb * 1e9),
                "scan_with_checksums_s_per_gb": round(with_s / read_gb, 5),
                "scan_without_checksums_s_per_gb": round(without_s / read_gb, 5),
                "verify_share_of_scan": round((with_s - without_s) / with_s, 4),
                "scan_checked_after_the_query_s_per_gb": round(after_s / read_gb, 5),
            }
            result["scans"].append(scan)
            console.print(
                f"{compression} {name}: scan {with_s / read_gb * 1e3:.0f} ms/GB with checksums, "
                f"{without_s / read_gb * 1e3:.0f} without: {scan['verify_share_of_scan']:.1%}; "
                f"checked after the query {after_s / read_gb * 1e3:.0f}"
            )
        store.close()
    console.print(
        f"{compression}: verify alone {result['verify_s_per_gb'] * 1e3:.1f} ms/GB (in cache "
        f"{result['verify_in_cache_s_per_gb'] * 1e3:.1f}), decode "
        f"{result['decode_s_per_gb'] * 1e3:.1f} ms/GB"
    )
    return result


def plot(rates: list[dict[str, Any]], paths: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(dict.fromkeys(r["algorithm"] for r in rates))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        mine = [r for r in rates if r["algorithm"] == name]
        x = np.arange(len(mine)) + index * width
        left.bar(x, [r["gb_per_s"] for r in mine], width, label=name)
    left.set_xticks(np.arange(len(SIZES)) + 0.4 - width / 2)
    left.set_xticklabels([f"{s >> 10} KiB" if s < 1 << 20 else f"{s >> 20} MiB" for s in SIZES])
    left.set_ylabel("GB/s (one core)")
    left.set_title("hash rate by buffer size")
    left.legend(fontsize=8)
    bars = [(f"{p['compression']} {scan['query']}", scan) for p in paths for scan in p["scans"]]
    x = np.arange(len(bars))
    with_ms = [scan["scan_with_checksums_s_per_gb"] * 1e3 for _, scan in bars]
    without_ms = [scan["scan_without_checksums_s_per_gb"] * 1e3 for _, scan in bars]
    right.bar(x - 0.2, without_ms, 0.4, label="scan, no checksums")
    right.bar(x + 0.2, with_ms, 0.4, label="scan, every slice verified")
    for index, (_, scan) in enumerate(bars):
        right.annotate(
            f"{scan['verify_share_of_scan']:+.1%}",
            (x[index] + 0.2, with_ms[index]),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    for index, p in enumerate(paths):
        right.axhline(
            p["verify_s_per_gb"] * 1e3,
            color=f"C{index + 2}",
            linestyle=":",
            label=f"verify alone, {p['compression']}, out of cache",
        )
    right.set_xticks(x)
    right.set_xticklabels([label for label, _ in bars])
    right.set_ylabel("device CPU ms per GB read")
    right.set_title("a device's scan per GB: read in place, verify, decode, query")
    right.legend(fontsize=8)
    figure.tight_layout()
    path = png_path("checksum")
    figure.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small table, few repeats")
    parser.add_argument("--rows", type=int, default=4_000_000)
    args = parser.parse_args()
    rows = 500_000 if args.quick else args.rows
    repeats = 2 if args.quick else REPEATS
    rates = hash_rates(repeats)
    table = particles.table(rows)
    paths = [read_path(table, compression, repeats) for compression in ("none", "zstd")]
    json_path = write_json(
        "checksum",
        {
            "algorithm": checksum.ALGORITHM,
            "xxhash": xxhash.VERSION,
            "queries": QUERIES,
            "hash_rates": rates,
            "read_path": paths,
        },
    )
    console.print(f"wrote {json_path} and {plot(rates, paths)}")


if __name__ == "__main__":
    main()
