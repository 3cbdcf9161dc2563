"""Dense-wide vs sparse slices of an expression matrix: bytes stored and Accumulate time.

For each density from 1% to 100% and two slice widths (cells), one slice of whole gene rows is
encoded as
- dense-wide   (quarry's dense encoding: one float32 column per cell),
- sparse-list  (quarry's sparse encoding: cells list<int32>, values list<float32> per gene),
- sparse-long  (the alternative not chosen: one row per non-zero, gene int64, cell int32, value),
- dense-list   (for reference: one fixed_size_list<float32> per gene, not addressable by cell),
and measured for
- Arrow IPC body bytes (schema excluded: it is stored once per partition), uncompressed and
  zstd (quarry's value compression option, paid for in device CPU),
- the schema's bytes (dense-wide names every cell),
- Accumulate latency (decode + per-group n/mean/m2 for 10 groups), median and minimum of
  repeats (the minimum decides the crossover: it is the least disturbed by other processes),
- the bytes of Accumulate's output for the slice (what a device ships instead).

Writes bench/results/gene_layout.json and .png. Run: python bench/gene_layout.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.genes import ExpressionMatrix, accumulate, encode_slices
from quarry.genes.layout import DENSITY_THRESHOLD
from quarry.genes.stats import _accumulate_sparse  # the sparse core, reused for sparse-long

RESULTS = Path(__file__).resolve().parent / "results"
DENSITIES = [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
GROUP_COUNT = 10
REPEATS = 15


def synthetic_matrix(
    gene_count: int, cell_count: int, density: float, seed: int
) -> ExpressionMatrix:
    """log1p-like values: non-zeros drawn from log1p(Poisson counts >= 1)."""
    rng = np.random.default_rng(seed)
    values = sparse.random(
        gene_count,
        cell_count,
        density=density,
        format="csr",
        dtype=np.float32,
        random_state=rng,
        data_rvs=lambda k: np.log1p(rng.poisson(3.0, k) + 1).astype(np.float32),
    )
    genes = pa.table({"gene": [f"g{i}" for i in range(gene_count)]})
    cells = pa.table({"cell": [f"c{i}" for i in range(cell_count)]})
    return ExpressionMatrix(values, genes, cells, dataset=f"synthetic-{density}")


def ipc_body_bytes(batch: pa.RecordBatch, compression: str | None) -> int:
    """Bytes of the record batch message alone: a stream with it minus a stream without."""
    options = pa.ipc.IpcWriteOptions(compression=compression)

    def stream_bytes(batches: list[pa.RecordBatch]) -> int:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
            for item in batches:
                writer.write_batch(item)
        return sink.getvalue().size

    return stream_bytes([batch]) - stream_bytes([])


def long_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The sparse-list slice re-encoded as one row per non-zero (gene, cell, value)."""
    cells = batch.column(1)
    lengths = np.diff(cells.offsets.to_numpy())
    return pa.record_batch(
        {
            "gene": np.repeat(batch.column(0).to_numpy(), lengths),
            "cell": cells.flatten(),
            "value": batch.column(2).flatten(),
        }
    )


def accumulate_long(batch: pa.RecordBatch, group_of_cell: np.ndarray, rows: int, cells: int):
    """Accumulate over a long slice: rebuild CSR row pointers from the gene column first."""
    gene = batch.column(0).to_numpy()
    local = gene - gene[0] if len(gene) else gene
    indptr = np.concatenate(([0], np.cumsum(np.bincount(local, minlength=rows))))
    block = sparse.csr_matrix(
        (batch.column(2).to_numpy(), batch.column(1).to_numpy(), indptr), shape=(rows, cells)
    )
    return _accumulate_sparse(block, group_of_cell.astype(np.int64), GROUP_COUNT)


def dense_list_batch(matrix: ExpressionMatrix) -> pa.RecordBatch:
    block = matrix.values.toarray()
    flat = pa.array(block.ravel())
    return pa.record_batch(
        {
            "gene": np.arange(block.shape[0], dtype=np.int64),
            "values": pa.FixedSizeListArray.from_arrays(flat, block.shape[1]),
        }
    )


def accumulate_dense_list(batch: pa.RecordBatch, group_of_cell: np.ndarray):
    from quarry.genes.stats import _accumulate_dense

    column = batch.column(1)
    block = column.flatten().to_numpy().reshape(len(column), column.type.list_size)
    return _accumulate_dense(block, group_of_cell.astype(np.int64), GROUP_COUNT)


def timings_ms(function, repeats: int) -> tuple[float, float]:
    """(median, minimum) latency; the minimum is the one least disturbed by other processes."""
    function()  # warm-up: first call pays for allocations and imports
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        function()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(samples), min(samples)


def measure(gene_count: int, cell_count: int, density: float, repeats: int) -> dict:
    matrix = synthetic_matrix(gene_count, cell_count, density, seed=int(density * 1000))
    rng = np.random.default_rng(7)
    group_of_cell = rng.integers(0, GROUP_COUNT, cell_count).astype(np.int32)
    dense = encode_slices(matrix, rows_per_slice=gene_count, encoding="dense")[0]
    sparse_list = encode_slices(matrix, rows_per_slice=gene_count, encoding="sparse")[0]
    long = long_batch(sparse_list)
    dense_list = dense_list_batch(matrix)
    row: dict = {
        "genes": gene_count,
        "cells": cell_count,
        "density": density,
        "nonzero": matrix.nonzero_count,
        "value_bytes_dense_float32": gene_count * cell_count * 4,
    }
    for name, batch in [
        ("dense_wide", dense),
        ("sparse_list", sparse_list),
        ("sparse_long", long),
        ("dense_list", dense_list),
    ]:
        row[f"{name}_bytes"] = ipc_body_bytes(batch, None)
        row[f"{name}_bytes_zstd"] = ipc_body_bytes(batch, "zstd")
        row[f"{name}_schema_bytes"] = batch.schema.serialize().size
    runs = {
        "dense_wide": lambda: accumulate(dense, group_of_cell, GROUP_COUNT),
        "sparse_list": lambda: accumulate(sparse_list, group_of_cell, GROUP_COUNT),
        "sparse_long": lambda: accumulate_long(long, group_of_cell, gene_count, cell_count),
        "dense_list": lambda: accumulate_dense_list(dense_list, group_of_cell),
    }
    for name, run in runs.items():
        median, minimum = timings_ms(run, repeats)
        row[f"{name}_accumulate_ms"] = median
        row[f"{name}_accumulate_ms_min"] = minimum
    # What leaves the device instead of the slice: one (gene, group, n, mean, m2) row each.
    row["partial_bytes"] = ipc_body_bytes(accumulate(dense, group_of_cell, GROUP_COUNT), None)
    return row


def crossover(rows: list[dict], cells: int, metric: str) -> float | None:
    """Lowest density at which dense-wide is no worse than sparse-list on `metric`."""
    for row in sorted((r for r in rows if r["cells"] == cells), key=lambda r: r["density"]):
        if row[f"dense_wide_{metric}"] <= row[f"sparse_list_{metric}"]:
            return row["density"]
    return None


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted({r["cells"] for r in rows})
    figure, axes = plt.subplots(2, len(widths), figsize=(6 * len(widths), 8), squeeze=False)
    for column, cells in enumerate(widths):
        subset = sorted((r for r in rows if r["cells"] == cells), key=lambda r: r["density"])
        x = [r["density"] * 100 for r in subset]
        for name in ("dense_wide", "sparse_list", "sparse_long", "dense_list"):
            axes[0][column].plot(
                x, [r[f"{name}_bytes"] / 1e6 for r in subset], marker="o", label=name
            )
            axes[1][column].plot(
                x, [r[f"{name}_accumulate_ms"] for r in subset], marker="o", label=name
            )
        genes = subset[0]["genes"]
        axes[0][column].set_title(f"slice of {genes} genes x {cells} cells")
        axes[0][column].set_ylabel("IPC body MB (uncompressed)")
        axes[1][column].set_ylabel("Accumulate ms (10 groups)")
        for axis in axes[:, column]:
            axis.set_xlabel("density %")
            axis.axvline(DENSITY_THRESHOLD * 100, color="grey", linestyle=":")
            axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer densities, one width")
    arguments = parser.parse_args()
    shapes = [(256, 2000), (64, 20000)] if not arguments.quick else [(128, 2000)]
    densities = DENSITIES if not arguments.quick else [0.01, 0.1, 0.3, 0.5, 1.0]
    repeats = REPEATS if not arguments.quick else 3
    rows = []
    for gene_count, cell_count in shapes:
        for density in densities:
            row = measure(gene_count, cell_count, density, repeats)
            rows.append(row)
            print(
                f"{gene_count}x{cell_count} density {density:>4.0%}: bytes dense "
                f"{row['dense_wide_bytes']:>10,} sparse {row['sparse_list_bytes']:>10,} long "
                f"{row['sparse_long_bytes']:>10,} | accumulate ms dense "
                f"{row['dense_wide_accumulate_ms']:7.2f} sparse "
                f"{row['sparse_list_accumulate_ms']:7.2f} long "
                f"{row['sparse_long_accumulate_ms']:7.2f}"
            )
    summary = {
        f"{cells}_cells": {
            "bytes_crossover_density": crossover(rows, cells, "bytes"),
            "bytes_zstd_crossover_density": crossover(rows, cells, "bytes_zstd"),
            "accumulate_crossover_density": crossover(rows, cells, "accumulate_ms_min"),
        }
        for cells in sorted({r["cells"] for r in rows})
    }
    result = {
        "benchmark": "gene_layout",
        "density_threshold_in_use": DENSITY_THRESHOLD,
        "group_count": GROUP_COUNT,
        "repeats": repeats,
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "summary": summary,
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if arguments.quick else ""
    (RESULTS / f"gene_layout{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, RESULTS / f"gene_layout{suffix}.png")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
