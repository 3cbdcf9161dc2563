"""Gene statistics out of core: mean and variance per gene (overall or per group) and highly
variable genes (scanpy's `seurat` and `seurat_v3` flavours), from the devices' Accumulate.

A matrix larger than memory never comes to the host: each device reduces its slices to
(n, mean, m2) per gene and group (units `genes.accumulate`, `genes.accumulate_expm1`), the host
Combines them (over a collection's members too: Chan's update merges partials of different
datasets as it merges those of different slices) and does the per-gene arithmetic scanpy does
on the whole matrix. `seurat_v3` needs a second pass, of sums of values clipped per gene
(`genes.clipped_sums`), after the host's loess fit of the first pass's variances.

Variances are scanpy's: unbiased (n - 1). quarry's m2 is two-pass in float64 where scanpy's
dense path takes ``E[x^2] - E[x]^2`` from float32 products, so the figures agree to about
1e-6 relative, and the genes chosen are the same (tests/genes/test_genes_moments.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from quarry.genes.errors import GenesInputError
from quarry.genes.groups import Grouping, grouping_from_column
from quarry.genes.stats import PARTIAL_SCHEMA, GroupArrays, combine
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.genes.datasets import StoredMatrix
    from quarry.genes.device import Accumulate
    from quarry.genes.dispatch import Report

FLAVORS = ("seurat", "seurat_v3")
ALL_CELLS = "all"


@dataclass
class Moments:
    """Per gene and group (genes x groups arrays) n, mean and m2 over every member, the
    grouping of every member's cells under the collection's group ids (members one after the
    other), and what the devices moved."""

    grouping: Grouping
    arrays: GroupArrays
    reports: list[Report]

    @property
    def labels(self) -> tuple[str | None, ...]:
        return self.grouping.labels

    @property
    def variance(self) -> np.ndarray:
        """Unbiased, as scanpy's (n - 1); 0 where a group has fewer than 2 cells."""
        with np.errstate(divide="ignore", invalid="ignore"):
            var = self.arrays.m2 / (self.arrays.n - 1)
        return np.where(self.arrays.n > 1, var, 0.0)


GroupingOf = Callable[["StoredMatrix"], Grouping]


def moments(
    members: list[StoredMatrix],
    groupby: str | GroupingOf | None,
    pushdown: Pushdown,
    unit: type[Accumulate] | None = None,
    version_suffix: str = "",
) -> Moments:
    """Accumulate on every member's devices under the grouping of ``groupby`` (a cell metadata
    column, a function giving each member's grouping, or None: one group of every cell),
    Combined across members by label. Cells without a label keep a group of their own, last
    (they count in "the rest")."""
    from quarry.genes.device import Accumulate
    from quarry.genes.dispatch import side_statistics

    groupings = [_grouping(matrix, groupby) for matrix in members]
    named: list[str] = []
    for grouping in groupings:
        named += [str(x) for x in grouping.labels if x is not None and str(x) not in named]
    unlabelled = any(None in g.labels for g in groupings)
    labels: tuple[str | None, ...] = (*named, *((None,) if unlabelled else ()))
    index = {label: i for i, label in enumerate(labels)}
    partials, reports, codes = [], [], []
    for matrix, grouping in zip(members, groupings, strict=True):
        ids = np.array(
            [index[None if x is None else str(x)] for x in grouping.labels], dtype=np.int32
        )
        every = [[g] for g in range(grouping.group_count)]
        statistics, report = side_statistics(
            matrix,
            grouping,
            every,
            pushdown,
            unit=unit or Accumulate,
            version_suffix=version_suffix,
        )
        reports.append(report)
        partials.append(_relabelled(statistics, ids))
        member_codes = grouping.group_of_cell
        codes.append(np.where(member_codes >= 0, ids[np.maximum(member_codes, 0)], -1))
    combined = combine(partials) if partials else PARTIAL_SCHEMA.empty_table()
    arrays = GroupArrays.of(combined, max(len(labels), 1))
    assert len(arrays.genes) == members[0].gene_count, "a gene's statistics went missing"
    source = groupings[0].source
    name = members[0].dataset if len(members) == 1 else f"{len(members)} matrices"
    grouping = Grouping(np.concatenate(codes).astype(np.int32), labels, name, source)
    return Moments(grouping, arrays, reports)


def mean_var(
    cluster: Cluster,
    source: str,
    groupby: str | None = None,
    *,
    pushdown: Pushdown | str = Pushdown.AUTO,
) -> Any:
    """Per gene mean and (unbiased) variance over every cell of a matrix or collection: a
    DataFrame indexed by gene name (``mean``, ``var``); with ``groupby``, per label of that cell
    metadata column: an AnnData of groups x genes with layers ``mean`` and ``var`` and
    ``obs["n_cells"]``, as ``sc.get.aggregate(adata, by=groupby, func=["mean", "var"])``."""
    import anndata

    from quarry.genes.collections import members_of
    from quarry.genes.dispatch import GENES_MODES

    mode = Pushdown.parse(pushdown, GENES_MODES)
    cluster.refresh()
    members, _ = members_of(cluster, source)
    found = moments(members, groupby, mode)
    names = pd.Index(np.asarray(members[0].gene_names, dtype=str))
    if groupby is None:
        frame = pd.DataFrame(
            {"mean": found.arrays.mean[:, 0], "var": found.variance[:, 0]}, index=names
        )
        frame.attrs["quarry"] = _moved(found.reports)
        return frame
    named = [g for g, label in enumerate(found.labels) if label is not None]
    obs = pd.DataFrame(
        {"n_cells": found.arrays.n[0, named].astype(np.int64)},
        index=pd.Index([str(found.labels[g]) for g in named], name=groupby),
    )
    adata = anndata.AnnData(
        obs=obs,
        var=pd.DataFrame(index=names),
        layers={
            "mean": found.arrays.mean[:, named].T.copy(),
            "var": found.variance[:, named].T.copy(),
        },
    )
    adata.uns["quarry"] = _moved(found.reports)
    return adata


def highly_variable_genes(
    cluster: Cluster,
    source: str,
    *,
    flavor: str = "seurat",
    n_top_genes: int | None = None,
    min_mean: float = 0.0125,
    max_mean: float = 3.0,
    min_disp: float = 0.5,
    max_disp: float = math.inf,
    n_bins: int = 20,
    span: float = 0.3,
    pushdown: Pushdown | str = Pushdown.AUTO,
) -> pd.DataFrame:
    """scanpy's ``highly_variable_genes`` (no ``batch_key``) over a stored matrix or collection,
    the matrix read only on the devices. ``seurat`` expects log1p data (the matrix's own log1p
    base is used), ``seurat_v3`` counts and ``n_top_genes`` (and scikit-misc for its loess).
    Returns scanpy's frame (``inplace=False``), indexed by gene name."""
    from quarry.genes.collections import members_of
    from quarry.genes.dispatch import GENES_MODES

    if flavor not in FLAVORS:
        raise GenesInputError(f"flavor is one of {FLAVORS}, not {flavor!r}")
    mode = Pushdown.parse(pushdown, GENES_MODES)
    cluster.refresh()
    members, _ = members_of(cluster, source)
    names = pd.Index(np.asarray(members[0].gene_names, dtype=str))
    if flavor == "seurat":
        frame, reports = _seurat(members, mode, n_top_genes, n_bins,
                                 (min_mean, max_mean, min_disp, max_disp))  # fmt: skip
    else:
        if n_top_genes is None:
            raise GenesInputError("flavor 'seurat_v3' ranks genes: give n_top_genes")
        frame, reports = _seurat_v3(members, mode, n_top_genes, span)
    frame.index = names
    frame.attrs["quarry"] = _moved(reports)
    return frame


def _seurat(
    members: list[StoredMatrix],
    mode: Pushdown,
    n_top_genes: int | None,
    n_bins: int,
    cutoffs: tuple[float, float, float, float],
) -> tuple[pd.DataFrame, list[Report]]:
    from quarry.genes.hvg_unit import Expm1Accumulate

    bases = {m.metadata.get("log1p_base") for m in members}
    if len(bases) > 1:
        raise GenesInputError(f"the matrices were log1p-transformed in different bases: {bases}")
    base = bases.pop()
    suffix = "" if base is None else f"@{math.log(float(base))!r}"
    found = moments(members, None, mode, unit=Expm1Accumulate, version_suffix=suffix)
    mean, var = found.arrays.mean[:, 0].copy(), found.variance[:, 0]
    mean[mean == 0] = 1e-12
    dispersion = var / mean
    dispersion[dispersion == 0] = np.nan
    dispersion = np.log(dispersion)
    mean = np.log1p(mean)
    frame = pd.DataFrame({"means": mean, "dispersions": dispersion})
    frame["mean_bin"] = pd.cut(frame["means"], bins=n_bins)
    grouped = frame.groupby("mean_bin", observed=True)["dispersions"]
    stats = grouped.agg(avg="mean", dev="std")
    single = stats["dev"].isnull()  # one gene in its bin: scanpy sets its dispersion to 1
    stats.loc[single, "dev"] = stats.loc[single, "avg"]
    stats.loc[single, "avg"] = 0
    stats = stats.loc[frame["mean_bin"]].set_index(frame.index)
    frame["dispersions_norm"] = (frame["dispersions"] - stats["avg"]) / stats["dev"]
    norm = frame["dispersions_norm"].to_numpy()
    if n_top_genes is None:
        min_mean, max_mean, min_disp, max_disp = cutoffs
        clean = np.nan_to_num(norm)
        frame["highly_variable"] = (
            (mean > min_mean) & (mean < max_mean) & (clean > min_disp) & (clean < max_disp)
        )
    else:
        finite = norm[~np.isnan(norm)]
        top = min(n_top_genes, len(finite))
        cut = np.sort(finite)[::-1][top - 1] if top else np.inf
        frame["highly_variable"] = np.nan_to_num(norm, nan=-np.inf) >= cut
    return frame[["means", "dispersions", "mean_bin", "dispersions_norm", "highly_variable"]], [
        *found.reports
    ]


def _seurat_v3(
    members: list[StoredMatrix], mode: Pushdown, n_top_genes: int, span: float
) -> tuple[pd.DataFrame, list[Report]]:
    try:
        from skmisc.loess import loess
    except ImportError:
        raise GenesInputError(
            "flavor 'seurat_v3' fits a loess curve with scikit-misc: pip install scikit-misc"
        ) from None
    found = moments(members, None, mode)
    n_obs = int(found.arrays.n[0, 0])
    mean, var = found.arrays.mean[:, 0], found.variance[:, 0]
    not_const = var > 0
    estimated = np.zeros(len(mean))
    model = loess(np.log10(mean[not_const]), np.log10(var[not_const]), span=span, degree=2)
    model.fit()
    estimated[not_const] = model.outputs.fitted_values
    reg_std = np.sqrt(10**estimated)
    clip = reg_std * np.sqrt(n_obs) + mean
    sums, squares, reports = _clipped_sums(members, clip, mode)
    norm = (1 / ((n_obs - 1) * np.square(reg_std))) * (
        n_obs * np.square(mean) + squares - 2 * sums * mean
    )
    ranks = np.argsort(np.argsort(-norm)).astype(np.float32)
    ranks[ranks >= n_top_genes] = np.nan
    frame = pd.DataFrame(
        {
            "means": mean,
            "variances": var,
            "highly_variable_rank": ranks,
            "variances_norm": norm,
        }
    )
    order = np.argsort(np.where(np.isnan(ranks), np.inf, ranks), kind="stable")
    chosen = np.zeros(len(mean), dtype=bool)
    chosen[order[:n_top_genes]] = True
    frame["highly_variable"] = chosen
    return frame, [*found.reports, *reports]


def _clipped_sums(
    members: list[StoredMatrix], clip: np.ndarray, mode: Pushdown
) -> tuple[np.ndarray, np.ndarray, list[Report]]:
    from quarry.genes.dispatch import RESULT_BATCHES_MAX, Dispatch, matrix_tasks, report_of
    from quarry.genes.hvg_unit import ClippedSums, ClippedSumsArgs

    genes = len(clip)
    sums, squares = np.zeros(genes), np.zeros(genes)
    reports = []
    for matrix in members:
        args = ClippedSumsArgs(
            ingest_ids=tuple(sorted(i.id for i in matrix.entry.ingests)),
            gene_count=genes,
            cell_count=matrix.cell_count,
        )
        payload = np.asarray(clip, "<f8").tobytes() + np.ones(matrix.cell_count, np.uint8).tobytes()
        dispatch = Dispatch()
        tasks = matrix_tasks(matrix, ClippedSums, args.to_json(), payload, mode, {}, None)
        parts = list(dispatch.run(tasks, len(tasks), RESULT_BATCHES_MAX, "quarry-genes-hvg"))
        for part in parts:
            gene = part.column("gene").to_numpy()
            sums += np.bincount(gene, part.column("sum").to_numpy(), minlength=genes)
            squares += np.bincount(gene, part.column("sum_squares").to_numpy(), minlength=genes)
        reports.append(report_of(matrix.dataset, mode, dispatch))
    return sums, squares, reports


def _grouping(matrix: StoredMatrix, groupby: str | GroupingOf | None) -> Grouping:
    if callable(groupby):
        return groupby(matrix)
    if groupby is not None:
        return grouping_from_column(matrix, groupby)
    return Grouping(
        np.zeros(matrix.cell_count, dtype=np.int32), (ALL_CELLS,), matrix.dataset, "every cell"
    )


def _relabelled(statistics: pa.RecordBatch, ids: np.ndarray) -> pa.RecordBatch:
    """Statistics of a member's groups under the collection's group ids (``ids[g]``)."""
    group = statistics.column("group").to_numpy()
    columns = list(statistics.columns)
    columns[1] = pa.array(ids[group].astype(np.int32))
    return pa.RecordBatch.from_arrays(columns, schema=PARTIAL_SCHEMA)


def _moved(reports: list[Report]) -> dict[str, Any]:
    from quarry.genes.dispatch import REPORT_COUNTERS

    total = {key: sum(getattr(r, key) for r in reports) for key in REPORT_COUNTERS}
    return {**total, "datasets": [r.to_json() for r in reports]}
