"""Cells at Census scale (issue 35): axis queries against TileDB-SOMA, Wilcoxon against illico
and scanpy, highly variable genes against scanpy, then a collection past the machine's memory.

The matrix is synthetic and shaped like CELLxGENE Census data: cells come in donors (100 of
them, each's cells contiguous, as a dataset's cells are), donors in tissues (10 each), and each
cell has one of 10 cell types, whose 50 marker genes it expresses more often and more; values
are log1p(1 + Poisson) at about `--density` (part 1) or `--member-density` (part 2), float32,
and each gene's base rate varies.

Part 1, one matrix (`--cells`, in memory as an AnnData so that every tool gets the same one; a
million cells at 1% non-zero: 2e8 values, 1.6 GB as CSR, so that illico's CSC copy and scanpy's
fit beside it in this machine's memory):
- stored three ways: TileDB-SOMA (`tiledbsoma.io.from_anndata`), quarry by cells (the layout
  cell filters prune) and quarry by genes (the layout Wilcoxon ranks), on a local 4-device
  cluster; with `--order-by tissue,donor,cell_type`, a fourth: by cells in that order
  (`genes.ingest(order_by=...)`, answers still in the source's cell order), `by_cells_ordered`
  in the JSON;
- three axis queries (about 0.1%, 1% and 10% of the cells: a donor's T cells, a donor, a
  tissue) with 50 and with 2,000 genes: each tool's time (first call) and bytes read (quarry:
  read off the devices' stores; TileDB-SOMA: the bytes its process read, /proc/self/io rchar),
  against the matrix's stored bytes, and the answers compared;
- Wilcoxon, every cell type against the rest: quarry (first call and cached), illico (the same
  AnnData, `n_threads` = the machine's cores, first call and again, on the CSR AnnData and on a
  CSC copy) and scanpy (on `--scanpy-genes` of the genes: a gene's score depends on that gene
  alone, and scanpy ranks dense blocks of every cell, hours for all genes of a million cells);
  scores compared;
- highly variable genes (`seurat`, 2,000 genes): quarry and scanpy, the genes compared.
`acceptance` sums part 1 up against issue 35's lines (speed-ups, the bytes-read factors each
query needs and has).

Part 2, a collection (`--members` matrices of `--member-cells` cells, made block by block and
never whole anywhere): axis query, t-test and Wilcoxon of every cell type against the rest,
HVG; peak resident memory of every process (host, devices).

    python bench/cells.py                                     # the full run
    python bench/cells.py --cells 20000 --member-cells 20000  # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import sparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, png_path, write_json
from de_million import MemoryWatch

import quarry
from quarry import genes

DONORS = 100
TISSUES = ["blood", "lung", "liver", "kidney", "heart", "brain", "skin", "gut", "spleen", "bone"]
CELL_TYPES = [
    "T cell",
    "B cell",
    "NK cell",
    "monocyte",
    "macrophage",
    "fibroblast",
    "endothelial",
    "epithelial",
    "neuron",
    "erythrocyte",
]
MARKERS_PER_TYPE = 50
VALUES_PER_BLOCK = 24 << 20  # random draws per generated block: bounds the generator's memory
DEVICES = 4
QUERIES = {
    "0.1%": "donor = 'D017' AND cell_type = 'T cell'",
    "1%": "donor = 'D042'",
    "10%": "tissue = 'lung'",
}
SOMA_QUERIES = {  # the same filters in TileDB-SOMA's value-filter syntax
    "0.1%": "donor == 'D017' and cell_type == 'T cell'",
    "1%": "donor == 'D042'",
    "10%": "tissue == 'lung'",
}
GENE_SETS = (50, 2_000)


# ---- the matrix -------------------------------------------------------------------------------


class Generator:
    """The synthetic Census-like matrix: per gene a base rate, per cell type its markers."""

    def __init__(self, cells: int, gene_count: int, density: float, seed: int):
        self.rng = np.random.default_rng(seed)
        self.cells, self.gene_count = cells, gene_count
        donor = np.minimum(np.arange(cells) * DONORS // max(cells, 1), DONORS - 1)
        self.cell_type = self.rng.integers(0, len(CELL_TYPES), cells)
        self.obs = pd.DataFrame(
            {
                "donor": pd.Categorical([f"D{d:03d}" for d in donor]),
                "tissue": pd.Categorical([TISSUES[d * len(TISSUES) // DONORS] for d in donor]),
                "cell_type": pd.Categorical(
                    np.asarray(CELL_TYPES)[self.cell_type], categories=CELL_TYPES
                ),
            },
            index=pd.Index([f"cell{i}" for i in range(cells)]),
        )
        self.gene_names = np.asarray([f"G{i:05d}" for i in range(gene_count)])
        self.base = self.rng.uniform(0.5, 1.5, gene_count) * density
        self.marker_type = np.full(gene_count, -1)
        markers = self.rng.choice(gene_count, len(CELL_TYPES) * MARKERS_PER_TYPE, replace=False)
        self.marker_type[markers] = np.repeat(np.arange(len(CELL_TYPES)), MARKERS_PER_TYPE)
        self.nonzero = 0  # values made so far

    def cell_blocks(self) -> Iterator[sparse.csr_matrix]:
        """cells x genes blocks, each made from a dense draw of its size (bounded)."""
        step = max(1, VALUES_PER_BLOCK // self.gene_count)
        for start in range(0, self.cells, step):
            stop = min(start + step, self.cells)
            types = self.cell_type[start:stop]
            chance = np.repeat(self.base[np.newaxis, :], stop - start, axis=0).astype(np.float32)
            marked = self.marker_type[np.newaxis, :] == types[:, np.newaxis]
            chance[marked] *= 3.0
            mask = self.rng.random(chance.shape, dtype=np.float32) < chance
            row, column = np.nonzero(mask)
            rate = np.where(marked[row, column], 6.0, 2.0)
            data = np.log1p(1.0 + self.rng.poisson(rate)).astype(np.float32)
            yield sparse.csr_matrix((data, (row, column)), shape=(stop - start, self.gene_count))

    def gene_blocks(self) -> Iterator[sparse.csr_matrix]:
        """genes x cells blocks of the same distribution (another draw), for a member stored by
        genes without ever holding it whole."""
        step = max(1, VALUES_PER_BLOCK // self.cells)
        for start in range(0, self.gene_count, step):
            stop = min(start + step, self.gene_count)
            chance = np.repeat(self.base[start:stop, np.newaxis], self.cells, axis=1)
            marked = self.marker_type[start:stop, np.newaxis] == self.cell_type[np.newaxis, :]
            chance = chance.astype(np.float32)
            chance[marked] *= 3.0
            mask = self.rng.random(chance.shape, dtype=np.float32) < chance
            row, column = np.nonzero(mask)
            rate = np.where(marked[row, column], 6.0, 2.0)
            data = np.log1p(1.0 + self.rng.poisson(rate)).astype(np.float32)
            self.nonzero += len(data)
            yield sparse.csr_matrix((data, (row, column)), shape=(stop - start, self.cells))

    def tables(self) -> tuple[pa.Table, pa.Table]:
        var = pa.table({"gene": self.gene_names})
        obs = pa.Table.from_pandas(self.obs.reset_index(names="cell"), preserve_index=False)
        return var, obs

    def anndata(self) -> Any:
        import anndata

        x = sparse.vstack(list(self.cell_blocks()), format="csr")
        return anndata.AnnData(X=x, obs=self.obs, var=pd.DataFrame(index=self.gene_names))


def gene_sets(names: np.ndarray, seed: int) -> dict[int, list[str]]:
    rng = np.random.default_rng(seed)
    return {n: sorted(rng.choice(names, n, replace=False).tolist()) for n in GENE_SETS}


# ---- measuring --------------------------------------------------------------------------------


def read_chars() -> int:
    """Bytes this process has read through read(2) and friends (page cache included)."""
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@contextlib.contextmanager
def timed(record: dict[str, Any], key: str = "seconds") -> Iterator[None]:
    started = time.perf_counter()
    yield
    record[key] = time.perf_counter() - started


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- part 1 -----------------------------------------------------------------------------------


def part_one(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    generator = Generator(args.cells, args.genes, args.density, args.seed)
    say(f"part 1: making {args.cells:,} cells x {args.genes:,} genes in memory")
    with timed(result, "generate_s"):
        adata = generator.anndata()
    result["matrix"] = {
        "cells": adata.n_obs,
        "genes": adata.n_vars,
        "nonzero": int(adata.X.nnz),
        "density": adata.X.nnz / (adata.n_obs * adata.n_vars),
        "csr_bytes": int(adata.X.data.nbytes + adata.X.indices.nbytes + adata.X.indptr.nbytes),
    }
    sets = gene_sets(generator.gene_names, args.seed + 1)
    soma = work / "soma"
    if not args.skip_tiledb:
        result["tiledb"] = soma_ingest(adata, soma)
    with quarry.local(devices=DEVICES) as cluster:
        warm_up(cluster, args)
        result["quarry_ingest"] = quarry_ingest(cluster, adata, args.order_by)
        result["queries"] = axis_queries(cluster, adata, sets, soma, args)
        result["wilcoxon"] = wilcoxon(cluster, adata, args)
        result["hvg"] = hvg(cluster, adata)
    return result


def warm_up(cluster: Any, args: argparse.Namespace) -> None:
    """The compiled loops (numba, cached on disk once per machine) and each process's first
    imports, on a small matrix: the first calls measured are the first of their dataset, not
    of this installation (bench/de.py does the same)."""
    say("quarry: warming up on a small matrix")
    small = Generator(2_000, min(args.genes, 3_000), args.density, args.seed + 7).anndata()
    for orientation in ("genes", "cells"):
        name = f"bench/warm_{orientation}"
        genes.ingest(cluster, small, name, orientation=orientation)
        genes.query(cluster, name, QUERIES["1%"], list(small.var_names[:60])).to_anndata()
    for method in ("t-test", "wilcoxon"):
        for mode in ("always", "never"):
            genes.rank_genes_groups(
                cluster, "bench/warm_genes", "cell_type", method=method, pushdown=mode
            )
    genes.highly_variable_genes(cluster, "bench/warm_genes", n_top_genes=100)
    genes.collect(cluster, "bench/warm_both", ["bench/warm_genes", "bench/warm_cells"])
    genes.rank_genes_groups(cluster, "bench/warm_both", "cell_type", method="wilcoxon")
    for name in ("bench/warm_both", "bench/warm_genes", "bench/warm_cells"):
        genes.drop(cluster, name)


def soma_ingest(adata: Any, soma: Path) -> dict[str, Any]:
    import tiledbsoma.io

    say("TileDB-SOMA: from_anndata")
    record: dict[str, Any] = {}
    with timed(record, "ingest_s"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiledbsoma.io.from_anndata(str(soma), adata, measurement_name="RNA")
    x_path = next((p for p in soma.rglob("X") if p.is_dir()), soma)
    record["bytes_stored"] = directory_bytes(soma)
    record["x_bytes_stored"] = directory_bytes(x_path)
    return record


def stored_layouts(order_by: list[str]) -> list[str]:
    """The layouts quarry stores the matrix in: by cells in the source's order (plain and
    zstd), by genes, and by cells in the order of ``order_by`` when given."""
    return ["by_cells", "by_genes", "by_cells_zstd"] + (["by_cells_ordered"] if order_by else [])


def quarry_ingest(cluster: Any, adata: Any, order_by: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for name in stored_layouts(order_by):
        orientation = "genes" if name == "by_genes" else "cells"
        compression = "zstd" if name.endswith("_zstd") else "none"
        order = order_by if name == "by_cells_ordered" else []
        say(f"quarry: ingest {name}" + (f" (cells ordered by {', '.join(order)})" if order else ""))
        started = time.perf_counter()
        stored = genes.ingest(
            cluster,
            adata,
            f"bench/{name}",
            orientation=orientation,
            compression=compression,
            order_by=order or None,
        )
        record[name] = {
            "ingest_s": time.perf_counter() - started,
            "bytes_stored": stored.entry.bytes_stored,
            "slices": sum(p.slices for p in stored.entry.partitions),
            "order_by": order,  # [] : the cells in the source's order
        }
    return record


def axis_queries(
    cluster: Any, adata: Any, sets: dict[int, list[str]], soma: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows = []
    for label, where in QUERIES.items():
        mask = _mask(adata.obs, label)
        for count, names in sets.items():
            row: dict[str, Any] = {
                "query": label,
                "obs": where,
                "genes": count,
                "cells_selected": int(mask.sum()),
                "cell_fraction": float(mask.mean()),
            }
            say(f"axis query {label} of cells, {count} genes")
            expected = adata[mask][:, names].X
            for stored in stored_layouts(args.order_by):
                q = genes.query(cluster, f"bench/{stored}", where, names)
                with timed(row, f"quarry_{stored}_s"):
                    got = q.to_anndata()
                report = q.report
                row[f"quarry_{stored}"] = {
                    "bytes_read": report.bytes_read,
                    "bytes_shipped": report.bytes_shipped,
                    "bytes_matrix": report.bytes_matrix,
                    "slices_pruned": report.slices_pruned,
                    "slices_total": report.slices_total,
                    "equal": bool((expected != got.X).nnz == 0),
                }
            if not args.skip_tiledb:
                row["tiledb"] = soma_query(soma, SOMA_QUERIES[label], adata, names, expected)
            rows.append(row)
    return rows


def _mask(obs: pd.DataFrame, label: str) -> np.ndarray:
    if label == "0.1%":
        return ((obs.donor == "D017") & (obs.cell_type == "T cell")).to_numpy()
    if label == "1%":
        return (obs.donor == "D042").to_numpy()
    return (obs.tissue == "lung").to_numpy()


def soma_query(soma: Path, where: str, adata: Any, names: list[str], expected: Any) -> dict:
    import tiledbsoma

    joinids = np.sort(adata.var_names.get_indexer(names)).astype(np.int64)
    record: dict[str, Any] = {}
    before = read_chars()
    with (
        timed(record),
        tiledbsoma.Experiment.open(str(soma)) as experiment,
        experiment.axis_query(
            "RNA",
            obs_query=tiledbsoma.AxisQuery(value_filter=where),
            var_query=tiledbsoma.AxisQuery(coords=(joinids,)),
        ) as query,
    ):
        got = query.to_anndata(X_name="data")
    record["bytes_read"] = read_chars() - before
    record["cells"] = int(got.n_obs)
    # both in the matrix's order: obs by soma_joinid, genes by their (sorted) joinids
    record["equal"] = bool((sparse.csr_matrix(got.X) != expected).nnz == 0)
    return record


def wilcoxon(cluster: Any, adata: Any, args: argparse.Namespace) -> dict[str, Any]:
    record: dict[str, Any] = {"threads": os.cpu_count()}
    say("quarry: Wilcoxon, every cell type vs rest (first call)")
    started = time.perf_counter()
    ranked = genes.rank_genes_groups(cluster, "bench/by_genes", "cell_type", method="wilcoxon")
    record["quarry_first_s"] = time.perf_counter() - started
    moved = ranked.attrs["quarry"]
    record["quarry_bytes_read"] = moved["bytes_read"]
    record["quarry_bytes_shipped"] = moved["bytes_shipped"]
    started = time.perf_counter()
    genes.rank_genes_groups(cluster, "bench/by_genes", "cell_type", method="wilcoxon")
    record["quarry_cached_s"] = time.perf_counter() - started
    ours = {
        str(g): f.set_index("names")["scores"] for g, f in ranked.groupby("group", observed=True)
    }
    if not args.skip_illico:
        record["illico"] = illico_run(adata, ours)
        # illico reads a CSC matrix (genes contiguous) without converting it first: its best case
        by_gene = adata.copy()
        by_gene.X = by_gene.X.tocsc()
        record["illico_csc"] = illico_run(by_gene, ours)
        del by_gene
    if not args.skip_scanpy_wilcoxon:
        record["scanpy"] = scanpy_wilcoxon(adata, ours, args.scanpy_genes)
    return record


def illico_run(adata: Any, ours: dict[str, pd.Series]) -> dict[str, Any]:
    import illico

    say("illico: Wilcoxon, every cell type vs rest (first call, then again)")
    record: dict[str, Any] = {}
    options = {
        "is_log1p": True,
        "group_keys": "cell_type",
        "reference": None,
        "n_threads": os.cpu_count() or 1,
        "use_continuity": False,
        "tie_correct": False,
    }
    with timed(record, "first_s"):
        result = illico.asymptotic_wilcoxon(adata, **options)
    with timed(record, "again_s"):
        illico.asymptotic_wilcoxon(adata, **options)
    record["max_relative_error"] = _illico_agreement(result, ours)
    if isinstance(result, pd.DataFrame):
        record["layout"] = [str(c) for c in result.reset_index().columns]
    return record


def _illico_agreement(result: Any, ours: dict[str, pd.Series]) -> float | None:
    """The largest relative difference of illico's z-scores from quarry's (None: its layout
    was not one this bench reads)."""
    frame = result if isinstance(result, pd.DataFrame) else None
    if frame is None:
        return None
    frame = frame.reset_index()
    columns = {c.lower(): c for c in frame.columns}
    score = next(
        (columns[c] for c in ("z_score", "statistic", "scores", "z") if c in columns), None
    )
    group = next(
        (columns[c] for c in ("pert", "group", "perturbation", "cell_type") if c in columns), None
    )
    gene = next(
        (columns[c] for c in ("feature", "gene", "names", "var_names") if c in columns), None
    )
    if score is None or group is None or gene is None:
        return None
    worst, compared = 0.0, 0
    for label, part in frame.groupby(group):
        mine = ours.get(str(label))
        if mine is None:
            continue
        compared += 1
        theirs = part.set_index(gene)[score].astype(float)
        mine = mine.reindex(theirs.index)
        scale = np.maximum(np.abs(theirs.to_numpy()), 1e-12)
        worst = max(worst, float(np.nanmax(np.abs(mine.to_numpy() - theirs.to_numpy()) / scale)))
    return worst if compared else None


def scanpy_wilcoxon(adata: Any, ours: dict[str, pd.Series], gene_count: int) -> dict[str, Any]:
    """scanpy's scores on the first `gene_count` genes (every cell), against quarry's."""
    import scanpy as sc

    say(f"scanpy: Wilcoxon, every cell type vs rest, {gene_count:,} genes")
    record: dict[str, Any] = {"genes": min(gene_count, adata.n_vars)}
    copy = adata[:, : record["genes"]].copy()
    with timed(record, "seconds"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc.tl.rank_genes_groups(copy, "cell_type", method="wilcoxon", use_raw=False)
    worst = 0.0
    for label, mine in ours.items():
        theirs = sc.get.rank_genes_groups_df(copy, group=label).set_index("names")["scores"]
        both = mine.reindex(theirs.index).to_numpy()
        scale = np.maximum(np.abs(theirs.to_numpy()), 1e-12)
        worst = max(worst, float(np.max(np.abs(both - theirs.to_numpy()) / scale)))
    record["max_relative_error"] = worst
    return record


def hvg(cluster: Any, adata: Any) -> dict[str, Any]:
    import scanpy as sc

    say("highly variable genes (seurat, 2,000): quarry, scanpy")
    record: dict[str, Any] = {}
    with timed(record, "quarry_s"):
        ours = genes.highly_variable_genes(cluster, "bench/by_genes", n_top_genes=2000)
    with timed(record, "scanpy_s"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = sc.pp.highly_variable_genes(adata, n_top_genes=2000, inplace=False)
    record["same_genes"] = bool(
        (ours["highly_variable"].to_numpy() == theirs["highly_variable"].to_numpy()).all()
    )
    record["quarry_bytes_shipped"] = ours.attrs["quarry"]["bytes_shipped"]
    return record


# ---- part 2 -----------------------------------------------------------------------------------


def part_two(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"members": args.members, "member_cells": args.member_cells}
    with quarry.local(devices=DEVICES) as cluster:
        warm_up(cluster, args)
        pids = {"host": os.getpid()} | {n: p.pid for n, p in cluster.processes.items()}
        with MemoryWatch(pids) as watch:
            names = []
            for member in range(args.members):
                generator = Generator(
                    args.member_cells, args.genes, args.member_density, 100 + member
                )
                var, obs = generator.tables()
                blocks = genes.GeneBlocks(generator.gene_blocks(), var, obs, dataset=f"m{member}")
                name = f"atlas/member{member}"
                say(f"part 2: make and store {name} ({args.member_cells:,} cells)")
                started = time.perf_counter()
                stored = genes.ingest(cluster, blocks, name, progress=False)
                result[f"{name}_ingest_s"] = time.perf_counter() - started
                result[f"{name}_bytes_stored"] = stored.entry.bytes_stored
                result[f"{name}_nonzero"] = generator.nonzero
                names.append(name)
            genes.collect(cluster, "atlas/all", names)
            sets = gene_sets(Generator(10, args.genes, args.density, 0).gene_names, args.seed + 1)
            steps = {
                "axis query (0.1% of cells, 50 genes)": lambda: genes.query(
                    cluster, "atlas/all", QUERIES["0.1%"], sets[50]
                ).to_anndata(),
                "t-test, every cell type vs rest": lambda: genes.rank_genes_groups(
                    cluster, "atlas/all", "cell_type", method="t-test"
                ),
                "Wilcoxon, every cell type vs rest": lambda: genes.rank_genes_groups(
                    cluster, "atlas/all", "cell_type", method="wilcoxon"
                ),
                "highly variable genes (seurat, 2,000)": lambda: genes.highly_variable_genes(
                    cluster, "atlas/all", n_top_genes=2000
                ),
            }
            result["steps"] = {}
            for label, step in steps.items():
                say(f"part 2: {label}")
                record: dict[str, Any] = {}
                try:
                    with timed(record):
                        answer = step()
                    record["rows"] = int(getattr(answer, "shape", (len(answer),))[0])
                except Exception as error:  # a failure is a result, not the end of the run
                    record["error"] = f"{type(error).__name__}: {error}"
                result["steps"][label] = record
        result["memory"] = watch.peaks()
    return result


# ---- report -----------------------------------------------------------------------------------


def acceptance(one: dict[str, Any]) -> dict[str, Any]:
    """Part 1 against issue 35's lines: each axis query's speed-up over TileDB-SOMA and its
    bytes-read factor (the matrix's bytes / bytes read) against the one it needs (the selected
    fraction's inverse / 2); Wilcoxon's first call against illico's (same threads)."""
    queries = []
    for q in one.get("queries", []):
        row: dict[str, Any] = {"query": q["query"], "genes": q["genes"]}
        row["factor_needed"] = 1 / q["cell_fraction"] / 2 if q["cell_fraction"] else None
        for stored in ("by_cells", "by_cells_zstd", "by_cells_ordered"):
            if f"quarry_{stored}" not in q:
                continue
            report = q[f"quarry_{stored}"]
            row[f"{stored}_read_factor"] = report["bytes_matrix"] / max(report["bytes_read"], 1)
            if "tiledb" in q:
                row[f"{stored}_speedup"] = q["tiledb"]["seconds"] / q[f"quarry_{stored}_s"]
        queries.append(row)
    w = one.get("wilcoxon", {})
    first = w.get("quarry_first_s")
    wilcoxon = {
        f"vs_{tool}": w[tool]["first_s"] / first for tool in ("illico", "illico_csc") if tool in w
    }
    return {"queries": queries, "wilcoxon_first_call_speedup": wilcoxon}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 4, figsize=(22, 5.5))
    one = result.get("part_one", {})
    queries = one.get("queries", [])
    labels = [f"{q['query']}\n{q['genes']} genes" for q in queries]
    x = np.arange(len(queries))
    width = 0.2
    series = [
        ("quarry by cells", [q.get("quarry_by_cells_s", 0) for q in queries], "tab:blue"),
        ("quarry by cells, zstd", [q.get("quarry_by_cells_zstd_s", 0) for q in queries], "navy"),
        ("quarry by genes", [q.get("quarry_by_genes_s", 0) for q in queries], "tab:cyan"),
        ("TileDB-SOMA", [q.get("tiledb", {}).get("seconds", 0) for q in queries], "tab:orange"),
    ]
    ordered = [q.get("quarry_by_cells_ordered_s", 0) for q in queries]
    if any(ordered):
        series.insert(1, ("quarry by cells, ordered", ordered, "tab:purple"))
    width = 0.8 / len(series)
    for i, (name, values, color) in enumerate(series):
        axes[0].bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name, color=color)
    axes[0].set_xticks(x, labels, fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("seconds (log)")
    axes[0].set_title("axis queries: time (first call)")
    axes[0].legend(fontsize=8)
    reads = [
        ("quarry by cells", [q["quarry_by_cells"]["bytes_read"] for q in queries], "tab:blue"),
        (
            "quarry by cells, zstd",
            [q.get("quarry_by_cells_zstd", {}).get("bytes_read", 0) for q in queries],
            "navy",
        ),
        ("quarry by genes", [q["quarry_by_genes"]["bytes_read"] for q in queries], "tab:cyan"),
        ("TileDB-SOMA", [q.get("tiledb", {}).get("bytes_read", 0) for q in queries], "tab:orange"),
    ]
    ordered = [q.get("quarry_by_cells_ordered", {}).get("bytes_read", 0) for q in queries]
    if any(ordered):
        reads.insert(1, ("quarry by cells, ordered", ordered, "tab:purple"))
    for i, (name, values, color) in enumerate(reads):
        offset = (i - (len(reads) - 1) / 2) * width
        axes[1].bar(x + offset, np.maximum(values, 1), width, label=name, color=color)
    if queries:
        axes[1].axhline(queries[0]["quarry_by_cells"]["bytes_matrix"], color="gray", ls="--")
    axes[1].set_xticks(x, labels, fontsize=8)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("bytes read (log); dashed: the matrix stored by cells")
    axes[1].set_title("axis queries: bytes read")
    w = one.get("wilcoxon", {})
    bars = {
        "quarry\nfirst": w.get("quarry_first_s", 0),
        "quarry\ncached": w.get("quarry_cached_s", 0),
        "illico\nfirst": w.get("illico", {}).get("first_s", 0),
        "illico\nagain": w.get("illico", {}).get("again_s", 0),
        "illico CSC\nfirst": w.get("illico_csc", {}).get("first_s", 0),
        f"scanpy\n{w.get('scanpy', {}).get('genes', 'all')} genes": w.get("scanpy", {}).get(
            "seconds", 0
        ),
        "HVG\nquarry": one.get("hvg", {}).get("quarry_s", 0),
        "HVG\nscanpy": one.get("hvg", {}).get("scanpy_s", 0),
    }
    colors = ["tab:blue", "tab:cyan", "tab:green", "tab:olive", "tab:green", "tab:orange"]
    colors += ["tab:blue"]
    axes[2].bar(range(len(bars)), list(bars.values()), color=[*colors, "tab:orange"])
    axes[2].set_xticks(range(len(bars)), list(bars.keys()), fontsize=8)
    axes[2].set_yscale("log")
    axes[2].set_title("Wilcoxon (every type vs rest) and HVG: seconds")
    for i, value in enumerate(bars.values()):
        axes[2].annotate(
            f"{value:.2f}", (i, max(value, 1e-3)), ha="center", va="bottom", fontsize=8
        )
    two = result.get("part_two", {})
    steps = two.get("steps", {})
    names = [name.split(",")[0].split(" (")[0] for name in steps]
    seconds = [step.get("seconds", 0) for step in steps.values()]
    axes[3].bar(range(len(steps)), seconds, color="tab:blue")
    axes[3].set_xticks(range(len(steps)), names, fontsize=8, rotation=15)
    for i, value in enumerate(seconds):
        axes[3].annotate(f"{value:.1f} s", (i, value), ha="center", va="bottom", fontsize=8)
    peaks = two.get("memory", {})
    host = peaks.get("host", {}).get("vm_hwm_bytes", 0) / 2**30
    device = max((v["vm_hwm_bytes"] for k, v in peaks.items() if k != "host"), default=0) / 2**30
    cells = two.get("members", 0) * two.get("member_cells", 0)
    axes[3].set_title(
        f"collection of {cells:,} cells: seconds\npeak RSS host {host:.1f} GiB, "
        f"each device at most {device:.1f} GiB",
        fontsize=10,
    )
    matrix = one.get("matrix", {})
    figure.suptitle(
        f"{matrix.get('cells', 0):,} cells x {matrix.get('genes', 0):,} genes, "
        f"{matrix.get('density', 0):.1%} non-zero; {DEVICES} devices, {os.cpu_count()} cores"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--genes", type=int, default=20_000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--member-cells", type=int, default=1_000_000)
    parser.add_argument("--member-density", type=float, default=0.05)
    parser.add_argument("--scanpy-genes", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--skip-tiledb", action="store_true")
    parser.add_argument("--skip-illico", action="store_true")
    parser.add_argument("--skip-scanpy-wilcoxon", action="store_true")
    parser.add_argument("--skip-part-two", action="store_true")
    parser.add_argument("--only-part-two", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--reuse-part-two",
        action="store_true",
        help="keep the collection's results of the last run (part one measured again)",
    )
    parser.add_argument(
        "--order-by",
        default="",
        help="also store the matrix by cells in the order of these cell metadata columns "
        "(comma-separated, e.g. tissue,donor,cell_type) and query it as by_cells_ordered",
    )
    parser.add_argument("--name", default="cells")
    args = parser.parse_args()
    args.order_by = [c for c in args.order_by.split(",") if c]
    free = shutil.disk_usage(tempfile.gettempdir()).free
    result: dict[str, Any] = {"arguments": vars(args), "disk_free_bytes_at_start": free}
    previous_part_two, previous_date = None, None
    if args.reuse_part_two:
        previous = json.loads((RESULTS / f"{args.name}.json").read_text())
        previous_part_two = previous["part_two"]
        previous_date = previous["environment"]["date"]
    if args.only_part_two:  # a process of its own: its peak memory is part two's alone
        write_json(f"{args.name}_part_two", part_two(args))
        return
    with tempfile.TemporaryDirectory(prefix="quarry-cells-") as work:
        result["part_one"] = part_one(args, Path(work))
    result["acceptance"] = acceptance(result["part_one"])
    write_json(args.name, result)
    if args.reuse_part_two:  # part two of the last run, kept as it was measured
        result["part_two"] = previous_part_two
        result["part_two_from"] = previous_date
    elif not args.skip_part_two:
        command = [sys.executable, __file__, *sys.argv[1:], "--only-part-two"]
        subprocess.run(command, check=True)
        part = RESULTS / f"{args.name}_part_two.json"
        result["part_two"] = {
            k: v
            for k, v in json.loads(part.read_text()).items()
            if k not in ("environment", "benchmark")
        }
        part.unlink()
    path = write_json(args.name, result)
    plot(result, png_path(args.name))
    say(f"wrote {path}")


if __name__ == "__main__":
    main()
