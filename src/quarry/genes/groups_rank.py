"""Rank every group of a column at once: scanpy's ``rank_genes_groups``, in one pass.

``rank_genes`` compares one group with a reference. A user clustering cells asks for all of
them: which genes mark each cluster against the rest, ranked as scanpy ranks them. Here one
request asks the devices for every group's statistics at once (one side per group: the
devices read each slice once and ship genes x groups rows, never a value):

- the moments (``Accumulate``: n, mean, m2) for the t-tests and every method's fold changes
  (Wilcoxon against the rest of one matrix takes its means from the rank pass instead, which
  sums each group's values in Accumulate's order: one request, the same bits);
- for ``wilcoxon`` and ``pts``, the rank sums and the cells expressing each gene
  (``RankSums``: a slice holds whole genes across cells, so each gene's ranks are local to
  the device that holds it). Against the rest every group shares one ranking (all cells);
  against one label each group is ranked with the reference's cells only, as scanpy does, one
  request per group.

The host forms each group's reference from the others (``stats.GroupArrays``) and computes
scanpy's statistics per group (``scores``: ``scipy.stats.ttest_ind_from_stats`` for the
t-tests, the normal approximation of the rank sums for Wilcoxon; NaN scores become 0 and NaN
p-values 1, as scanpy reports them). ``scanpy_layout`` writes the result into an AnnData's
``uns`` so ``sc.get.rank_genes_groups_df`` and ``sc.pl.rank_genes_groups`` read it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import scipy.stats

from quarry.genes.device import RankSums
from quarry.genes.errors import GenesInputError, StaleDataset
from quarry.genes.groups import Grouping, grouping_from_column
from quarry.genes.rank import REST, STALE_RETRIES, quarry_attrs
from quarry.genes.ranks import wilcoxon
from quarry.genes.stats import GroupArrays, benjamini_hochberg, log2_fold_change
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.genes.dispatch import Report

ALL = "all"
# scanpy's names, and quarry's own for the two t-tests of ``rank_genes``
METHODS = ("t-test", "t-test_overestim_var", "wilcoxon", "welch", "student")
CORRECTIONS = ("benjamini-hochberg", "bonferroni")
COLUMNS = ["group", "names", "scores", "pvals", "pvals_adj", "logfoldchanges"]
# Groups tested at once on the host: their p-values and sorts run outside the GIL.
HOST_THREADS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class Request:
    """What was asked, checked."""

    groupby: str
    reference: str
    method: str
    tie_correct: bool
    pts: bool
    corr_method: str


@dataclass
class Ranks:
    """Rank sums per gene and group of one ranking, its tie terms, and cells expressing."""

    rank_sum: np.ndarray  # genes x groups
    expressed: np.ndarray  # genes x groups
    ties: np.ndarray  # genes
    ranked_cells: int
    genes: np.ndarray | None = None  # gene row numbers of the arrays' rows
    sums: np.ndarray | None = None  # genes x groups: each group's values summed


def rank_genes_groups(
    cluster: Cluster,
    dataset: str,
    groupby: str,
    groups: str | Sequence[str] = ALL,
    reference: str = REST,
    method: str = "t-test",
    *,
    tie_correct: bool = False,
    pts: bool = False,
    corr_method: str = "benjamini-hochberg",
    pushdown: Pushdown | str = Pushdown.AUTO,
    adata: Any = None,
    key_added: str = "rank_genes_groups",
) -> pd.DataFrame:
    """Rank the genes of each group of ``groupby`` against ``reference``: "rest" (every other
    cell of the dataset, labelled or not) or one label (then that group is not ranked).

    method: ``t-test`` (Welch), ``t-test_overestim_var`` (the rest's variance over the group's
    size, scanpy's), ``wilcoxon`` (``tie_correct`` as scanpy's), or ``student``. ``pts`` adds
    the fraction of cells expressing each gene in the group and in the rest
    (``pct_nz_group``, ``pct_nz_reference``). ``corr_method``: ``benjamini-hochberg`` or
    ``bonferroni``, within each group.

    Returns scanpy's ``rank_genes_groups_df`` layout for all groups: ``group``, ``names``,
    ``scores``, ``pvals``, ``pvals_adj``, ``logfoldchanges``; groups in the column's order, each
    best score first. Given ``adata`` (an AnnData of the same genes), also writes scanpy's
    layout into ``adata.uns[key_added]``; ``scanpy_layout.to_anndata`` makes one.
    ``attrs["quarry"]`` says what ran where and what moved.
    """
    from quarry.genes.dispatch import GENES_MODES

    pushdown = Pushdown.parse(pushdown, GENES_MODES)
    if method not in METHODS:
        raise GenesInputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    if corr_method not in CORRECTIONS:
        raise GenesInputError(f"corr_method is one of {CORRECTIONS}, not {corr_method!r}")
    request = Request(groupby, reference, method, tie_correct, pts, corr_method)
    for attempt in range(STALE_RETRIES + 1):
        cluster.refresh()  # another process may have re-ingested: versions must be current
        try:
            frame = _on_cluster(cluster, dataset, groups, request, pushdown)
            break
        except StaleDataset:
            if attempt == STALE_RETRIES:
                raise
    if adata is not None:
        from quarry.genes.scanpy_layout import write_uns

        write_uns(adata, frame, key_added)
    return frame


def _on_cluster(
    cluster: Cluster,
    dataset: str,
    groups: str | Sequence[str],
    request: Request,
    pushdown: Pushdown,
) -> pd.DataFrame:
    from quarry.genes.collections import members_of
    from quarry.genes.moments import moments

    started = time.perf_counter()
    members, _ = members_of(cluster, dataset)
    matrix = members[0]
    if len(members) > 1:
        comparisons(_collection_grouping(members, request.groupby), groups, request.reference)
    else:
        comparisons(grouping_from_column(matrix, request.groupby), groups, request.reference)
    if len(members) == 1 and request.method == "wilcoxon" and request.reference == REST:
        # One request: the rank sums' pass also sums each group's values, as Accumulate does,
        # which gives the fold changes' means to the bit; Wilcoxon needs no other moment.
        grouping = grouping_from_column(matrix, request.groupby)
        ranked, against = comparisons(grouping, groups, request.reference)
        reports: list[Report] = []
        ranks = _ranks(members, grouping, ranked, request, pushdown, reports)
        assert ranks.shared is not None
        arrays = _means_of(ranks.shared, grouping)
    else:
        found = moments(members, request.groupby, pushdown)
        grouping, arrays, reports = found.grouping, found.arrays, list(found.reports)
        ranked, against = comparisons(grouping, groups, request.reference)
        ranks = _ranks(members, grouping, ranked, request, pushdown, reports)
    host_started = time.perf_counter()
    log1p_base = matrix.metadata.get("log1p_base")
    with ThreadPoolExecutor(max_workers=HOST_THREADS) as pool:
        frames = list(
            pool.map(
                lambda g: _group_frame(arrays, ranks, grouping, g, against[g], request, log1p_base),
                ranked,
            )
        )
    result = pd.concat(frames, ignore_index=True)
    result.insert(1, "names", np.asarray(matrix.gene_names)[result.pop("gene").to_numpy()])
    result["group"] = pd.Categorical(
        result["group"], categories=[grouping.labels[g] for g in ranked]
    )
    tstat_s = time.perf_counter() - host_started
    result.attrs["quarry"] = quarry_attrs(reports, pushdown, tstat_s, time.perf_counter() - started)
    result.attrs["metadata"] = dict(matrix.metadata)
    result.attrs["dataset"] = matrix.dataset if len(members) == 1 else dataset
    result.attrs["version"] = matrix.version
    result.attrs["params"] = {
        "groupby": request.groupby,
        "reference": request.reference,
        "method": request.method,
        "use_raw": False,
        "layer": None,
        "corr_method": request.corr_method,
    }
    return result


def _collection_grouping(members: list[Any], groupby: str) -> Grouping:
    """The labels of ``groupby`` over every member (checked before any device works)."""
    labels: list[str] = []
    counts: list[int] = []
    for matrix in members:
        grouping = grouping_from_column(matrix, groupby)
        for label, count in zip(grouping.labels, grouping.cell_counts(), strict=True):
            if label is None:
                continue
            if label not in labels:
                labels.append(label)
                counts.append(0)
            counts[labels.index(label)] += int(count)
    codes = np.repeat(np.arange(len(labels), dtype=np.int32), counts)
    return Grouping(codes, tuple(labels), members[0].dataset, f"column {groupby!r}")


@dataclass
class AllRanks:
    """The rankings a request needs: of all cells (``shared``: every group against the rest,
    and the cells expressing each gene for ``pts``), and per group of its cells and the
    reference's (``pairs``: Wilcoxon against a label)."""

    shared: Ranks | None = None
    pairs: dict[int, Ranks] | None = None

    def of(self, group: int) -> tuple[Ranks, int]:
        """The ranking a group's Wilcoxon test reads, and the group's column in it."""
        if self.pairs is not None:
            return self.pairs[group], 0
        assert self.shared is not None
        return self.shared, group


def _ranks(
    members: list[Any],
    grouping: Grouping,
    ranked: list[int],
    request: Request,
    pushdown: Pushdown,
    reports: list[Report],
) -> AllRanks:
    """Rank sums where the method or ``pts`` needs them: one ranking of all cells, shared by
    every group against the rest (and by ``pts``); against a label, one of the pair's cells per
    group, as scanpy ranks them."""
    wilcoxon_wanted = request.method == "wilcoxon"
    against_label = request.reference != REST
    ranks = AllRanks()
    if not (wilcoxon_wanted or request.pts):
        return ranks
    for matrix in members:
        if matrix.orientation != "genes" and len(members) == 1:
            raise GenesInputError(
                f"dataset {matrix.dataset!r} is stored by cells: ranks and pts need each gene "
                "whole in one slice; store it by genes (the default)"
            )
    if request.pts or not against_label:
        statistics = _rank_statistics(members, grouping, pushdown, reports)
        ranks.shared = _rank_arrays(statistics, grouping.group_count, len(grouping.group_of_cell))
    if wilcoxon_wanted and against_label:
        reference_id = grouping.id_of(request.reference)
        ranks.pairs = {}
        for g in ranked:
            pair = _pair(grouping, g, reference_id)
            statistics = _rank_statistics(members, pair, pushdown, reports)
            ranks.pairs[g] = _rank_arrays(statistics, 2, int(pair.cell_counts().sum()))
    return ranks


def _rank_statistics(
    members: list[Any], grouping: Grouping, pushdown: Pushdown, reports: list[Report]
) -> Any:
    """Rank sums per (gene, group) of one ranking of the grouping's cells: on the devices of a
    matrix (``RankSums``), or from every member's value counts for a collection."""
    from quarry.genes.dispatch import side_statistics
    from quarry.genes.value_counts import collection_ranks

    if len(members) == 1:
        every = [[g] for g in range(grouping.group_count)]
        statistics, report = side_statistics(members[0], grouping, every, pushdown, unit=RankSums)
        reports.append(report)
        return statistics
    statistics, more = collection_ranks(members, grouping, pushdown)
    reports.extend(more)
    return statistics


def _pair(grouping: Grouping, group: int, reference: int) -> Grouping:
    """A grouping of the group's cells (0) and the reference's (1); every other cell is left
    out of the ranking."""
    codes = grouping.group_of_cell
    pair = np.where(codes == group, 0, np.where(codes == reference, 1, -1)).astype(np.int32)
    labels = (grouping.labels[group], grouping.labels[reference])
    return Grouping(pair, labels, grouping.dataset, grouping.source)


def _rank_arrays(statistics: Any, group_count: int, ranked_cells: int) -> Ranks:
    table = statistics.to_pandas()
    genes = np.unique(table["gene"].to_numpy())
    row = np.searchsorted(genes, table["gene"].to_numpy())
    group = table["group"].to_numpy()
    rank_sum = np.zeros((len(genes), group_count))
    expressed = np.zeros((len(genes), group_count), dtype=np.int64)
    ties = np.zeros(len(genes))
    rank_sum[row, group] = table["rank_sum"].to_numpy()
    expressed[row, group] = table["expressed"].to_numpy()
    ties[row] = table["ties"].to_numpy()
    sums = np.zeros((len(genes), group_count))
    sums[row, group] = table["sum"].to_numpy()
    return Ranks(rank_sum, expressed, ties, ranked_cells, genes, sums)


def _means_of(ranks: Ranks, grouping: Grouping) -> GroupArrays:
    """The groups' sizes and means from a ranking's sums (``sum / cells``, Accumulate's own
    division); no m2: only the t-tests read it."""
    assert ranks.genes is not None and ranks.sums is not None
    cells = grouping.cell_counts()
    n = np.broadcast_to(cells.astype(np.int64), ranks.sums.shape).copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n > 0, ranks.sums / cells.astype(np.float64), 0.0)
    return GroupArrays(ranks.genes, n, mean, np.zeros_like(mean))


def _group_frame(
    arrays: GroupArrays,
    ranks: AllRanks,
    grouping: Grouping,
    group: int,
    others: list[int],
    request: Request,
    log1p_base: float | None,
) -> pd.DataFrame:
    """One group's rows: scores, p-values (raw and adjusted), fold changes, and ``pts``."""
    n, mean, m2 = arrays.n[:, group], arrays.mean[:, group], arrays.m2[:, group]
    rest = arrays.union(others, 1)
    n_rest = rest.column("n").to_numpy()
    mean_rest, m2_rest = rest.column("mean").to_numpy(), rest.column("m2").to_numpy()
    if request.method == "wilcoxon":
        rank, column = ranks.of(group)
        scores, pvals = wilcoxon(
            rank.rank_sum[:, column], int(n[0]), rank.ranked_cells, rank.ties,
            request.tie_correct,
        )  # fmt: skip
    else:
        scores, pvals = _t_test(request.method, n, mean, m2, n_rest, mean_rest, m2_rest)
    frame = pd.DataFrame(
        {
            "group": grouping.labels[group],
            "gene": arrays.genes,
            "scores": scores,
            "pvals": pvals,
            "pvals_adj": _adjusted(pvals, request.corr_method),
            "logfoldchanges": log2_fold_change(mean, mean_rest, log1p_base=log1p_base),
        }
    )
    if request.pts:
        assert ranks.shared is not None
        expressed = ranks.shared.expressed
        frame["pct_nz_group"] = expressed[:, group] / max(int(n[0]), 1)
        if request.reference == REST:  # scanpy's pts_rest: only against the rest
            cells_rest = max(int(n_rest[0]), 1)
            frame["pct_nz_reference"] = expressed[:, others].sum(axis=1) / cells_rest
    order = np.argsort(-np.nan_to_num(frame["scores"].to_numpy(), nan=-np.inf), kind="stable")
    return frame.iloc[order].reset_index(drop=True)


def _t_test(
    method: str,
    n: np.ndarray,
    mean: np.ndarray,
    m2: np.ndarray,
    n_rest: np.ndarray,
    mean_rest: np.ndarray,
    m2_rest: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """scanpy's t-tests from the moments (``ttest_ind_from_stats``, as scanpy calls it)."""
    var = m2 / np.maximum(n - 1, 1)
    var_rest = m2_rest / np.maximum(n_rest - 1, 1)
    # scanpy's overestimate: the rest's variance over the group's size
    nobs_rest = n if method == "t-test_overestim_var" else n_rest
    with np.errstate(invalid="ignore", divide="ignore"):
        scores, pvals = scipy.stats.ttest_ind_from_stats(
            mean, np.sqrt(var), n, mean_rest, np.sqrt(var_rest), nobs_rest,
            equal_var=method == "student",
        )  # fmt: skip
    scores, pvals = np.asarray(scores, dtype=np.float64), np.asarray(pvals, dtype=np.float64)
    scores[np.isnan(scores)] = 0.0
    pvals[np.isnan(pvals)] = 1.0
    return scores, pvals


def _adjusted(pvals: np.ndarray, corr_method: str) -> np.ndarray:
    if corr_method == "bonferroni":
        return np.minimum(pvals * len(pvals), 1.0)
    return benjamini_hochberg(pvals)


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
