"""The workloads of ActivePy (§V, Table I) as plain Python programs, and their input data.

ActivePy offloads unmodified Python programs to computational storage. Its evaluation runs
TPC-H Q1, Q6 and Q14, Black-Scholes, k-means, PageRank, matrix-vector product and a mixed GEMM.
Each is here a plain script in ``programs/`` (sys, numpy, pandas and pyarrow only) that reads
Parquet files from the folder named by its first argument and prints a small, rounded result;
``quarry run`` runs them unchanged. ``write(folder, scale)`` makes those files, deterministically
(fixed seeds), with about these many rows at scale 1:

    lineitem.parquet  TPC-H lineitem (DuckDB dbgen, sf = 0.1 * scale)     600,000
    part.parquet      TPC-H part, from the same dbgen run                    20,000
    options.parquet   S, K, T, r, v (float64), call (bool)                2,000,000
    points.parquet    x, y, z (float64) around 8 centres                  2,000,000
    edges.parquet     src, dst (int64): a power-law-ish graph of 100,000  2,000,000
                      vertices, a tenth of them without out-edges
    matrix.parquet    c0..c31 (float64): a dense matrix, row by row      1,000,000

TPC-H decimals are stored as float64 and dates as date32. The first 8 points come one from each
cluster, so k-means may start from ``X[:8]``.

    python -m quarry.samples.workloads OUT_DIR [--scale S]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 100_000
PROGRAM_DIR = Path(__file__).parent / "programs"

PROGRAMS: dict[str, str] = {
    "tpch_q1": "tpch_q1.py",
    "tpch_q6": "tpch_q6.py",
    "tpch_q14": "tpch_q14.py",
    "blackscholes": "blackscholes.py",
    "kmeans": "kmeans.py",
    "pagerank": "pagerank.py",
    "matvec": "matvec.py",
    "gemm": "gemm.py",
}

# The inputs each program reads (keys of what ``write`` returns; files ``<name>.parquet``).
INPUTS: dict[str, tuple[str, ...]] = {
    "tpch_q1": ("lineitem",),
    "tpch_q6": ("lineitem",),
    "tpch_q14": ("lineitem", "part"),
    "blackscholes": ("options",),
    "kmeans": ("points",),
    "pagerank": ("edges",),
    "matvec": ("matrix",),
    "gemm": ("matrix",),
}

TPCH_SF_PER_SCALE = 0.1
OPTIONS_PER_SCALE = 2_000_000
POINTS_PER_SCALE = 2_000_000
CLUSTERS = 8
VERTICES_PER_SCALE = 100_000
EDGES_PER_SCALE = 2_000_000
MATRIX_ROWS_PER_SCALE = 1_000_000
MATRIX_COLUMNS = 32


def script(name: str) -> Path:
    """The path of workload ``name``'s program."""
    if name not in PROGRAMS:
        raise KeyError(f"no workload {name!r}; known: {', '.join(PROGRAMS)}")
    return PROGRAM_DIR / PROGRAMS[name]


def argv(name: str, folder: str | Path, *parameters: object) -> list[str]:
    """The program's command-line arguments: the data folder, then any parameter given."""
    script(name)  # a known workload
    return [str(folder), *(str(p) for p in parameters)]


def write(folder: str | Path, scale: float = 1.0) -> dict[str, Path]:
    """Write every input into ``folder`` (made if missing); returns file stem -> path."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, not {scale}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, table in _tpch(TPCH_SF_PER_SCALE * scale).items():
        paths[name] = out / f"{name}.parquet"
        pq.write_table(table, paths[name], row_group_size=ROW_GROUP)
    generators: dict[str, Callable[[float], tuple[pa.Schema, Iterator[pa.RecordBatch]]]] = {
        "options": _options,
        "points": _points,
        "edges": _edges,
        "matrix": _matrix,
    }
    for name, generate in generators.items():
        paths[name] = out / f"{name}.parquet"
        schema, batches = generate(scale)
        # continuous random floats: a dictionary only adds pages
        dictionary = name not in ("points", "matrix")
        with pq.ParquetWriter(paths[name], schema, use_dictionary=dictionary) as writer:
            for batch in batches:
                writer.write_batch(batch, row_group_size=ROW_GROUP)
    return paths


def _rows(per_scale: int, scale: float, least: int = 16) -> int:
    return max(least, round(per_scale * scale))


def _chunks(rows: int) -> Iterator[int]:
    for start in range(0, rows, ROW_GROUP):
        yield min(ROW_GROUP, rows - start)


def _tpch(sf: float) -> dict[str, pa.Table]:
    """lineitem and part from DuckDB's tpch extension (the pinned package: no download)."""
    import duckdb

    locations = importlib.util.find_spec("duckdb_ext").submodule_search_locations
    extension_directory = os.path.join(list(locations)[0], "extensions")
    connection = duckdb.connect(
        config={"extension_directory": extension_directory, "autoinstall_known_extensions": False}
    )
    try:
        connection.execute("LOAD tpch")
        connection.execute(f"CALL dbgen(sf={sf!r})")
        tables = {}
        for name, key in (("lineitem", "l_orderkey, l_linenumber"), ("part", "p_partkey")):
            table = connection.execute(f"SELECT * FROM {name} ORDER BY {key}").fetch_arrow_table()
            tables[name] = _plain_types(table)
        return tables
    finally:
        connection.close()


def _plain_types(table: pa.Table) -> pa.Table:
    """Decimals as float64, strings as string (pandas reads both plainly)."""
    fields = []
    for field in table.schema:
        if pa.types.is_decimal(field.type):
            field = field.with_type(pa.float64())
        elif pa.types.is_string_view(field.type) or pa.types.is_large_string(field.type):
            field = field.with_type(pa.string())
        fields.append(field)
    return table.cast(pa.schema(fields))


def _options(scale: float) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    schema = pa.schema(
        [(name, pa.float64()) for name in ("S", "K", "T", "r", "v")] + [("call", pa.bool_())]
    )

    def batches() -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng(20_240_501)
        for n in _chunks(_rows(OPTIONS_PER_SCALE, scale)):
            spot = np.round(rng.uniform(10.0, 200.0, n), 2)
            strike = np.round(spot * rng.uniform(0.7, 1.3, n), 2)
            expiry = np.round(rng.uniform(0.05, 3.0, n), 4)
            rate = np.round(rng.uniform(0.0, 0.08, n), 4)
            volatility = np.round(rng.uniform(0.05, 0.6, n), 4)
            call = rng.random(n) < 0.5
            columns = [spot, strike, expiry, rate, volatility, call]
            yield pa.RecordBatch.from_arrays([pa.array(c) for c in columns], schema=schema)

    return schema, batches()


def _points(scale: float) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    schema = pa.schema([(name, pa.float64()) for name in ("x", "y", "z")])

    def batches() -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng(20_240_502)
        centres = rng.uniform(-50.0, 50.0, (CLUSTERS, 3))
        spread = rng.uniform(2.0, 6.0, CLUSTERS)
        for chunk, n in enumerate(_chunks(_rows(POINTS_PER_SCALE, scale))):
            label = rng.integers(0, CLUSTERS, n)
            if chunk == 0:  # the first rows, one per cluster: X[:8] is a fair first guess
                label[:CLUSTERS] = np.arange(CLUSTERS)
            xyz = centres[label] + rng.standard_normal((n, 3)) * spread[label, None]
            yield pa.RecordBatch.from_arrays([pa.array(xyz[:, j]) for j in range(3)], schema=schema)

    return schema, batches()


def _edges(scale: float) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Both ends drawn with a skew towards a few vertices (out-degrees and in-degrees with
    heavy tails); the vertices are shuffled so the popular ones are not simply the low ids,
    and a tenth of the vertices have no out-edge (dangling)."""
    schema = pa.schema([("src", pa.int64()), ("dst", pa.int64())])
    vertices = _rows(VERTICES_PER_SCALE, scale)
    senders = max(1, round(0.9 * vertices))

    def batches() -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng(20_240_503)
        out_order = rng.permutation(vertices)
        in_order = rng.permutation(vertices)
        for n in _chunks(_rows(EDGES_PER_SCALE, scale)):
            src = out_order[(senders * rng.random(n) ** 2.0).astype(np.int64)]
            dst = in_order[(vertices * rng.random(n) ** 3.0).astype(np.int64)]
            yield pa.RecordBatch.from_arrays([pa.array(src), pa.array(dst)], schema=schema)

    return schema, batches()


def _matrix(scale: float) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Rows of correlated normal columns with different means."""
    schema = pa.schema([(f"c{j}", pa.float64()) for j in range(MATRIX_COLUMNS)])

    def batches() -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng(20_240_504)
        mixing = rng.standard_normal((MATRIX_COLUMNS, MATRIX_COLUMNS)) / np.sqrt(MATRIX_COLUMNS)
        means = rng.uniform(-1.0, 1.0, MATRIX_COLUMNS)
        for n in _chunks(_rows(MATRIX_ROWS_PER_SCALE, scale)):
            block = rng.standard_normal((n, MATRIX_COLUMNS)) @ mixing + means
            columns = [pa.array(block[:, j]) for j in range(MATRIX_COLUMNS)]
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    return schema, batches()


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m quarry.samples.workloads", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--scale", type=float, default=1.0)
    options = parser.parse_args(args)
    for name, path in write(options.out_dir, options.scale).items():
        rows = pq.ParquetFile(path).metadata.num_rows
        print(f"{name:10s} {rows:>12,d} rows {path.stat().st_size / 1e6:10.1f} MB  {path}")


if __name__ == "__main__":
    main()
