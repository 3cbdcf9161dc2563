"""quarry's ranking in scanpy's layout: ``adata.uns["rank_genes_groups"]``, and back.

scanpy keeps a ranking as record arrays with one field per group (``names``, ``scores``,
``pvals``, ``pvals_adj``, ``logfoldchanges``, each group's genes best first), its parameters,
and, with ``pts``, data frames of the fraction of cells expressing each gene (``pts``, and
``pts_rest`` against the rest). Written so, ``sc.get.rank_genes_groups_df`` and
``sc.pl.rank_genes_groups`` read a quarry ranking as their own, and a notebook's next cell does
not change. ``filter_ranked`` is ``sc.tl.filter_rank_genes_groups`` over the long frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

DTYPES = {
    "names": "O",
    "scores": "float32",
    "logfoldchanges": "float32",
    "pvals": "float64",
    "pvals_adj": "float64",
}


def write_uns(adata: Any, frame: pd.DataFrame, key: str = "rank_genes_groups") -> None:
    """Write ``frame`` (``rank_genes_groups``' result) into ``adata.uns[key]`` as scanpy
    does; ``adata`` must hold the dataset's genes (``to_anndata`` makes one that does)."""
    groups = [str(g) for g in frame["group"].cat.categories]
    by_group = {str(g): part for g, part in frame.groupby("group", observed=True)}
    entry: dict[str, Any] = {"params": dict(frame.attrs.get("params", {}))}
    for column, dtype in DTYPES.items():
        arrays = [by_group[g][column].to_numpy().astype(dtype) for g in groups]
        entry[column] = np.rec.fromarrays(arrays, names=groups)
    genes = pd.Index(adata.var_names)
    for column, name in (("pct_nz_group", "pts"), ("pct_nz_reference", "pts_rest")):
        if column in frame.columns:
            entry[name] = pd.DataFrame(
                {g: by_group[g].set_index("names")[column].reindex(genes) for g in groups},
                index=genes,
            )
    adata.uns[key] = entry


def to_anndata(frame: pd.DataFrame, genes: Any, key: str = "rank_genes_groups") -> Any:
    """An AnnData of the dataset's genes (no cells: the matrix stays on the cluster) holding
    the ranking in ``uns[key]``; ``genes`` are the names in the dataset's order."""
    import anndata

    adata = anndata.AnnData(var=pd.DataFrame(index=pd.Index(np.asarray(genes, dtype=str))))
    write_uns(adata, frame, key)
    return adata


def filter_ranked(
    frame: pd.DataFrame,
    min_in_group_fraction: float = 0.25,
    max_out_group_fraction: float = 0.5,
    min_fold_change: float = 1.0,
    compare_abs: bool = False,
) -> pd.DataFrame:
    """The genes scanpy's ``filter_rank_genes_groups`` keeps: expressed in more than
    ``min_in_group_fraction`` of the group, less than ``max_out_group_fraction`` of the rest,
    and a log2 fold change above ``min_fold_change`` (its absolute value with ``compare_abs``),
    as scanpy compares them.
    Needs ``pts`` (the fractions); scanpy blanks the others' names, this drops their rows."""
    if "pct_nz_group" not in frame.columns or "pct_nz_reference" not in frame.columns:
        raise ValueError("filter_ranked needs the fractions of cells: rank with pts=True, "
                         "against the rest")  # fmt: skip
    # scanpy compares the log2 fold change with min_fold_change, all bounds strict
    fold = frame["logfoldchanges"].to_numpy()
    if compare_abs:
        fold = np.abs(fold)
    kept = (
        (frame["pct_nz_group"].to_numpy() > min_in_group_fraction)
        & (frame["pct_nz_reference"].to_numpy() < max_out_group_fraction)
        & (fold > min_fold_change)
    )
    return frame[kept].reset_index(drop=True)
