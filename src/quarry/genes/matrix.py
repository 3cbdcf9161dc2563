"""The neutral in-memory expression matrix every reader produces and every writer consumes.

Orientation is fixed: genes are rows and cells are columns (Skytether §5.1), whatever the source
format used. Readers transpose on the way in so that nothing downstream has to ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

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


class _Axes:
    """Gene names and cell ids, from the axis tables a matrix (whole or in blocks) holds."""

    genes: pa.Table
    cells: pa.Table

    @property
    def gene_names(self) -> np.ndarray:
        return self.genes.column(GENE_COLUMN).to_numpy(zero_copy_only=False)

    @property
    def cell_ids(self) -> np.ndarray:
        return self.cells.column(CELL_COLUMN).to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class ExpressionMatrix(_Axes):
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
    def nonzero_count(self) -> int:
        if sparse.issparse(self.values):
            return int(self.values.count_nonzero())
        return int(np.count_nonzero(self.values))

    @property
    def density(self) -> float:
        cells_total = self.gene_count * self.cell_count
        return self.nonzero_count / cells_total if cells_total else 0.0


@dataclass(frozen=True)
class GeneBlocks(_Axes):
    """A genes x cells matrix that arrives in blocks of consecutive genes: one too large to hold.

    `quarry.genes.ingest` stores it one block at a time, so the host holds one block (and one
    batch of it encoded), never the matrix. A file read in row blocks (`read_h5ad_blocks`) or
    a generator gives it.

    blocks:   an iterable of genes x cells blocks, in the order of `genes`, each holding every
              cell of its genes: scipy.sparse (any format) or dense numpy, float32/float64 (all
              blocks the same) or integer counts (stored as float32). Read once.
    genes:    one row per gene of the whole matrix; column `gene` holds unique gene names.
    cells:    one row per cell; column `cell` holds unique cell ids, other columns are labels.
    metadata: custom dataset metadata, propagated to results.
    dataset:  the name used in error messages.
    nonzero:  the matrix's non-zero count if known before reading (the stored description is
              written before the first block, so it is otherwise unknown); checked at the end.
    """

    blocks: Iterable[Any]
    genes: pa.Table
    cells: pa.Table
    metadata: dict[str, Any] = field(default_factory=dict)
    dataset: str = "matrix"
    nonzero: int | None = None

    def __post_init__(self) -> None:
        for table, column, axis in (
            (self.genes, GENE_COLUMN, "genes"),
            (self.cells, CELL_COLUMN, "cells"),
        ):
            rows = table.num_rows if isinstance(table, pa.Table) else 0
            _check_axis_table(table, column, axis, rows, self.dataset)
        if self.nonzero is not None:
            object.__setattr__(self, "nonzero", int(self.nonzero))  # numpy's ints are not JSON

    @property
    def gene_count(self) -> int:
        return int(self.genes.num_rows)

    @property
    def cell_count(self) -> int:
        return int(self.cells.num_rows)

    # what a block's rows are: genes here, cells in ``CellBlocks``
    ROWS: ClassVar[str] = "genes"
    COLUMNS: ClassVar[str] = "cells"

    @property
    def row_count(self) -> int:
        return self.gene_count

    @property
    def column_count(self) -> int:
        return self.cell_count

    def row_name(self, row: int) -> str:
        return str(self.gene_names[row])

    def column_name(self, column: int) -> str:
        return str(self.cell_ids[column])


class CellBlocks(GeneBlocks):
    """The same matrix arriving in blocks of consecutive cells (cells x genes, every gene of its
    cells), stored by cells (``ingest(..., orientation="cells")``): what a reader of a cells x
    genes file or a generator of cells gives, one block in memory at a time."""

    ROWS: ClassVar[str] = "cells"
    COLUMNS: ClassVar[str] = "genes"

    @property
    def row_count(self) -> int:
        return self.cell_count

    @property
    def column_count(self) -> int:
        return self.gene_count

    def row_name(self, row: int) -> str:
        return str(self.cell_ids[row])

    def column_name(self, column: int) -> str:
        return str(self.gene_names[column])


class CheckedBlocks:
    """The blocks of a `GeneBlocks`, each checked as it is read: what `ExpressionMatrix` checks
    of a whole matrix, per block, with errors that name the block and its genes.

    The first block is read at once (its value type fixes the stored schema), so a matrix
    whose first block is wrong fails before anything is stored. After the last block the
    gene count (and `nonzero`, if given) is checked; `nonzero` then holds the count seen.
    """

    def __init__(self, source: GeneBlocks):
        self.source = source
        self.genes_read = 0
        self.nonzero = 0
        self._blocks = iter(source.blocks)
        self._index = 0
        first = next(self._blocks, None)
        if first is None and source.row_count:
            raise GenesInputError(
                f"dataset {source.dataset!r}: no blocks to read (the blocks of a GeneBlocks "
                "are read once; give a new iterable to store the matrix again)"
            )
        self.dtype = np.dtype(np.float32)
        self._first: Values | None = None
        if first is not None:
            values = _block_values(first, source.dataset, 0)
            self.dtype = self.dtype if values.dtype.kind in "iub" else values.dtype
            self._first = self._checked(values)

    def __iter__(self) -> Iterator[Values]:
        # No name here holds a block past its turn: the next block is read with only the
        # consumer's reference to this one, so one block at a time is in memory.
        if self._first is not None:
            yield self._take_first()
        for block in self._blocks:
            values = _block_values(block, self.source.dataset, self._index)
            del block
            values = self._checked(values)
            yield values
            del values
        self._check_end()

    def _take_first(self) -> Values:
        first, self._first = self._first, None
        assert first is not None
        return first

    def _checked(self, values: Values) -> Values:
        source = self.source
        rows, columns = values.shape
        last = self.genes_read + rows - 1
        where = (
            f"dataset {source.dataset!r}: block {self._index} "
            f"({source.ROWS} {self.genes_read} to {last})"
        )
        if columns != source.column_count:
            raise GenesInputError(
                f"{where} has {columns} columns but the matrix has {source.column_count} "
                f"{source.COLUMNS}; each block holds every {source.COLUMNS[:-1]} of its "
                f"{source.ROWS}"
            )
        if self.genes_read + rows > source.row_count:
            raise GenesInputError(
                f"{where} goes past the last {source.ROWS[:-1]}: {source.ROWS} lists "
                f"{source.row_count}"
            )
        values = _block_dtype(values, self.dtype, where)
        found = _first_non_finite(values)
        if found is not None:
            gene, cell = self.genes_read + found.row, found.column
            if source.ROWS == "cells":
                gene, cell = cell, gene
            raise GenesInputError(
                f"{where} has {found.count} {found.kind} (non-finite) values, first at gene "
                f"{source.gene_names[gene]!r}, cell {source.cell_ids[cell]!r}; replace "
                "missing values with 0 or drop those cells"
            )
        data = values.data if sparse.issparse(values) else values
        self.nonzero += int(np.count_nonzero(data))
        self.genes_read += rows  # rows of the blocks: genes, or cells for CellBlocks
        self._index += 1
        return values

    def _check_end(self) -> None:
        source = self.source
        if self.genes_read != source.row_count:
            raise GenesInputError(
                f"dataset {source.dataset!r}: the {self._index} blocks hold "
                f"{self.genes_read} {source.ROWS} but {source.ROWS} lists {source.row_count}"
            )
        if source.nonzero is not None and source.nonzero != self.nonzero:
            raise GenesInputError(
                f"dataset {source.dataset!r}: the blocks hold {self.nonzero} non-zero values "
                f"but nonzero says {source.nonzero}"
            )


def _block_values(block: Any, dataset: str, index: int) -> Values:
    """One block as CSR (checked in full: scipy trusts its index arrays) or a 2-D array."""
    where = f"dataset {dataset!r}: block {index}"
    if sparse.issparse(block):
        values = sparse.csr_matrix(block)
        try:
            values.check_format(full_check=True)
        except (ValueError, TypeError, IndexError) as error:
            raise GenesInputError(f"{where} is a damaged sparse matrix ({error})") from None
        return values
    values = np.asarray(block)
    if values.ndim != 2:
        raise GenesInputError(
            f"{where} must be 2-dimensional (genes x cells), got shape {values.shape}"
        )
    return values


def _block_dtype(values: Values, dtype: np.dtype, where: str) -> Values:
    """Counts become the matrix's float type; a float block must already have it (a float64
    block among float32 ones would otherwise be rounded without a word)."""
    if values.dtype.kind in "iub":
        return values.astype(dtype)
    if values.dtype not in VALUE_DTYPES:
        raise GenesInputError(
            f"{where}: expression values must be numeric, got dtype {values.dtype}; "
            "convert the blocks to float32 or float64"
        )
    if values.dtype != dtype:
        raise GenesInputError(
            f"{where} holds {values.dtype} values but the first block {dtype}; give every "
            "block the same float type"
        )
    return values


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
    found = _first_non_finite(matrix.values)
    if found is None:
        return
    raise GenesInputError(
        f"dataset {matrix.dataset!r}: the expression matrix has {found.count} {found.kind} "
        f"(non-finite) values, first at gene {matrix.gene_names[found.row]!r}, cell "
        f"{matrix.cell_ids[found.column]!r}; replace missing values with 0 or drop those cells"
    )


class NonFinite(NamedTuple):
    """How many values are not finite, of which kind, and where the first one is."""

    count: int
    kind: str  # "NaN" or "infinite"
    row: int
    column: int


def _first_non_finite(values: Values) -> NonFinite | None:
    data = values.data if sparse.issparse(values) else values
    bad = ~np.isfinite(data)
    bad_count = int(np.count_nonzero(bad))
    if bad_count == 0:
        return None
    if sparse.issparse(values):
        position = int(np.flatnonzero(bad)[0])
        row = int(np.searchsorted(values.indptr, position, side="right") - 1)
        column = int(values.indices[position])
    else:
        row, column = (int(i) for i in np.argwhere(bad)[0])
    kind = "NaN" if np.isnan(data).any() else "infinite"
    return NonFinite(bad_count, kind, row, column)
