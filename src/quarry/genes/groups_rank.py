"""Rank every group of a column at once: scanpy's ``rank_genes_groups``, in one pass.

``rank_genes`` compares one group with a reference. A user clustering cells asks for all of
them: which genes mark each cluster against the rest. Asked one by one, that is one request per
group (the devices' cache makes every request after the first cheap, but each still travels
and Combines). Here one request asks the devices for every group's statistics at once (one
side per group: Accumulate already computes every group of the grouping, so the devices read
each slice once and ship genes x groups rows), and the host forms each group's reference as
the union of the others (``stats.GroupArrays``: vectorized over genes) and runs TStat per group.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from quarry.genes.errors import GenesInputError, StaleDataset
from quarry.genes.groups import Grouping, grouping_from_column
from quarry.genes.rank import REST, STALE_RETRIES, Side, named, quarry_attrs, rank_frame
from quarry.genes.stats import GroupArrays, Method

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.genes.dispatch import Pushdown

ALL = "all"


def rank_genes_groups(
    cluster: Cluster,
    dataset: str,
    groupby: str,
    groups: str | Sequence[str] = ALL,
    reference: str = REST,
    method: Method = "welch",
    *,
    pushdown: Pushdown = "auto",
) -> pd.DataFrame:
    """Rank the genes of each group of ``groupby`` against ``reference``: "rest" (every other
    cell of the dataset, labelled or not) or one label (then that group is not ranked).

    Returns scanpy's ``rank_genes_groups_df`` layout for all groups: ``group``, ``names``,
    ``scores``, ``pvals``, ``pvals_adj`` (Benjamini-Hochberg within each group),
    ``logfoldchanges``; groups in the column's order, each best score first. ``attrs["quarry"]``
    says what ran where and what moved, for the one request all groups share.
    """
    from quarry.genes.dispatch import PUSHDOWNS

    if pushdown not in PUSHDOWNS:
        raise GenesInputError(f"pushdown must be one of {PUSHDOWNS}, not {pushdown!r}")
    if method not in ("welch", "student"):
        raise GenesInputError(f"unknown t-test method {method!r}; use 'welch' or 'student'")
    for attempt in range(STALE_RETRIES + 1):
        cluster.refresh()  # another process may have re-ingested: versions must be current
        try:
            return _on_cluster(cluster, dataset, groupby, groups, reference, method, pushdown)
        except StaleDataset:
            if attempt == STALE_RETRIES:
                raise
    raise AssertionError("unreachable")


def _on_cluster(
    cluster: Cluster,
    dataset: str,
    groupby: str,
    groups: str | Sequence[str],
    reference: str,
    method: Method,
    pushdown: Pushdown,
) -> pd.DataFrame:
    from quarry.genes.datasets import open_matrix
    from quarry.genes.dispatch import side_statistics

    started = time.perf_counter()
    matrix = open_matrix(cluster, dataset)
    grouping = grouping_from_column(matrix, groupby)
    ranked, against = comparisons(grouping, groups, reference)
    every = [[g] for g in range(grouping.group_count)]
    statistics, report = side_statistics(matrix, grouping, every, pushdown)
    host_started = time.perf_counter()
    arrays = GroupArrays.of(statistics, grouping.group_count)
    frames = []
    for group_id in ranked:
        others = against[group_id]
        side_a, side_b = Side(matrix, grouping, [group_id]), Side(matrix, grouping, others)
        stats_a = named(arrays.union([group_id], 0), matrix)
        stats_b = named(arrays.union(others, 1), matrix)
        frame = rank_frame(side_a, side_b, stats_a, stats_b, method)
        frame.insert(0, "group", grouping.labels[group_id])
        frames.append(frame)
    result = pd.concat(frames, ignore_index=True)
    result["group"] = pd.Categorical(
        result["group"], categories=[grouping.labels[g] for g in ranked]
    )
    tstat_s = time.perf_counter() - host_started
    result.attrs["quarry"] = quarry_attrs(
        [report], pushdown, tstat_s, time.perf_counter() - started
    )
    result.attrs["metadata"] = dict(matrix.metadata)
    result.attrs["dataset"] = matrix.dataset
    result.attrs["version"] = matrix.version
    result.attrs["groupby"] = groupby
    result.attrs["reference"] = reference
    result.attrs["method"] = method
    return result


def comparisons(
    grouping: Grouping, groups: str | Sequence[str], reference: str
) -> tuple[list[int], dict[int, list[int]]]:
    """The group ids to rank, and for each the group ids of its reference, checked: every
    side needs two cells for a t-test."""
    named = [g for g, label in enumerate(grouping.labels) if label is not None]
    if isinstance(groups, str) and groups == ALL:
        ranked = named
    elif isinstance(groups, str):
        raise GenesInputError(f"groups is 'all' or a list of labels, not {groups!r}")
    else:
        ranked = [grouping.id_of(label) for label in groups]
    counts = grouping.cell_counts()
    if reference == REST:
        against = {g: [h for h in range(grouping.group_count) if h != g] for g in ranked}
    else:
        reference_id = grouping.id_of(reference)
        ranked = [g for g in ranked if g != reference_id]
        against = {g: [reference_id] for g in ranked}
    if not ranked:
        raise GenesInputError(f"dataset {grouping.dataset!r}: no group left to rank")
    for g in ranked:
        label = grouping.labels[g]
        for ids, name in (([g], f"group {label!r}"), (against[g], f"the reference of {label!r}")):
            cells = int(counts[ids].sum())
            if cells < 2:
                raise GenesInputError(
                    f"dataset {grouping.dataset!r}: {name} ({grouping.source}) has {cells} "
                    "cell(s); a t-test needs at least 2 on each side"
                )
    return ranked, against
