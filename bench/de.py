"""Differential expression on a 4-device cluster beside scanpy in memory (issue 5 acceptance).

A synthetic sparse matrix (20,000 genes x 100,000 cells by default, about 10% non-zero,
log1p-like counts, 10 clusters with marker genes) is stored with `quarry.genes.ingest` on a
local 4-device cluster. Then, in one run:

- quarry, first call: every cluster vs rest in one request (`genes.rank_genes_groups`): devices
  run Accumulate + Combine for every cluster of the grouping (and cache it) and ship each
  cluster's statistics; the host forms each rest and runs TStat;
- quarry, cached call: the same request again (served from the devices' caches: nothing is
  read, almost nothing moves), and one cluster vs rest (`rank_genes`, cached);
- quarry, host only (pushdown="never"): the host scans every slice raw and accumulates;
- scanpy: `sc.tl.rank_genes_groups(method="t-test")`, all 10 clusters vs rest, on the same
  matrix in memory (cells x genes CSR, as AnnData holds it).

Reported: seconds, bytes shipped to the host (and read on the devices), the matrix's stored
bytes and their ratio, the agreement of quarry's scores with scanpy's, and the physical bound:
one read of the matrix from memory on every core. Writes
bench/results/de.json and de.png. Run: python bench/de.py [--genes N --cells N --quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from rich.console import Console
from scipy import sparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json

import quarry
from quarry import genes
from quarry.genes import ExpressionMatrix, GeneBlocks

GENES = 20_000
CELLS = 100_000
CLUSTERS = 10
DENSITY = 0.10
DEVICES = 4
MARKERS_PER_CLUSTER = 50  # genes up-regulated in one cluster: what DE should find
CHUNK_VALUES = 25_000_000  # random draws per block of genes: generation's memory is bounded
SEED = 5
# What each device reports of a genes.accumulate call (the full summary lists every slice).
DEVICE_FIELDS = (
    "device",
    "slices_executed",
    "slices_cached",
    "bytes_read",
    "bytes_shipped",
    "accumulate_s",
    "program_s",
    "device_cpu_s",
    "wall_s",
)

console = Console(stderr=True)


def gene_blocks(
    gene_count: int, cell_count: int, density: float, seed: int, label: str = "generate matrix"
) -> GeneBlocks:
    """The synthetic matrix as blocks of genes, made as they are read: each gene non-zero in
    ~density of cells, more often and higher in the cluster it marks; values log1p(1 +
    Poisson). Memory holds one block (about CHUNK_VALUES draws), so any size can be made."""
    rng = np.random.default_rng(seed)
    cluster_of_cell = rng.integers(0, CLUSTERS, cell_count)
    base = rng.uniform(0.5, 1.5, gene_count) * density
    marker_cluster = np.full(gene_count, -1)
    markers = rng.choice(gene_count, CLUSTERS * MARKERS_PER_CLUSTER, replace=False)
    marker_cluster[markers] = np.repeat(np.arange(CLUSTERS), MARKERS_PER_CLUSTER)
    genes_table = pa.table({"gene": [f"gene{i}" for i in range(gene_count)]})
    cells_table = pa.table(
        {
            "cell": [f"cell{i}" for i in range(cell_count)],
            "cluster": pa.array(cluster_of_cell.astype(str)).dictionary_encode(),
        }
    )
    blocks = _blocks(rng, base, marker_cluster, cluster_of_cell, label)
    return GeneBlocks(
        blocks, genes_table, cells_table, {"generator": "bench/de.py"}, dataset="synthetic"
    )


def _blocks(
    rng: np.random.Generator,
    base: np.ndarray,
    marker_cluster: np.ndarray,
    cluster_of_cell: np.ndarray,
    label: str,
) -> Iterator[sparse.csr_matrix]:
    gene_count, cell_count = len(base), len(cluster_of_cell)
    step = max(1, CHUNK_VALUES // cell_count)
    reported = 0
    with progress(console) as bar:
        task = bar.add_task(label, total=gene_count)
        for start in range(0, gene_count, step):
            stop = min(start + step, gene_count)
            chance = np.repeat(base[start:stop, np.newaxis], CLUSTERS, axis=1).astype(np.float32)
            rows = np.flatnonzero(marker_cluster[start:stop] >= 0)
            chance[rows, marker_cluster[start:stop][rows]] *= 3.0
            mask = (
                rng.random((stop - start, cell_count), dtype=np.float32)
                < chance[:, cluster_of_cell]
            )
            row, column = np.nonzero(mask)
            del mask
            rate = np.where(marker_cluster[start:stop][row] == cluster_of_cell[column], 6.0, 2.0)
            data = np.log1p(1.0 + rng.poisson(rate)).astype(np.float32)
            indptr = np.concatenate(([0], np.cumsum(np.bincount(row, minlength=stop - start))))
            yield sparse.csr_matrix(
                (data, column.astype(np.int32), indptr), shape=(stop - start, cell_count)
            )
            bar.advance(task, stop - start)
            if not console.is_terminal and stop * 10 // gene_count > reported:
                reported = stop * 10 // gene_count  # a line per tenth where no bar is drawn
                console.print(f"{label}: {stop:,} of {gene_count:,} genes")


def synthetic(gene_count: int, cell_count: int, density: float, seed: int) -> ExpressionMatrix:
    """The synthetic matrix whole, in memory (genes x cells CSR): the blocks stacked."""
    source = gene_blocks(gene_count, cell_count, density, seed)
    values = sparse.vstack(list(source.blocks), format="csr")
    return ExpressionMatrix(
        values, source.genes, source.cells, source.metadata, dataset=source.dataset
    )


def quarry_runs(matrix: ExpressionMatrix, devices: int) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    with quarry.local(devices=devices) as cluster:
        console.print(f"ingest into {devices} devices ...")
        started = time.perf_counter()
        stored = genes.ingest(cluster, matrix, "bench/de", metadata={"bench": "de"})
        runs["ingest_s"] = time.perf_counter() - started
        entry = stored.entry
        runs["matrix_bytes_stored"] = entry.bytes_stored
        runs["slices"] = sum(p.slices for p in entry.partitions)
        runs["partitions"] = len(entry.partitions)
        warm_up(cluster)

        def rank(
            label: str | None, pushdown: str, method: str = "t-test"
        ) -> tuple[Any, dict[str, Any]]:
            """All clusters in one request (label None), or one cluster vs rest."""
            started = time.perf_counter()
            if label is None:
                frame = genes.rank_genes_groups(
                    cluster, "bench/de", "cluster", method=method, pushdown=pushdown
                )
            else:
                frame = genes.rank_genes(cluster, "bench/de", "cluster", label, pushdown=pushdown)
            seconds = time.perf_counter() - started
            attrs = frame.attrs["quarry"]
            moved = {k: v for k, v in attrs.items() if k != "datasets"}
            moved["devices"] = [
                {k: device.get(k) for k in DEVICE_FIELDS}
                for report in attrs["datasets"]
                for device in report["devices"]
                if "program" in device
            ]
            return frame, {"seconds": seconds, **moved}

        console.print("quarry: first call (all 10 clusters vs rest, one request) ...")
        first, runs["first_call"] = rank(None, "always")
        console.print("quarry: cached call (the same request) ...")
        _, runs["cached_call"] = rank(None, "always")
        console.print("quarry: one cluster vs rest (cached) ...")
        _, runs["one_cluster_cached"] = rank("0", "auto")
        console.print("quarry: host only (pushdown never, all clusters) ...")
        never, runs["host_only"] = rank(None, "never")
        assert np.allclose(
            never["scores"].to_numpy(), first["scores"].to_numpy(), rtol=1e-12, equal_nan=True
        ), "host-only and pushdown disagree"
        frames = {str(g): f for g, f in first.groupby("group", observed=True)}
        console.print("quarry: wilcoxon, all clusters (first, then cached) ...")
        ranked, runs["wilcoxon_first_call"] = rank(None, "always", "wilcoxon")
        _, runs["wilcoxon_cached_call"] = rank(None, "always", "wilcoxon")
        runs["wilcoxon_scores"] = {
            str(g): f.set_index("names")["scores"]
            for g, f in ranked.groupby("group", observed=True)
        }
    runs["scores"] = {label: frame.set_index("names")["scores"] for label, frame in frames.items()}
    return runs


def memory_bound(matrix_bytes: int) -> dict[str, float]:
    """The physical bound: one read of the matrix's bytes from memory on every core (numpy's
    sum reads a 256 MB float32 buffer on one core; the cores are assumed to add up)."""
    buffer = np.ones(64 << 20, dtype=np.float32)
    buffer.sum()  # touch every page first
    started = time.perf_counter()
    for _ in range(4):
        buffer.sum()
    per_core = 4 * buffer.nbytes / (time.perf_counter() - started)
    cores = os.cpu_count() or 1
    return {
        "read_bytes_per_s_one_core": per_core,
        "cores": cores,
        "one_pass_s": matrix_bytes / (per_core * cores),
    }


def warm_up(cluster: Any) -> None:
    """Accumulate's and the rank sums' loops compile once per machine (numba, cached on disk):
    a small matrix ranked first, so the first call measured is the first of this dataset, not
    of this installation."""
    console.print("quarry: compiling the kernels once (a small matrix) ...")
    small = synthetic(1_000, 2_000, DENSITY, SEED + 1)
    genes.ingest(cluster, small, "bench/warm")
    for method in ("t-test", "wilcoxon"):
        genes.rank_genes_groups(cluster, "bench/warm", "cluster", method=method, pushdown="always")
        genes.rank_genes_groups(cluster, "bench/warm", "cluster", method=method, pushdown="never")
    cluster.drop("bench/warm")


def scanpy_run(matrix: ExpressionMatrix, wilcoxon: bool = True) -> dict[str, Any]:
    import anndata

    console.print("scanpy: building the AnnData (cells x genes CSR) ...")
    x = matrix.values.T.tocsr()
    adata = anndata.AnnData(
        X=x,
        obs=matrix.cells.to_pandas().set_index("cell"),
        var=matrix.genes.to_pandas().set_index("gene"),
    )
    seconds, scores = scanpy_rank(adata, "t-test")
    run = {
        "seconds": seconds,
        "matrix_bytes_in_memory": int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes),
        "scores": scores,
    }
    if wilcoxon:
        run["wilcoxon_seconds"], run["wilcoxon_scores"] = scanpy_rank(adata, "wilcoxon")
    return run


def scanpy_rank(adata: Any, method: str) -> tuple[float, dict[str, dict[str, float]]]:
    """scanpy's ``rank_genes_groups``, every cluster vs rest: its seconds and scores."""
    import scanpy as sc

    console.print(f"scanpy: rank_genes_groups(method={method!r}), every cluster vs rest ...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        sc.tl.rank_genes_groups(adata, "cluster", method=method, use_raw=False)
        seconds = time.perf_counter() - started
    return seconds, _scores(adata.uns["rank_genes_groups"])


def _scores(result: Any) -> dict[str, dict[str, float]]:
    return {
        label: dict(
            zip(result["names"][label], result["scores"][label].astype(np.float64), strict=True)
        )
        for label in result["names"].dtype.names
    }


def agreement(
    quarry_scores: dict[str, Any], scanpy_scores: dict[str, dict[str, float]]
) -> dict[str, float]:
    worst, zero = 0.0, 0
    for label, ours in quarry_scores.items():
        theirs = scanpy_scores[label]
        expected = np.array([theirs[name] for name in ours.index])
        got = ours.to_numpy()
        reported = expected != 0
        zero += int((~reported).sum())
        worst = max(
            worst, float((np.abs(got - expected)[reported] / np.abs(expected[reported])).max())
        )
    return {"scanpy_score_relative_error_max": worst, "scanpy_zero_scores": zero}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = result["quarry"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    bars = {
        "quarry first call\n(all 10, one request)": q["first_call"]["seconds"],
        "quarry cached call\n(all 10)": q["cached_call"]["seconds"],
        "quarry one cluster\n(cached)": q["one_cluster_cached"]["seconds"],
        "quarry host only\n(all 10, never)": q["host_only"]["seconds"],
        "scanpy in memory\n(all 10)": result["scanpy"]["seconds"],
        "quarry wilcoxon\nfirst / cached": q["wilcoxon_first_call"]["seconds"],
        "scanpy wilcoxon\n(all 10)": result["scanpy"].get("wilcoxon_seconds", 0.0),
        "one read of the\nmatrix in memory": result["memory"]["one_pass_s"],
    }
    colors = ["tab:blue", "tab:cyan", "tab:blue", "tab:gray", "tab:orange", "tab:green"]
    colors += ["tab:red", "black"]
    left.bar(range(len(bars)), list(bars.values()), color=colors)
    left.set_xticks(range(len(bars)), list(bars.keys()), fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("seconds (log)")
    left.set_title("rank genes, every cluster vs rest: time")
    for i, value in enumerate(bars.values()):
        left.annotate(f"{value:.2f} s", (i, value), ha="center", va="bottom", fontsize=8)

    shipped = {
        "matrix stored": q["matrix_bytes_stored"],
        "host only\nshipped": q["host_only"]["bytes_shipped"],
        "first call\nshipped": q["first_call"]["bytes_shipped"],
        "first call\nread on devices": q["first_call"]["bytes_read"],
        "cached call\nshipped": q["cached_call"]["bytes_shipped"],
        "cached call\nread on devices": max(q["cached_call"]["bytes_read"], 1),
    }
    right.bar(
        range(len(shipped)),
        list(shipped.values()),
        color=["tab:gray", "tab:gray", "tab:blue", "tab:purple", "tab:cyan", "tab:purple"],
    )
    right.set_yscale("log")
    right.set_xticks(range(len(shipped)), list(shipped.keys()), fontsize=8)
    right.set_ylabel("bytes (log)")
    right.set_title(
        f"data movement: shipped {result['ratio_matrix_to_first_call_shipped']:.0f}x "
        "fewer bytes than stored"
    )
    for i, value in enumerate(shipped.values()):
        # A cached call reads nothing; its bar stands at 1 byte only so the log axis can show it.
        label = "0 B" if value <= 1 else f"{value / 1e6:.3g} MB"
        right.annotate(label, (i, value), ha="center", va="bottom", fontsize=8)
    shape = result["matrix"]
    figure.suptitle(
        f"{shape['genes']:,} genes x {shape['cells']:,} cells, "
        f"{shape['density']:.1%} non-zero, {CLUSTERS} clusters, "
        f"{result['devices']} devices (host profile), {result['environment_cores']} "
        "cores"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--genes", type=int, default=GENES)
    parser.add_argument("--cells", type=int, default=CELLS)
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--quick", action="store_true", help="2,000 genes x 10,000 cells")
    parser.add_argument("--no-scanpy-wilcoxon", action="store_true", help="skip scanpy's (slow)")
    args = parser.parse_args()
    gene_count, cell_count = (2_000, 10_000) if args.quick else (args.genes, args.cells)

    started = time.perf_counter()
    matrix = synthetic(gene_count, cell_count, DENSITY, SEED)
    shape = {
        "genes": gene_count,
        "cells": cell_count,
        "nonzero": matrix.values.nnz,
        "density": matrix.values.nnz / (gene_count * cell_count),
        "clusters": CLUSTERS,
        "bytes_csr": int(
            matrix.values.data.nbytes + matrix.values.indices.nbytes + matrix.values.indptr.nbytes
        ),
    }
    console.print(f"matrix: {shape}")
    bound = memory_bound(shape["bytes_csr"])
    console.print(f"one pass over the matrix in memory: {bound}")
    runs = quarry_runs(matrix, args.devices)
    quarry_scores = runs.pop("scores")
    quarry_wilcoxon = runs.pop("wilcoxon_scores")
    gc.collect()
    scanpy = scanpy_run(matrix, wilcoxon=not args.no_scanpy_wilcoxon)
    scanpy_scores = scanpy.pop("scores")
    scanpy_wilcoxon = scanpy.pop("wilcoxon_scores", None)
    result: dict[str, Any] = {
        "matrix": shape,
        "devices": args.devices,
        "environment_cores": os.cpu_count(),
        "quarry": runs,
        "scanpy": scanpy,
        "agreement": agreement(quarry_scores, scanpy_scores),
        "wilcoxon_agreement": agreement(quarry_wilcoxon, scanpy_wilcoxon)
        if scanpy_wilcoxon
        else None,
        "ratio_scanpy_to_wilcoxon_first_call_seconds": scanpy.get("wilcoxon_seconds", 0.0)
        / runs["wilcoxon_first_call"]["seconds"],
        "ratio_scanpy_to_wilcoxon_cached_call_seconds": scanpy.get("wilcoxon_seconds", 0.0)
        / runs["wilcoxon_cached_call"]["seconds"],
        "ratio_matrix_to_first_call_shipped": runs["matrix_bytes_stored"]
        / max(runs["first_call"]["bytes_shipped"], 1),
        "ratio_matrix_to_cached_call_moved": runs["matrix_bytes_stored"]
        / max(
            runs["cached_call"]["bytes_shipped"]
            + runs["cached_call"]["bytes_read"]
            + runs["cached_call"]["bytes_sent"],
            1,
        ),
        "ratio_host_only_to_first_call_shipped": runs["host_only"]["bytes_shipped"]
        / max(runs["first_call"]["bytes_shipped"], 1),
        "ratio_scanpy_to_first_call_seconds": scanpy["seconds"] / runs["first_call"]["seconds"],
        "ratio_scanpy_to_cached_call_seconds": scanpy["seconds"] / runs["cached_call"]["seconds"],
        "memory": bound,
        "ratio_first_call_to_one_memory_pass": runs["first_call"]["seconds"] / bound["one_pass_s"],
        "bench_s": time.perf_counter() - started,
    }
    name = "de" if not args.quick else "de_quick"
    json_path = write_json(name, result)
    plot(result, png_path(name))
    console.print(f"wrote {json_path} and {png_path(name)}")
    console.print({k: v for k, v in result.items() if k.startswith("ratio") or "agreement" in k})


if __name__ == "__main__":
    main()
