"""Pseudobulk: each gene's expression summed per (sample, group), on the devices.

Differential expression across conditions with replicates (PyDESeq2, edgeR) works on counts
summed over the cells of each sample and cell type, not on cells. The sums are Accumulate's
moments under a grouping of (sample, group) pairs: ``n x mean`` per gene and pair, so the
devices read each slice once and ship one row per (gene, pair), and a matrix of any size
becomes a table of samples x genes. The result is an AnnData ready for PyDESeq2: one
observation per pair with its sample, group and number of cells; sums of whole counts come
back as integers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from quarry.genes.errors import GenesInputError
from quarry.genes.groups import Grouping
from quarry.genes.matrix import CELL_COLUMN
from quarry.pushdown import Pushdown

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster

WHOLE_TOLERANCE = 1e-6  # sums this close to whole numbers are counts


def pseudobulk(
    cluster: Cluster,
    dataset: str,
    sample_key: str,
    groupby: str,
    *,
    min_cells: int = 1,
    pushdown: Pushdown | str = Pushdown.AUTO,
) -> Any:
    """Each gene summed over the cells of every (``sample_key``, ``groupby``) pair with at least
    ``min_cells`` cells: an AnnData of pairs x genes, ``obs`` holding ``sample``, ``group``
    and ``n_cells``. Cells without a sample or a group take no part."""
    import anndata

    from quarry.genes.collections import members_of
    from quarry.genes.dispatch import GENES_MODES
    from quarry.genes.moments import moments

    mode = Pushdown.parse(pushdown, GENES_MODES)
    cluster.refresh()
    members, _ = members_of(cluster, dataset)
    matrix = members[0]
    pair_of_label: dict[str, tuple[str, str]] = {}

    def grouping_of(member: Any) -> Grouping:
        grouping, pairs = pair_grouping(member, sample_key, groupby)
        for label, sample, group in zip(
            grouping.labels, pairs["sample"], pairs["group"], strict=True
        ):
            pair_of_label[str(label)] = (sample, group)
        return grouping

    found = moments(members, grouping_of, mode)
    grouping, arrays = found.grouping, found.arrays
    # pairs in (sample, group) order whichever member brought them first
    order = sorted(range(grouping.group_count), key=lambda g: pair_of_label[grouping.labels[g]])
    pairs = pd.DataFrame(
        [pair_of_label[grouping.labels[g]] for g in order], columns=["sample", "group"]
    )
    sums = (arrays.n * arrays.mean)[:, order].T  # pairs x genes
    cells = grouping.cell_counts()[order]
    kept = cells >= min_cells
    if np.all(np.abs(sums - np.rint(sums)) <= WHOLE_TOLERANCE * np.maximum(1, np.abs(sums))):
        sums = np.rint(sums).astype(np.int64)
    obs = pairs.assign(n_cells=cells)[kept]
    obs.index = [f"{s}_{g}" for s, g in zip(obs["sample"], obs["group"], strict=True)]
    names = np.asarray(matrix.gene_names)[arrays.genes]
    adata = anndata.AnnData(X=sums[kept], obs=obs, var=pd.DataFrame(index=names.astype(str)))
    adata.uns["quarry"] = {
        "dataset": dataset if len(members) > 1 else matrix.dataset,
        "version": matrix.version,
        "bytes_shipped": sum(r.bytes_shipped for r in found.reports),
        "bytes_read": sum(r.bytes_read for r in found.reports),
    }
    return adata


def pair_grouping(matrix: Any, sample_key: str, groupby: str) -> tuple[Grouping, pd.DataFrame]:
    """One group per (sample, group) pair that has cells, and the pairs' labels."""
    cells = matrix.cells
    for column in (sample_key, groupby):
        if column == CELL_COLUMN or column not in cells.column_names:
            usable = [name for name in cells.column_names if name != CELL_COLUMN]
            raise GenesInputError(
                f"dataset {matrix.dataset!r}: no cell metadata column {column!r} "
                f"(columns: {usable})"
            )
    samples = cells.column(sample_key).cast(pa.string())
    groups = cells.column(groupby).cast(pa.string())
    labelled = pc.and_(pc.is_valid(samples), pc.is_valid(groups)).to_numpy(zero_copy_only=False)
    frame = pd.DataFrame(
        {
            "sample": samples.to_numpy(zero_copy_only=False),
            "group": groups.to_numpy(zero_copy_only=False),
        }
    )
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(frame[labelled]), sort=True)
    group_of_cell = np.full(len(frame), -1, dtype=np.int32)
    group_of_cell[labelled] = codes
    pairs = pd.DataFrame(list(uniques), columns=["sample", "group"])
    labels = tuple(f"{s}|{g}" for s, g in zip(pairs["sample"], pairs["group"], strict=True))
    source = f"columns {sample_key!r} x {groupby!r}"
    return Grouping(group_of_cell, labels, matrix.dataset, source), pairs
