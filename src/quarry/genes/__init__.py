"""Single-cell gene expression on quarry (MSG Express): matrices, layout, differential expression.

On a cluster: `ingest` stores a matrix with its cell and gene metadata, `rank_genes` ranks genes
by a t-test with Accumulate and Combine on the devices (program `genes.accumulate`) and TStat on
the host, `drop` removes it all. In memory: readers produce an `ExpressionMatrix`;
`layout.encode_slices` cuts it into slices; `stats.accumulate` -> `stats.combine` ->
`stats.tstat` rank genes, and `rank_genes_local` runs that whole decomposition in one process.
"""

from __future__ import annotations

import importlib
from typing import Any

# Names -> defining module, imported on first use: a device imports this package to run
# `genes.accumulate` and must not pay for pandas, anndata or the coordinator it never uses.
_EXPORTS = {
    "StoredMatrix": "datasets",
    "drop": "datasets",
    "ingest": "datasets",
    "ingest_file": "datasets",
    "open_matrix": "datasets",
    "GenesInputError": "errors",
    "Grouping": "groups",
    "grouping_from_cells": "groups",
    "grouping_from_column": "groups",
    "DecodedSlice": "layout",
    "decode_slice": "layout",
    "encode_slices": "layout",
    "ExpressionMatrix": "matrix",
    "GeneBlocks": "matrix",
    "CellBlocks": "matrix",
    "rank_genes": "rank",
    "query": "query",
    "CellQuery": "query",
    "collect": "collections",
    "mean_var": "moments",
    "highly_variable_genes": "moments",
    "rank_genes_groups": "groups_rank",
    "to_anndata": "scanpy_layout",
    "pseudobulk": "pseudobulk",
    "filter_ranked": "scanpy_layout",
    "rank_genes_local": "rank",
    "read": "readers",
    "read_h5ad": "readers",
    "read_h5ad_blocks": "h5ad_blocks",
    "read_mtx": "readers",
    "read_tsv": "readers",
    "with_cell_metadata": "readers",
    "accumulate": "stats",
    "combine": "stats",
    "rest": "stats",
    "select_groups": "stats",
    "tstat": "stats",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'quarry.genes' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"quarry.genes.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "CellBlocks",
    "CellQuery",
    "collect",
    "highly_variable_genes",
    "mean_var",
    "query",
    "DecodedSlice",
    "ExpressionMatrix",
    "GeneBlocks",
    "GenesInputError",
    "Grouping",
    "StoredMatrix",
    "accumulate",
    "combine",
    "decode_slice",
    "drop",
    "encode_slices",
    "grouping_from_cells",
    "grouping_from_column",
    "ingest",
    "ingest_file",
    "open_matrix",
    "rank_genes",
    "rank_genes_groups",
    "rank_genes_local",
    "filter_ranked",
    "pseudobulk",
    "to_anndata",
    "read",
    "read_h5ad",
    "read_h5ad_blocks",
    "read_mtx",
    "read_tsv",
    "rest",
    "select_groups",
    "tstat",
    "with_cell_metadata",
]
