"""Rank genes by differential expression: on a cluster (`rank_genes`) or in memory.

Both run the decomposition of Skytether Figure 1 (Accumulate per slice -> Combine -> TStat) and
share everything but where Accumulate runs:

- `rank_genes` works on a matrix stored on a cluster (`quarry.genes.ingest`): devices run
  Accumulate and Combine next to the slices (or push slices back, or the host does it all with
  pushdown="never"), and ship a few numbers per gene; the host runs TStat.
- `rank_genes_local` runs the same steps in one process over an `ExpressionMatrix`: the
  reference the cluster's answers must equal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from quarry.genes.errors import GenesInputError, StaleDataset
from quarry.genes.groups import (
    CellAxis,
    Grouping,
    grouping_from_cells,
    grouping_from_column,
    restrict_to_cells,
)
from quarry.genes.layout import (
    DENSITY_THRESHOLD,
    SLICE_BYTES_TARGET,
    Encoding,
    Orientation,
    encode_slices,
    iter_rows_batches,
)
from quarry.genes.matrix import GENE_COLUMN, ExpressionMatrix
from quarry.genes.stats import Method, accumulate, combine, select_groups, tstat
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.genes.dispatch import PushBack

REST = "rest"
# A dataset re-ingested between the host's look at the catalog and a device's answer: look
# again, this many times.
STALE_RETRIES = 1

# Column names of scanpy's rank_genes_groups results, which users already know.
RESULT_COLUMNS = ["names", "scores", "pvals", "pvals_adj", "logfoldchanges"]

GroupSpec = str | int | Sequence[str]


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a union of groups of one dataset's grouping."""

    axis: Any  # ExpressionMatrix or StoredMatrix (a CellAxis with genes and metadata)
    grouping: Grouping
    group_ids: list[int]


def plan_comparison(
    axis: CellAxis,
    groupby: str | None,
    group: GroupSpec | None,
    reference: GroupSpec,
    method: str,
    *,
    reference_axis: CellAxis | None = None,
    reference_groupby: str | None = None,
    cells: Sequence[str] | None = None,
    reference_cells: Sequence[str] | None = None,
) -> tuple[Side, Side]:
    """Which cells each side holds, checked: the control-plane half of a ranking request.

    A label of `groupby` gives a grouping with one group per label of the column, so every
    request on that column shares one grouping (and the devices' cached statistics).
    """
    if method not in ("welch", "student"):
        raise GenesInputError(f"unknown t-test method {method!r}; use 'welch' or 'student'")
    if group is None:
        raise GenesInputError(
            f"dataset {axis.dataset!r}: say which group to rank (a label of groupby, or cells)"
        )
    if reference_axis is None:
        grouping, group_ids, reference_ids = _same_dataset_groups(axis, groupby, group, reference)
        if cells is not None:
            grouping = restrict_to_cells(grouping, axis, cells)
        _check_group_sizes(grouping, group_ids, group)
        _check_group_sizes(grouping, reference_ids, reference)
        return Side(axis, grouping, group_ids), Side(axis, grouping, reference_ids)
    if _is_rest(reference):
        raise GenesInputError(
            f"dataset {reference_axis.dataset!r}: 'rest' means the other cells of the "
            "same dataset; name a group (label or cell ids) of the reference dataset"
        )
    grouping_a, group_ids = _one_group(axis, groupby, group)
    grouping_b, reference_ids = _one_group(reference_axis, reference_groupby or groupby, reference)
    if cells is not None:
        grouping_a = restrict_to_cells(grouping_a, axis, cells)
    if reference_cells is not None:
        grouping_b = restrict_to_cells(grouping_b, reference_axis, reference_cells)
    _check_group_sizes(grouping_a, group_ids, group)
    _check_group_sizes(grouping_b, reference_ids, reference)
    return Side(axis, grouping_a, group_ids), Side(reference_axis, grouping_b, reference_ids)


def rank_genes(
    cluster: Cluster,
    dataset: str,
    groupby: str | None = None,
    group: GroupSpec | None = None,
    reference: GroupSpec = REST,
    method: Method = "welch",
    *,
    pushdown: Pushdown | str = Pushdown.AUTO,
    cells: Sequence[str] | None = None,
    reference_dataset: str | None = None,
    reference_groupby: str | None = None,
    reference_cells: Sequence[str] | None = None,
    push_back: Mapping[str, PushBack] | None = None,
    policy: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Rank the genes of a stored matrix by a t-test of `group` against `reference`.

    dataset:   an expression matrix stored with `quarry.genes.ingest` ("domain/name").
    group:     a label of the cell-metadata column `groupby`, or a list of cell ids.
    reference: "rest" (every other cell of the dataset), a label of `reference_groupby`
               (default `groupby`), or a list of cell ids.
    reference_dataset: compare with a group of another stored matrix; genes are matched by
               name, and genes only one of them has are left out.
    cells / reference_cells: only these cells take part (Figure 1's selection); "rest" then
               means the other cells of this selection.
    pushdown:  "auto" (devices decide per slice whether to run Accumulate or push the slice
               back), "always" (devices run it), "never" (the host scans every slice raw and
               does everything: the host-only baseline).
    push_back: force devices to push back slice ranges, {dataset: {partition: [(first, end)]}}
               (for tests and experiments; the answer does not change).

    Returns scanpy's columns (names, scores, pvals, pvals_adj, logfoldchanges), best score
    first. `attrs["metadata"]` holds the dataset's custom metadata (`reference_metadata` the
    reference's), `attrs["quarry"]` what ran where and what moved: bytes shipped to the host,
    bytes read on the devices, slices executed / pushed back / cached, seconds.
    """
    from quarry.genes.dispatch import GENES_MODES

    pushdown = Pushdown.parse(pushdown, GENES_MODES)
    options = {
        "groupby": groupby,
        "group": group,
        "reference": reference,
        "method": method,
        "pushdown": pushdown,
        "cells": cells,
        "reference_dataset": reference_dataset,
        "reference_groupby": reference_groupby,
        "reference_cells": reference_cells,
        "push_back": push_back,
        "policy": policy,
    }
    for attempt in range(STALE_RETRIES + 1):
        cluster.refresh()  # another process may have re-ingested: versions must be current
        try:
            return _rank_on_cluster(cluster, dataset, **options)
        except StaleDataset:
            if attempt == STALE_RETRIES:
                raise
    raise AssertionError("unreachable")


def _rank_on_cluster(
    cluster: Cluster,
    dataset: str,
    *,
    groupby: str | None,
    group: GroupSpec | None,
    reference: GroupSpec,
    method: Method,
    pushdown: Pushdown,
    cells: Sequence[str] | None,
    reference_dataset: str | None,
    reference_groupby: str | None,
    reference_cells: Sequence[str] | None,
    push_back: Mapping[str, PushBack] | None,
    policy: Mapping[str, Any] | None,
) -> pd.DataFrame:
    from quarry.genes.datasets import open_matrix
    from quarry.genes.dispatch import side_statistics

    started = time.perf_counter()
    matrix = open_matrix(cluster, dataset)
    other = open_matrix(cluster, reference_dataset) if reference_dataset is not None else None
    side_a, side_b = plan_comparison(
        matrix,
        groupby,
        group,
        reference,
        method,
        reference_axis=other,
        reference_groupby=reference_groupby,
        cells=cells,
        reference_cells=reference_cells,
    )
    forced = dict(push_back or {})
    unknown = sorted(set(forced) - {matrix.dataset, other.dataset if other else matrix.dataset})
    if unknown:
        raise GenesInputError(f"push_back names datasets {unknown} that take no part")
    options = {"pushdown": pushdown, "policy": policy}
    if other is None:
        statistics, report = side_statistics(
            matrix,
            side_a.grouping,
            [side_a.group_ids, side_b.group_ids],
            push_back=forced.get(matrix.dataset),
            **options,
        )
        stats_a, stats_b = _side(statistics, 0), _side(statistics, 1)
        reports = [report]
    else:
        statistics_a, report_a = side_statistics(
            matrix,
            side_a.grouping,
            [side_a.group_ids],
            push_back=forced.get(matrix.dataset),
            **options,
        )
        statistics_b, report_b = side_statistics(
            other,
            side_b.grouping,
            [side_b.group_ids],
            push_back=forced.get(other.dataset),
            **options,
        )
        stats_a, stats_b = _side(statistics_a, 0), _side(statistics_b, 0)
        reports = [report_a, report_b]
    host_started = time.perf_counter()
    frame = rank_frame(
        side_a, side_b, named(stats_a, side_a.axis), named(stats_b, side_b.axis), method
    )
    tstat_s = time.perf_counter() - host_started
    frame.attrs["quarry"] = quarry_attrs(reports, pushdown, tstat_s, time.perf_counter() - started)
    frame.attrs["dataset"] = matrix.dataset
    frame.attrs["reference_dataset"] = (other or matrix).dataset
    frame.attrs["version"] = matrix.version
    return frame


def rank_genes_local(
    matrix: ExpressionMatrix,
    groupby: str | None = None,
    group: GroupSpec | None = None,
    reference: GroupSpec = REST,
    method: Method = "welch",
    *,
    reference_matrix: ExpressionMatrix | None = None,
    reference_groupby: str | None = None,
    cells: Sequence[str] | None = None,
    orientation: Orientation = "genes",
    rows_per_slice: int | None = None,
    slice_bytes_target: int | None = None,
    encoding: Encoding | Literal["rows"] = "auto",
    density_threshold: float = DENSITY_THRESHOLD,
) -> pd.DataFrame:
    """Rank genes by a t-test of `group` against `reference`, like scanpy's rank_genes_groups.

    group:     a label of the cell-metadata column `groupby`, or a list of cell ids.
    reference: "rest" (every other cell of the dataset, labelled or not), a label of
               `reference_groupby` (default `groupby`), or a list of cell ids.
    reference_matrix: compare with a group of another dataset; genes are matched by name and
               genes missing from either dataset are left out.

    Returns names, scores, pvals, pvals_adj, logfoldchanges, sorted by score (highest first);
    `attrs` carries both datasets' metadata. The layout arguments only choose how the matrix
    is sliced: the answer does not depend on them (tests check that). encoding="rows" is the
    layout `quarry.genes.ingest` stores; then the answer equals `rank_genes`' bit for bit.
    """
    side_a, side_b = plan_comparison(
        matrix,
        groupby,
        group,
        reference,
        method,
        reference_axis=reference_matrix,
        reference_groupby=reference_groupby,
        cells=cells,
    )
    layout_options = {
        "orientation": orientation,
        "rows_per_slice": rows_per_slice,
        "slice_bytes_target": slice_bytes_target,
        "encoding": encoding,
        "density_threshold": density_threshold,
    }
    statistics_a = _accumulate_matrix(side_a.axis, side_a.grouping, layout_options)
    statistics_b = (
        statistics_a
        if side_b.grouping is side_a.grouping
        else _accumulate_matrix(side_b.axis, side_b.grouping, layout_options)
    )
    stats_a = named(select_groups(statistics_a, side_a.group_ids), side_a.axis)
    stats_b = named(select_groups(statistics_b, side_b.group_ids), side_b.axis)
    return rank_frame(side_a, side_b, stats_a, stats_b, method)


def rank_frame(
    side_a: Side, side_b: Side, stats_a: pa.Table, stats_b: pa.Table, method: Method
) -> pd.DataFrame:
    """TStat on the host, as a scanpy-like frame carrying both datasets' metadata."""
    if side_a.axis is side_b.axis:
        log1p_base = side_a.axis.metadata.get("log1p_base")
    else:
        log1p_base = _same_log1p_base(side_a.axis, side_b.axis)
    result = tstat(stats_a, stats_b, method, log1p_base=log1p_base)
    if result.num_rows == 0:
        raise GenesInputError(
            f"dataset {side_a.axis.dataset!r}: no gene is shared with dataset "
            f"{side_b.axis.dataset!r}; gene names must match to compare"
        )
    frame = pd.DataFrame(
        {
            "names": result.column("gene").to_numpy(zero_copy_only=False),
            "scores": result.column("score").to_numpy(),
            "pvals": result.column("pval").to_numpy(),
            "pvals_adj": result.column("pval_adj").to_numpy(),
            "logfoldchanges": result.column("logfoldchange").to_numpy(),
        }
    )
    frame = frame.sort_values("scores", ascending=False, kind="stable", na_position="last")
    frame = frame.reset_index(drop=True)
    frame.attrs["metadata"] = dict(side_a.axis.metadata)
    frame.attrs["reference_metadata"] = dict(side_b.axis.metadata)
    frame.attrs["genes_compared"] = result.num_rows
    return frame


def _side(statistics: pa.RecordBatch, side: int) -> pa.RecordBatch:
    table = pa.Table.from_batches([statistics])
    chosen = table.filter(pc.equal(table.column("group"), side)).combine_chunks()
    if chosen.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=statistics.schema)
    return chosen.to_batches()[0]


def quarry_attrs(
    reports: list[Any], pushdown: Pushdown, tstat_s: float, wall_s: float
) -> dict[str, Any]:
    from quarry.genes.dispatch import REPORT_COUNTERS

    total = {key: sum(getattr(r, key) for r in reports) for key in REPORT_COUNTERS}
    return {
        "pushdown": pushdown,
        **total,
        "tstat_s": tstat_s,
        "wall_s": wall_s,
        "failovers": [f for r in reports for f in r.failovers],
        "datasets": [r.to_json() for r in reports],
    }


def _accumulate_matrix(
    matrix: ExpressionMatrix, grouping: Grouping, layout_options: dict[str, Any]
) -> pa.RecordBatch:
    """Accumulate every slice for every group of the grouping, then Combine (Figure 1)."""
    if layout_options["encoding"] == "rows":
        # The layout a cluster stores: per-row dense or sparse, so the answer is the cluster's
        # to the last bit (a row's statistics do not depend on its slice's other rows).
        _, slices = iter_rows_batches(
            matrix,
            orientation=layout_options["orientation"],
            batch_bytes_target=layout_options["slice_bytes_target"] or SLICE_BYTES_TARGET,
        )
    else:
        slices = encode_slices(matrix, **layout_options)
    partials = [accumulate(batch, grouping.group_of_cell, grouping.group_count) for batch in slices]
    return combine(partials)


def _same_dataset_groups(
    matrix: CellAxis, groupby: str | None, group: GroupSpec, reference: GroupSpec
) -> tuple[Grouping, list[int], list[int]]:
    """A grouping of the dataset and the group ids on each side of the comparison."""
    if _is_label(group) and _is_label(reference):
        grouping = grouping_from_column(matrix, _need_groupby(matrix, groupby, group))
        group_id = grouping.id_of(group)
        if _is_rest(reference):
            return grouping, [group_id], [g for g in range(grouping.group_count) if g != group_id]
        reference_id = grouping.id_of(reference)
        if reference_id == group_id:
            raise GenesInputError(
                f"dataset {matrix.dataset!r}: group and reference are both {str(group)!r}"
            )
        return grouping, [group_id], [reference_id]
    # At least one side is a list of cells: group by membership of the two sets.
    group_cells = _cells_of(matrix, groupby, group)
    if _is_rest(reference):
        grouping = grouping_from_cells(matrix, {"group": group_cells}, others_label=REST)
    else:
        reference_cells = _cells_of(matrix, groupby, reference)
        grouping = grouping_from_cells(matrix, {"group": group_cells, "reference": reference_cells})
    return grouping, [0], [1]


def _one_group(
    matrix: CellAxis, groupby: str | None, group: GroupSpec
) -> tuple[Grouping, list[int]]:
    if _is_label(group):
        grouping = grouping_from_column(matrix, _need_groupby(matrix, groupby, group))
        return grouping, [grouping.id_of(group)]
    return grouping_from_cells(matrix, {"group": _cells_of(matrix, None, group)}), [0]


def _cells_of(matrix: CellAxis, groupby: str | None, group: GroupSpec) -> list[str]:
    if not _is_label(group):
        return [str(cell) for cell in group]
    grouping = grouping_from_column(matrix, _need_groupby(matrix, groupby, group))
    members = grouping.group_of_cell == grouping.id_of(group)
    return [str(cell) for cell in matrix.cell_ids[members]]


def _check_group_sizes(grouping: Grouping, group_ids: list[int], spec: GroupSpec) -> None:
    cells = int(grouping.cell_counts()[group_ids].sum())
    if cells < 2:
        name = str(spec) if _is_label(spec) else "of the given cells"
        raise GenesInputError(
            f"dataset {grouping.dataset!r}: group {name!r} of {grouping.source} has {cells} "
            "cell(s); a t-test needs at least 2 cells in each group"
        )


def _need_groupby(matrix: CellAxis, groupby: str | None, group: GroupSpec) -> str:
    if groupby is None:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: group {str(group)!r} is a label; say which cell "
            "metadata column it is in (groupby=...), or pass a list of cell ids"
        )
    return groupby


def _is_label(spec: object) -> bool:
    """A group label (rest included); anything else is a list of cell ids."""
    return isinstance(spec, str | int | np.integer)


def _is_rest(spec: object) -> bool:
    return isinstance(spec, str) and spec == REST


def named(statistics: pa.RecordBatch, matrix: Any) -> pa.Table:
    """Replace gene row numbers by gene names, so that datasets can be matched by name."""
    names = matrix.genes.column(GENE_COLUMN).take(statistics.column("gene"))
    table = pa.Table.from_batches([statistics])
    return table.set_column(0, "gene", names)


def _same_log1p_base(matrix: Any, other: Any) -> float | None:
    base, other_base = matrix.metadata.get("log1p_base"), other.metadata.get("log1p_base")
    if base != other_base:
        raise GenesInputError(
            f"datasets {matrix.dataset!r} and {other.dataset!r} were log-transformed with "
            f"different bases ({base} and {other_base}); fold changes would not compare"
        )
    return base
