"""Differential expression on a million cells: quarry in bounded memory beside scanpy (issue 14).

The synthetic matrix of bench/de.py (`de.gene_blocks`, the same generator), at 1,000,000 cells x
20,000 genes and 5% non-zero: about 1e9 values, 8 GB as a CSR matrix in memory.

- quarry: the blocks of genes are made on the fly and streamed into a local 4-device cluster
  (`genes.ingest` of `GeneBlocks`: the host holds one block at a time), then
  `genes.rank_genes_groups(method="t-test")` ranks all 10 clusters against the rest in one
  request, first call and cached call.
- scanpy, in a process of its own (its memory is its own, and its failure cannot end the run):
  the same generator with the same seed builds the AnnData (cells x genes CSR, float32) and
  `sc.tl.rank_genes_groups(method="t-test")` ranks the same clusters. It runs under an
  address-space limit, a time limit, and a watch on the machine's available memory (the
  machine is shared; no swap), and a failure (MemoryError, a kill, the time limit) is a result.

Reported: ingest and call times, bytes stored, read and shipped, the peak resident memory of
the bench process (it generates the blocks and coordinates), of each device and of the scanpy
process, or scanpy's failure, and where scanpy completes the agreement of the scores and of the
top genes per cluster. Writes bench/results/de_million.json and de_million.png.

    python bench/de_million.py                        # the million-cell run (30-40 min)
    python bench/de_million.py --cells 100000         # the same at a tenth of the size
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from scipy import sparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import png_path, progress, write_json
from de import CLUSTERS, agreement, console, gene_blocks, scanpy_rank, warm_up

import quarry
from quarry import genes
from quarry.genes import GeneBlocks

CELLS = 1_000_000
GENES = 20_000
DENSITY = 0.05
DEVICES = 4
SEED = 14
DATASET = "bench/million"
TOP_GENES = 50  # the top of each cluster's ranking compared between quarry and scanpy
GIB = 1 << 30
SCANPY_ADDRESS_SPACE_GIB = 20.0
SCANPY_TIMEOUT_S = 1800.0
# scanpy is stopped when the machine's available memory falls below this: others share it
MACHINE_AVAILABLE_MIN_GIB = 0.75
SAMPLE_S = 0.25
SCANPY_SCRIPT_FLAG = "--scanpy-child"


# ---- memory of processes ----------------------------------------------------------------------


def status_kib(pid: int) -> dict[str, int]:
    """A process's memory lines of /proc/PID/status (VmHWM, VmRSS, RssAnon, RssFile ...), KiB."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                fields[name] = int(value.split()[0])
    return fields


class MemoryWatch:
    """Samples processes' resident memory while they work (a thread): each one's peak
    anonymous memory (RssAnon: what it allocated, not the store's mapped file pages) and the
    peak of their sum; `peaks()` adds each one's VmHWM, the kernel's own peak RSS."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.anon_peak = dict.fromkeys(pids, 0)
        self.rss_peak = dict.fromkeys(pids, 0)
        self.anon_sum_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            total = 0
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    fields = status_kib(pid)
                    anon = fields.get("RssAnon", 0) * 1024
                    self.anon_peak[name] = max(self.anon_peak[name], anon)
                    self.rss_peak[name] = max(self.rss_peak[name], fields["VmRSS"] * 1024)
                    total += anon
            self.anon_sum_peak = max(self.anon_sum_peak, total)

    def peaks(self) -> dict[str, dict[str, int]]:
        """Per process: VmHWM (peak RSS, mapped file pages included) and the sampled peaks."""
        return {
            name: {
                "vm_hwm_bytes": status_kib(pid)["VmHWM"] * 1024,
                "rss_anon_peak_bytes": self.anon_peak[name],
                "rss_peak_bytes": self.rss_peak[name],
            }
            for name, pid in self.pids.items()
        }


# ---- quarry -----------------------------------------------------------------------------------


def timing(blocks: Any, clock: dict[str, float]) -> Iterator[sparse.csr_matrix]:
    """The blocks as they are, adding the seconds spent making them to `clock["generate_s"]`
    (generation is the bench's, not the ingest's or the AnnData's)."""
    blocks = iter(blocks)
    while True:
        started = time.perf_counter()
        block = next(blocks, None)
        clock["generate_s"] += time.perf_counter() - started
        if block is None:
            return
        yield block
        del block


def counting(blocks: Any, cells_nonzero: np.ndarray) -> Iterator[sparse.csr_matrix]:
    """The blocks as they are, counting each cell's non-zeros on the way: what the scanpy
    process needs to lay its cells x genes CSR out before it fills it."""
    for block in blocks:
        cells_nonzero += np.bincount(block.indices, minlength=len(cells_nonzero))
        yield block
        del block


@contextlib.contextmanager
def timed(label: str) -> Iterator[dict[str, float]]:
    """A bar that runs while a step does (no count to show), and the step's seconds."""
    clock = {"seconds": 0.0}
    started = time.perf_counter()
    with progress(console) as bar:
        bar.add_task(label, total=None)
        yield clock
    clock["seconds"] = time.perf_counter() - started
    console.print(f"{label}: {clock['seconds']:.2f} s")


def quarry_run(args: argparse.Namespace, cells_nonzero: np.ndarray) -> dict[str, Any]:
    """Ingest the generated blocks and rank every cluster twice; memory and bytes of it all."""
    with quarry.local(devices=args.devices) as cluster:
        data = Path(cluster.data)
        pids = {"host": os.getpid()} | {n: p.pid for n, p in cluster.processes.items()}
        with MemoryWatch(pids) as watch:
            warm_up(cluster)
            run = ingest_and_rank(cluster, args, cells_nonzero)
        run["disk_bytes"] = folder_bytes(data)
        run["memory"] = memory_report(watch)
    run["cluster_folder_removed"] = not data.exists()
    assert run["cluster_folder_removed"], f"{data} is left behind"
    return run


def ingest_and_rank(
    cluster: Any, args: argparse.Namespace, cells_nonzero: np.ndarray
) -> dict[str, Any]:
    source = gene_blocks(args.genes, args.cells, args.density, args.seed, "generate and ingest")
    clock = {"generate_s": 0.0}
    blocks = counting(timing(source.blocks, clock), cells_nonzero)
    source = dataclasses.replace(source, blocks=blocks)
    started = time.perf_counter()
    stored = genes.ingest(cluster, source, DATASET, metadata={"bench": "de_million"})
    seconds = time.perf_counter() - started
    run: dict[str, Any] = {"generate_and_ingest_s": seconds, **clock}
    run["ingest_s"] = seconds - clock["generate_s"]  # encoding, sending, storing
    console.print(f"generated in {clock['generate_s']:.1f} s and stored in {run['ingest_s']:.1f} s")
    entry = stored.entry
    run |= {
        "nonzero": int(cells_nonzero.sum()),
        "matrix_bytes_stored": entry.bytes_stored,
        "slices": sum(p.slices for p in entry.partitions),
        "partitions": len(entry.partitions),
    }
    frame = None
    for call in ("first_call", "cached_call"):
        with timed(f"quarry: rank_genes_groups t-test, {call.replace('_', ' ')}") as clock:
            frame = genes.rank_genes_groups(
                cluster, DATASET, "cluster", method="t-test", pushdown="always"
            )
        attrs = frame.attrs["quarry"]
        run[call] = {"seconds": clock["seconds"]} | {
            k: attrs[k]
            for k in ("bytes_shipped", "bytes_read", "bytes_sent", "slices_executed", "requests")
        }
    assert frame is not None
    by_group = frame.groupby("group", observed=True)
    run["scores"] = {str(g): f.set_index("names")["scores"] for g, f in by_group}
    return run


def memory_report(watch: MemoryWatch) -> dict[str, Any]:
    peaks = watch.peaks()
    devices = {name: p for name, p in peaks.items() if name != "host"}
    return {
        "host_ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "host": peaks["host"],
        "devices": devices,
        "devices_vm_hwm_sum_bytes": sum(p["vm_hwm_bytes"] for p in devices.values()),
        "devices_rss_anon_peak_sum_bytes": sum(p["rss_anon_peak_bytes"] for p in devices.values()),
        "host_and_devices_rss_anon_peak_together_bytes": watch.anon_sum_peak,
    }


def folder_bytes(folder: Path) -> int:
    """Bytes the folder takes on disk (allocated blocks: LMDB files are sparse)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


# ---- scanpy, in a process of its own ----------------------------------------------------------


def scanpy_run(args: argparse.Namespace, cells_nonzero: np.ndarray, folder: Path) -> dict[str, Any]:
    """Start the scanpy process, watch it, and report what became of it."""
    counts_path, result_path = folder / "cells_nonzero.npy", folder / "scanpy.json"
    np.save(counts_path, cells_nonzero)
    command = [sys.executable, str(Path(__file__).resolve()), SCANPY_SCRIPT_FLAG]
    command += ["--genes", str(args.genes), "--cells", str(args.cells)]
    command += ["--density", str(args.density), "--seed", str(args.seed)]
    command += ["--counts", str(counts_path), "--result", str(result_path)]
    limit = int(args.scanpy_address_space_gib * GIB)
    console.print(
        f"scanpy: a process of its own, address space <= {args.scanpy_address_space_gib} GiB, "
        f"{args.scanpy_timeout_s:.0f} s at most ..."
    )
    started = time.perf_counter()
    child = subprocess.Popen(command)
    # Set from here, at once: the child is still starting Python, far from any large allocation.
    resource.prlimit(child.pid, resource.RLIMIT_AS, (limit, limit))
    stopped, status, sampled_hwm = watch_child(child, args.scanpy_timeout_s)
    run: dict[str, Any] = {
        "wall_s": time.perf_counter() - started,
        "address_space_limit_bytes": limit,
        "exit_code": os.waitstatus_to_exitcode(status),
    }
    if result_path.exists():
        run |= json.loads(result_path.read_text())
    # Its own VmHWM at the end, or the last sampled if it was killed (ru_maxrss of a child
    # would count this process's memory at the fork, which Linux carries across exec).
    run["peak_rss_bytes"] = max(run.get("vm_hwm_bytes", 0), sampled_hwm)
    if stopped:
        run["failure"] = stopped
    elif run["exit_code"] != 0 and "failure" not in run:
        code = run["exit_code"]
        run["failure"] = (
            f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        )
    console.print(
        f"scanpy: {run.get('failure', 'completed')}, peak RSS {run['peak_rss_bytes'] / GIB:.2f} GiB"
    )
    return run


def watch_child(child: subprocess.Popen, timeout_s: float) -> tuple[str | None, int, int]:
    """Wait for the child, stopping it past the time limit or when the machine runs short of
    memory; (why it was stopped or None, its wait status, its last sampled VmHWM in bytes)."""
    started, said = time.monotonic(), time.monotonic()
    stopped, hwm = None, 0
    while True:
        with contextlib.suppress(OSError, KeyError):
            hwm = max(hwm, status_kib(child.pid)["VmHWM"] * 1024)
        pid, status = os.waitpid(child.pid, os.WNOHANG)
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            return stopped, status, hwm
        available = psutil.virtual_memory().available
        if stopped is None and time.monotonic() - started > timeout_s:
            stopped = f"stopped at the time limit ({timeout_s:.0f} s)"
        elif stopped is None and available < MACHINE_AVAILABLE_MIN_GIB * GIB:
            stopped = f"stopped: the machine had {available / GIB:.2f} GiB available"
        if stopped is not None:
            child.kill()
        if time.monotonic() - said > 30:
            said = time.monotonic()
            with contextlib.suppress(OSError):
                rss = status_kib(child.pid)["VmRSS"] * 1024
                console.print(f"scanpy: running {said - started:.0f} s, RSS {rss / GIB:.2f} GiB")
        time.sleep(SAMPLE_S)


def scanpy_child(args: argparse.Namespace) -> None:
    """In the scanpy process: build the AnnData from the generator, rank, write the result.
    A failure (a MemoryError above all) is written down as the result, with its step."""
    result: dict[str, Any] = {}
    step = "build the AnnData"
    try:
        started, clock = time.perf_counter(), {"generate_s": 0.0}
        adata = build_anndata(args, clock)
        result["build_s"] = time.perf_counter() - started
        result["generate_s"] = clock["generate_s"]
        result["matrix_bytes_in_memory"] = int(
            adata.X.data.nbytes + adata.X.indices.nbytes + adata.X.indptr.nbytes
        )
        step = "rank_genes_groups"
        result["seconds"], result["scores"] = scanpy_rank(adata, "t-test")
    except MemoryError:
        result["failure"] = f"MemoryError in {step}"
    except Exception as error:  # written down as the result; the traceback goes to the log
        traceback.print_exc()
        result["failure"] = f"{type(error).__name__} in {step}: {error}"
    result["vm_hwm_bytes"] = status_kib(os.getpid())["VmHWM"] * 1024
    Path(args.result).write_text(json.dumps(result))
    sys.exit(3 if "failure" in result else 0)


def build_anndata(args: argparse.Namespace, clock: dict[str, float]) -> Any:
    import anndata
    import pandas as pd

    counts = np.load(args.counts)
    source = gene_blocks(args.genes, args.cells, args.density, args.seed, "scanpy: generate")
    source = dataclasses.replace(source, blocks=timing(source.blocks, clock))
    x = cells_by_genes(source, counts)
    obs = pd.DataFrame(
        {"cluster": source.cells.column("cluster").to_pandas().array},  # no index to align
        index=pd.Index(source.cell_ids, name="cell"),
    )
    var = pd.DataFrame(index=pd.Index(source.gene_names, name="gene"))
    return anndata.AnnData(X=x, obs=obs, var=var)


def cells_by_genes(source: GeneBlocks, cells_nonzero: np.ndarray) -> sparse.csr_matrix:
    """The blocks (genes x cells) as one cells x genes CSR, written in place: each block's
    values go to the rows of their cells, after the genes of earlier blocks. Only the final
    arrays and one block are ever in memory, as when a tool loads such a matrix."""
    indptr = np.concatenate(([0], np.cumsum(cells_nonzero))).astype(np.int64)
    index_type = np.int32 if indptr[-1] < 2**31 else np.int64
    data = np.empty(int(indptr[-1]), dtype=np.float32)
    indices = np.empty(int(indptr[-1]), dtype=index_type)
    cursor = indptr[:-1].copy()
    first_gene = 0
    for block in source.blocks:
        by_cell = block.tocsc()  # the block's genes of each cell, in order
        per_cell = np.diff(by_cell.indptr)
        destination = np.repeat(cursor - by_cell.indptr[:-1], per_cell) + np.arange(by_cell.nnz)
        data[destination] = by_cell.data
        indices[destination] = by_cell.indices + first_gene
        cursor += per_cell
        first_gene += block.shape[0]
        del block, by_cell, destination
    assert np.array_equal(cursor, indptr[1:]), "the matrix differs from the one counted"
    shape = (len(cells_nonzero), first_gene)
    return sparse.csr_matrix((data, indices, indptr), shape=shape, copy=False)


# ---- comparison and report --------------------------------------------------------------------


def top_genes_agreement(
    quarry_scores: dict[str, Any], scanpy_scores: dict[str, dict[str, float]]
) -> dict[str, float]:
    """Per cluster, the share of scanpy's top genes that quarry also ranks in its top."""
    shares = []
    for label, ours in quarry_scores.items():
        theirs = sorted(scanpy_scores[label], key=scanpy_scores[label].get, reverse=True)
        mine = ours.sort_values(ascending=False).index[:TOP_GENES]
        shares.append(len(set(mine) & set(theirs[:TOP_GENES])) / TOP_GENES)
    return {
        "top_genes": TOP_GENES,
        "shared_min": min(shares),
        "shared_mean": float(np.mean(shares)),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q, s = result["quarry"], result["scanpy"]
    failed = s.get("failure")
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    times = {
        "quarry ingest\n(store, generation\nleft out)": q["ingest_s"],
        "quarry first call\n(all clusters)": q["first_call"]["seconds"],
        "quarry cached call": q["cached_call"]["seconds"],
        "scanpy AnnData\n(generation\nleft out)": s.get("build_s", 0.0) - s.get("generate_s", 0.0),
        "scanpy\nrank_genes_groups": s.get("seconds", 0.0),
    }
    colors = ["tab:gray", "tab:blue", "tab:cyan", "tab:gray", "tab:orange"]
    left.bar(range(len(times)), list(times.values()), color=colors)
    left.set_xticks(range(len(times)), list(times.keys()), fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("seconds (log)")
    left.set_title("time")
    for i, value in enumerate(times.values()):
        label = f"{value:.2f} s" if value else "failed"
        left.annotate(label, (i, max(value, 1e-2)), ha="center", va="bottom", fontsize=8)

    memory = q["memory"]
    devices = f"quarry {result['devices']} devices"
    peaks = {
        "quarry host\n(generates, coordinates)": memory["host_ru_maxrss_bytes"],
        f"{devices}, sum of\npeak RSS (the store's\nmapped file pages too)": memory[
            "devices_vm_hwm_sum_bytes"
        ],
        f"{devices}, sum of\npeak allocated (anon)": memory["devices_rss_anon_peak_sum_bytes"],
        "scanpy process\n(peak RSS)": s["peak_rss_bytes"],
    }
    right.bar(
        range(len(peaks)),
        [v / GIB for v in peaks.values()],
        color=["tab:blue", "tab:purple", "tab:purple", "tab:red" if failed else "tab:orange"],
    )
    right.axhline(result["machine_memory_bytes"] / GIB, color="black", linestyle="--")
    right.annotate("this machine's memory", (0, result["machine_memory_bytes"] / GIB), fontsize=8)
    right.axhline(s["address_space_limit_bytes"] / GIB, color="tab:red", linestyle=":")
    right.annotate(
        "scanpy's address-space limit", (0, s["address_space_limit_bytes"] / GIB), fontsize=8
    )
    right.set_xticks(range(len(peaks)), list(peaks.keys()), fontsize=7)
    right.set_ylabel("GiB")
    right.set_title("peak resident memory" + (f" (scanpy: {failed})" if failed else ""))
    for i, value in enumerate(peaks.values()):
        right.annotate(f"{value / GIB:.2f}", (i, value / GIB), ha="center", va="bottom", fontsize=8)
    shape = result["matrix"]
    figure.suptitle(
        f"{shape['genes']:,} genes x {shape['cells']:,} cells, {shape['nonzero']:,} non-zero "
        f"({shape['density']:.1%}), {CLUSTERS} clusters, {result['devices']} devices, "
        f"{result['environment_cores']} cores"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--genes", type=int, default=GENES)
    parser.add_argument("--cells", type=int, default=CELLS)
    parser.add_argument("--density", type=float, default=DENSITY)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--scanpy-address-space-gib", type=float, default=SCANPY_ADDRESS_SPACE_GIB)
    parser.add_argument("--scanpy-timeout-s", type=float, default=SCANPY_TIMEOUT_S)
    parser.add_argument(SCANPY_SCRIPT_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scanpy_child:
        scanpy_child(args)
        return
    started = time.perf_counter()
    cells_nonzero = np.zeros(args.cells, dtype=np.int64)
    runs = quarry_run(args, cells_nonzero)
    quarry_scores = runs.pop("scores")
    with tempfile.TemporaryDirectory(prefix="de-million-") as folder:
        scanpy = scanpy_run(args, cells_nonzero, Path(folder))
    scanpy_scores = scanpy.pop("scores", None)
    nonzero = runs["nonzero"]
    result: dict[str, Any] = {
        "matrix": {
            "genes": args.genes,
            "cells": args.cells,
            "nonzero": nonzero,
            "density": nonzero / (args.genes * args.cells),
            "clusters": CLUSTERS,
            "bytes_csr_float32": nonzero * 8 + (args.cells + 1) * 8,
        },
        "devices": args.devices,
        "environment_cores": os.cpu_count(),
        "machine_memory_bytes": psutil.virtual_memory().total,
        "quarry": runs,
        "scanpy": scanpy,
        "agreement": agreement(quarry_scores, scanpy_scores) if scanpy_scores else None,
        "top_genes_agreement": top_genes_agreement(quarry_scores, scanpy_scores)
        if scanpy_scores
        else None,
        "bench_s": time.perf_counter() - started,
    }
    full = (args.cells, args.genes) == (CELLS, GENES)
    name = "de_million" if full else f"de_million_{args.cells}x{args.genes}"
    json_path = write_json(name, result)
    plot(result, png_path(name))
    console.print(f"wrote {json_path} and {png_path(name)}")


if __name__ == "__main__":
    main()
