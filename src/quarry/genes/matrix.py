"""The neutral in-memory expression matrix every reader produces and every writer consumes.

Orientation is fixed: genes are rows and cells are columns (Skytether §5.1), whatever the source
format used. Readers transpose on the way in so that nothing downstream has to ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from scipy import sparse

from quarry.genes.errors import GenesInputError

# Only float matrices are stored: integer counts are converted once, at ingest, so that the
# statistics never see two code paths. float32 is what AnnData and 10x tools hand over.
VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

GENE_COLUMN = "gene"
CELL_COLUMN = "cell"

Values = sparse.csr_matrix | np.ndarray


@dataclass(frozen=True)
class ExpressionMatrix:
    """A genes x cells expression matrix with the metadata that describes its rows and columns.

    values:   genes x cells, scipy.sparse CSR or a dense numpy array, float32 or float64.
    genes:    one row per gene; column `gene` holds unique gene names.
    cells:    one row per cell; column `cell` holds unique cell ids, other columns are labels
              such as clusters.
    metadata: custom dataset metadata, propagated to results.
    dataset:  the name used in error messages (a dataset name or the source file).
    """

    values: Values
    genes: pa.Table
    cells: pa.Table
    metadata: dict[str, Any] = field(default_factory=dict)
    dataset: str = "matrix"

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _checked_values(self.values, self.dataset))
        _check_axis_table(self.genes, GENE_COLUMN, "genes", self.values.shape[0], self.dataset)
        _check_axis_table(self.cells, CELL_COLUMN, "cells", self.values.shape[1], self.dataset)
        _check_finite(self)

    @property
    def gene_count(self) -> int:
        return int(self.values.shape[0])

    @property
    def cell_count(self) -> int:
        return int(self.values.shape[1])

    @property
    def gene_names(self) -> np.ndarray:
        return self.genes.column(GENE_COLUMN).to_numpy(zero_copy_only=False)

    @property
    def cell_ids(self) -> np.ndarray:
        return self.cells.column(CELL_COLUMN).to_numpy(zero_copy_only=False)

    @property
    def nonzero_count(self) -> int:
        if sparse.issparse(self.values):
            return int(self.values.count_nonzero())
        return int(np.count_nonzero(self.values))

    @property
    def density(self) -> float:
        cells_total = self.gene_count * self.cell_count
        return self.nonzero_count / cells_total if cells_total else 0.0


def _checked_values(values: Any, dataset: str) -> Values:
    if sparse.issparse(values):
        values = sparse.csr_matrix(values)
        dtype = values.dtype
    else:
        values = np.asarray(values)
        dtype = values.dtype
        if values.ndim != 2:
            raise GenesInputError(
                f"dataset {dataset!r}: the expression matrix must be 2-dimensional "
                f"(genes x cells), got shape {values.shape}"
            )
    if dtype.kind in "iub":
        # Counts are exact in float32 up to 2**24 per cell, far above any real UMI count.
        values = values.astype(np.float32)
    elif dtype not in VALUE_DTYPES:
        raise GenesInputError(
            f"dataset {dataset!r}: expression values must be numeric, got dtype {dtype}; "
            "convert the matrix to float32 or float64"
        )
    return values


def _check_axis_table(table: pa.Table, column: str, axis: str, expected: int, dataset: str) -> None:
    if not isinstance(table, pa.Table):
        raise GenesInputError(f"dataset {dataset!r}: {axis} metadata must be a pyarrow.Table")
    if column not in table.column_names:
        raise GenesInputError(
            f"dataset {dataset!r}: {axis} metadata has no {column!r} column "
            f"(columns: {table.column_names})"
        )
    if table.num_rows != expected:
        raise GenesInputError(
            f"dataset {dataset!r}: the matrix has {expected} {axis} but the {axis} metadata "
            f"has {table.num_rows} rows; they must describe the same {axis} in the same order"
        )
    ids = table.column(column)
    if ids.null_count:
        raise GenesInputError(
            f"dataset {dataset!r}: {axis} metadata column {column!r} has {ids.null_count} "
            "missing ids"
        )
    unique_count = len(ids.unique())
    if unique_count != expected:
        duplicates = expected - unique_count
        raise GenesInputError(
            f"dataset {dataset!r}: {axis} metadata column {column!r} has {duplicates} duplicate "
            f"ids; {axis} are looked up by id, so each must be unique"
        )


def _check_finite(matrix: ExpressionMatrix) -> None:
    values = matrix.values
    data = values.data if sparse.issparse(values) else values
    bad = ~np.isfinite(data)
    bad_count = int(np.count_nonzero(bad))
    if bad_count == 0:
        return
    if sparse.issparse(values):
        position = int(np.flatnonzero(bad)[0])
        gene_index = int(np.searchsorted(values.indptr, position, side="right") - 1)
        cell_index = int(values.indices[position])
    else:
        gene_index, cell_index = (int(i) for i in np.argwhere(bad)[0])
    kind = "NaN" if np.isnan(data).any() else "infinite"
    raise GenesInputError(
        f"dataset {matrix.dataset!r}: the expression matrix has {bad_count} {kind} "
        f"(non-finite) values, first at gene {matrix.gene_names[gene_index]!r}, cell "
        f"{matrix.cell_ids[cell_index]!r}; replace missing values with 0 or drop those cells"
    )
