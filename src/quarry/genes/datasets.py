"""Expression matrices on a cluster: ingest, open, drop (MSG Express on Skytether, §4 and §5.1).

A matrix `domain/name` is stored as three datasets of the cluster:

    domain/name__genes   gene metadata, one row per gene: position, gene (name), var columns
    domain/name__cells   cell metadata, one row per cell: position, cell (id), obs columns
    domain/name          the matrix, one row per gene (or per cell when pivoted), in the
                         stored layout of `layout.stored_schema` (per-row dense or sparse)

The metadata datasets are ingested first and the matrix last: each ingest is atomic, so the
matrix, and with it the whole triple, becomes visible only when everything is stored. A
leftover `__genes` / `__cells` without its matrix is the debris of an ingest that failed
half-way; the next ingest under that name removes it.

The matrix dataset's custom metadata carries the user's `metadata=` as plain strings plus one
reserved key, `quarry.genes`, with a JSON description (shape, orientation, the reader's own
metadata such as the log1p base, category orders). Results of operations on the matrix carry
both back (`DataFrame.attrs`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quarry.errors import DatasetExists, DatasetNotFound
from quarry.genes.errors import GenesInputError
from quarry.genes.layout import Orientation, iter_block_batches, iter_rows_batches, stored_schema
from quarry.genes.matrix import (
    CELL_COLUMN,
    GENE_COLUMN,
    CheckedBlocks,
    ExpressionMatrix,
    GeneBlocks,
)
from quarry.genes.readers import Format, read, read_h5ad
from quarry.progress import Bar
from quarry.store import naming
from quarry.store.codec import BLOCK_BYTES_HINT

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster
    from quarry.coordinator.membership.catalog import DatasetEntry

DESCRIPTION_KEY = "quarry.genes"
DESCRIPTION_FORMAT = 1
CELLS_SUFFIX = "__cells"
GENES_SUFFIX = "__genes"
# Rows are dealt to partitions round-robin, so a scan returns them out of order: this column
# puts them back (the gene's row / the cell's column number in the matrix).
POSITION_COLUMN = "position"
# A matrix ingested with ``order_by`` stores its cells in that order; this column of its cell
# metadata keeps each cell's place in the source, so answers come back in the user's order.
SOURCE_POSITION_COLUMN = "source_position"
# A matrix stored by cells is cut into blocks of about this many bytes within each slice
# (``store.codec.BLOCK_BYTES_HINT``): an axis query reads only the blocks holding selected
# cells. 256 KiB keeps a slice's block list short (16 blocks of a 4 MiB slice, about 2 KB of
# its metadata slice) while a contiguous selection reads at most two blocks it does not need.
MATRIX_BLOCK_BYTES = 256 << 10
# Cell and gene metadata read back per process, keyed by dataset version: a repeated request
# does not scan them again, and a re-ingest (new version) never sees stale ones.
AXIS_CACHE_ENTRIES_MAX = 16

_axis_cache: OrderedDict[tuple[str, str, str], pa.Table] = OrderedDict()


@dataclass
class StoredMatrix:
    """The host's view of a matrix on a cluster; cells and genes are scanned on first use."""

    cluster: Cluster
    dataset: str  # domain/name
    entry: DatasetEntry
    description: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def domain(self) -> str:
        return self.entry.domain

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def version(self) -> str:
        return self.entry.version

    @property
    def orientation(self) -> Orientation:
        return self.description["orientation"]

    @property
    def gene_count(self) -> int:
        return int(self.description["genes"])

    @property
    def cell_count(self) -> int:
        return int(self.description["cells"])

    @property
    def cells(self) -> pa.Table:
        table = self._axis(CELLS_SUFFIX, CELL_COLUMN, self.cell_count)
        return table.drop_columns([SOURCE_POSITION_COLUMN]) if self.ordered else table

    @property
    def ordered(self) -> bool:
        """Whether the cells are stored in an order of their own (``ingest(order_by=...)``)."""
        return bool(self.description.get("order_by"))

    @property
    def source_positions(self) -> np.ndarray | None:
        """Each stored cell's place in the source (None: stored in the source's order)."""
        if not self.ordered:
            return None
        table = self._axis(CELLS_SUFFIX, CELL_COLUMN, self.cell_count)
        return table.column(SOURCE_POSITION_COLUMN).to_numpy().astype(np.int64)

    @property
    def genes(self) -> pa.Table:
        return self._axis(GENES_SUFFIX, GENE_COLUMN, self.gene_count)

    @property
    def cell_ids(self) -> np.ndarray:
        return self.cells.column(CELL_COLUMN).to_numpy(zero_copy_only=False)

    @property
    def gene_names(self) -> np.ndarray:
        return self.genes.column(GENE_COLUMN).to_numpy(zero_copy_only=False)

    def _axis(self, suffix: str, id_column: str, expected_rows: int) -> pa.Table:
        key = (self.dataset + suffix, self.version, id_column)
        if key in _axis_cache:
            _axis_cache.move_to_end(key)
            return _axis_cache[key]
        table = self.cluster.scan(self.dataset + suffix).read_all()
        if table.num_rows != expected_rows:
            raise GenesInputError(
                f"dataset {self.dataset!r}: {self.dataset + suffix} has {table.num_rows} rows "
                f"but the matrix has {expected_rows}; ingest the matrix again"
            )
        table = table.sort_by(POSITION_COLUMN).drop_columns([POSITION_COLUMN])
        positions_ok = table.num_rows == 0 or table.column(id_column).null_count == 0
        assert positions_ok, f"{self.dataset + suffix} lost ids"
        table = restore_categories(table, self.description.get("categories", {}).get(suffix, {}))
        _axis_cache[key] = table
        while len(_axis_cache) > AXIS_CACHE_ENTRIES_MAX:
            _axis_cache.popitem(last=False)
        return table


def ingest(
    cluster: Cluster,
    source: str | Path | ExpressionMatrix | GeneBlocks | Any,
    dataset: str,
    *,
    orientation: Orientation = "genes",
    metadata: Mapping[str, object] | None = None,
    replicas: int = 1,
    compression: str = "none",
    format: Format | None = None,
    cell_metadata: str | Path | pa.Table | None = None,
    density_threshold: float | None = None,
    order_by: Sequence[str] | None = None,
    progress: bool | None = None,
) -> StoredMatrix:
    """Store an expression matrix (a file, an AnnData, an `ExpressionMatrix` or `GeneBlocks`).

    source:      an .h5ad file, a 10x Matrix Market directory, a dense TSV/CSV, an AnnData
                 object, an `ExpressionMatrix`, or a `GeneBlocks` / `CellBlocks`: a matrix
                 larger than memory, stored one block of genes (of cells, orientation "cells")
                 at a time.
    orientation: "genes" (genes are rows, the paper's layout) or "cells" (pivoted).
    metadata:    custom dataset metadata, kept with the dataset and copied into results.
    order_by:    cell metadata columns to store the cells in the order of (as Census orders
                 cells by dataset): cells that filters select together then lie together, so
                 an axis query reads few slices, and in them few blocks. Answers still come
                 in the source's cell order. Needs the matrix in memory (not blocks).
    progress:    a bar of the rows stored: on a terminal (None), always (True) or never.
    Returns the stored matrix. Raises `DatasetExists` if the matrix is already there: drop it
    first (`quarry.genes.drop`); dropping and ingesting again gives a new `version`. A matrix
    that fails a check, whenever it is found, leaves nothing stored.
    """
    if orientation not in ("genes", "cells"):
        raise GenesInputError(f"orientation must be 'genes' or 'cells', not {orientation!r}")
    domain, name = _names(dataset)
    qualified = f"{domain}/{name}"
    user_metadata = _user_metadata(qualified, metadata)
    matrix = _as_matrix(source, qualified, format, cell_metadata)
    if order_by:
        matrix = ordered_cells(matrix, list(order_by))
    _clear_name(cluster, qualified)
    # Only now: a GeneBlocks is read once, and this reads its first block.
    stream = _matrix_stream(matrix, orientation, density_threshold)

    genes, gene_categories = _axis_table(matrix.genes)
    cells, cell_categories = _axis_table(matrix.cells)
    description = {
        "format": DESCRIPTION_FORMAT,
        "kind": "expression_matrix",
        "orientation": orientation,
        "genes": matrix.gene_count,
        "cells": matrix.cell_count,
        "nonzero": stream.nonzero,
        "value_type": str(stream.schema.field(2).type.value_type),
        "cells_dataset": qualified + CELLS_SUFFIX,
        "genes_dataset": qualified + GENES_SUFFIX,
        "source": matrix.dataset,
        "matrix_metadata": _json_safe(matrix.metadata),
        "categories": {CELLS_SUFFIX: cell_categories, GENES_SUFFIX: gene_categories},
        "order_by": list(order_by or []),
    }
    dataset_metadata = {**user_metadata, DESCRIPTION_KEY: json.dumps(description)}
    options = {"replicas": replicas, "compression": compression, "metadata": dataset_metadata}
    hints = {"genes.role": "axis"}
    # Blocks serve reads of some rows: a cell filter selects runs of a matrix stored by cells.
    # One stored by genes is read whole by the statistics it serves (ranks, HVG), which would
    # only pay for joining blocks.
    blocks = {BLOCK_BYTES_HINT: MATRIX_BLOCK_BYTES} if orientation == "cells" else {}
    try:
        cluster.ingest(genes, qualified + GENES_SUFFIX, hints=hints, **options)
        cluster.ingest(cells, qualified + CELLS_SUFFIX, hints=hints, **options)
        with Bar(f"ingest {qualified}", stream.rows, orientation, progress) as bar:
            cluster.ingest(
                pa.RecordBatchReader.from_batches(stream.schema, _advancing(stream, bar)),
                qualified,
                hints={"genes.role": "matrix", "genes.orientation": orientation, **blocks},
                progress=False,
                # a slice is a run of rows (cells, or genes), so its zone map of row ids is as
                # narrow as its rows: an axis query's selection prunes every other slice
                contiguous_slices=True,
                **options,
            )
    except BaseException:
        _drop_quietly(cluster, qualified + CELLS_SUFFIX)
        _drop_quietly(cluster, qualified + GENES_SUFFIX)
        if stream.failures:  # a block found wrong mid-way: say what, not how the stream broke
            raise GenesInputError(f"{stream.failures[0]}; nothing was stored") from None
        raise
    return open_matrix(cluster, qualified)


@dataclass
class MatrixStream:
    """A matrix on its way to the cluster: the stored schema and batches, made as they are sent."""

    schema: pa.Schema
    rows: int  # stored rows: genes, or cells when pivoted
    nonzero: int | None  # None: blocks whose count is known only once they are all read
    batches: Iterator[pa.RecordBatch]
    failures: list[GenesInputError] = field(default_factory=list)


def _matrix_stream(
    matrix: ExpressionMatrix | GeneBlocks, orientation: Orientation, threshold: float | None
) -> MatrixStream:
    if isinstance(matrix, ExpressionMatrix):
        schema, batches = iter_rows_batches(
            matrix, orientation=orientation, density_threshold=threshold
        )
        rows = matrix.gene_count if orientation == "genes" else matrix.cell_count
        return MatrixStream(schema, rows, matrix.nonzero_count, batches)
    if orientation != matrix.ROWS:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: a matrix given in blocks of {matrix.ROWS} is stored "
            f"by {matrix.ROWS}; orientation={orientation!r} would need the whole matrix at once"
            + (" (give CellBlocks to store by cells)" if matrix.ROWS == "genes" else "")
        )
    blocks = CheckedBlocks(matrix)
    schema = stored_schema(orientation, pa.from_numpy_dtype(blocks.dtype), matrix.column_count)
    batches = iter_block_batches(blocks, schema, density_threshold=threshold)
    return MatrixStream(schema, matrix.row_count, matrix.nonzero, batches)


def _advancing(stream: MatrixStream, bar: Bar) -> Iterator[pa.RecordBatch]:
    """The stream's batches, moving the bar, keeping any check that failed on the way (the
    ingest underneath reports a broken source in its own words)."""
    try:
        for batch in stream.batches:
            yield batch
            bar.advance(batch.num_rows)
    except GenesInputError as error:
        stream.failures.append(error)
        raise


def _clear_name(cluster: Cluster, qualified: str) -> None:
    """Refuse a matrix that exists; remove the debris of one whose ingest failed half-way."""
    cluster.refresh()
    if qualified in cluster.catalog:
        raise DatasetExists(
            f"expression matrix {qualified} already exists: drop it first "
            f"(quarry.genes.drop(cluster, {qualified!r})) or choose another name"
        )
    for leftover in (qualified + CELLS_SUFFIX, qualified + GENES_SUFFIX):
        if leftover in cluster.catalog:
            cluster.drop(leftover)


def ingest_file(
    cluster: Cluster, path: str | Path, dataset: str, format: str | None = None
) -> StoredMatrix:
    """`quarry ingest --format h5ad|mtx|tsv`: read an expression matrix file and store it."""
    if format is not None and format not in ("h5ad", "mtx", "tsv"):
        raise GenesInputError(f"{format!r} is not an expression matrix format: h5ad, mtx or tsv")
    return ingest(cluster, Path(path), dataset, format=format)  # type: ignore[arg-type]


def open_matrix(cluster: Cluster, dataset: str) -> StoredMatrix:
    """The stored matrix `dataset`, or an error saying what is there instead."""
    domain, name = naming.split_dataset(dataset)
    qualified = f"{domain}/{name}"
    for suffix, what in ((CELLS_SUFFIX, "cell"), (GENES_SUFFIX, "gene")):
        if name.endswith(suffix):
            raise GenesInputError(
                f"dataset {qualified} is not an expression matrix: it holds the {what} "
                f"metadata of {qualified[: -len(suffix)]}; name the matrix itself"
            )
    try:
        entry = cluster.entry(qualified)
    except DatasetNotFound:
        matrices = [e.qualified for e in cluster.catalog.values() if DESCRIPTION_KEY in e.metadata]
        raise DatasetNotFound(
            f"no expression matrix {qualified} on this cluster; matrices are: "
            f"{', '.join(matrices) or 'none'} (store one with quarry.genes.ingest)"
        ) from None
    if DESCRIPTION_KEY not in entry.metadata:
        raise GenesInputError(
            f"dataset {qualified} is not an expression matrix stored by quarry.genes.ingest"
        )
    description = json.loads(entry.metadata[DESCRIPTION_KEY])
    if description.get("format") != DESCRIPTION_FORMAT:
        raise GenesInputError(
            f"dataset {qualified} was stored by another version of quarry.genes "
            f"(format {description.get('format')}); ingest it again"
        )
    metadata = dict(description.get("matrix_metadata", {}))
    metadata.update({k: v for k, v in entry.metadata.items() if k != DESCRIPTION_KEY})
    return StoredMatrix(cluster, qualified, entry, description, metadata)


def drop(cluster: Cluster, dataset: str) -> int:
    """Drop a matrix and its cell and gene metadata (and the devices' cached statistics)."""
    domain, name = _names(dataset)
    qualified = f"{domain}/{name}"
    cluster.refresh()
    names = [qualified, qualified + CELLS_SUFFIX, qualified + GENES_SUFFIX]
    present = [n for n in names if n in cluster.catalog]
    if not present:
        raise DatasetNotFound(f"no expression matrix {qualified} to drop")
    # The matrix first: once it is gone the triple is invisible, whatever happens next.
    return sum(cluster.drop(n) for n in present)


def _names(dataset: str) -> tuple[str, str]:
    domain, name = naming.split_dataset(dataset)
    longest = name + max(CELLS_SUFFIX, GENES_SUFFIX, key=len)
    try:
        naming.check_identifier("dataset", longest)
    except ValueError:
        raise GenesInputError(
            f"dataset name {name!r} is too long for an expression matrix: its metadata is "
            f"stored as {name}{CELLS_SUFFIX}, which must fit in 63 characters"
        ) from None
    if name.endswith((CELLS_SUFFIX, GENES_SUFFIX)):
        raise GenesInputError(
            f"dataset name {name!r} ends with a suffix quarry.genes uses for metadata "
            f"({CELLS_SUFFIX}, {GENES_SUFFIX}); choose another name"
        )
    return domain, name


def _as_matrix(
    source: Any, dataset: str, format: Format | None, cell_metadata: Any
) -> ExpressionMatrix | GeneBlocks:
    if isinstance(source, ExpressionMatrix | GeneBlocks):
        matrix = source
    elif isinstance(source, str | Path):
        matrix = read(source, format, dataset=dataset, cell_metadata=cell_metadata)
        return matrix
    elif type(source).__name__ == "AnnData":
        matrix = read_h5ad(source, dataset=dataset)
    else:
        raise GenesInputError(
            f"cannot ingest a {type(source).__name__} as expression matrix {dataset}: give a "
            "file path (.h5ad, 10x directory, TSV/CSV), an AnnData, an ExpressionMatrix or "
            "GeneBlocks"
        )
    if cell_metadata is not None:
        from quarry.genes.readers import with_cell_metadata

        matrix = with_cell_metadata(matrix, cell_metadata)
    return matrix


def ordered_cells(matrix: ExpressionMatrix | GeneBlocks, order_by: list[str]) -> ExpressionMatrix:
    """``matrix`` with its cells in the order of ``order_by`` (stable: ties keep the source's
    order; categories by their values), each cell's source position in
    ``SOURCE_POSITION_COLUMN``."""
    if not isinstance(matrix, ExpressionMatrix):
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: order_by reorders the cells of a matrix in memory; "
            "a matrix given in blocks is stored in the order it arrives (sort its cells first)"
        )
    cells = matrix.cells
    unknown = [c for c in order_by if c not in cells.column_names]
    if unknown or SOURCE_POSITION_COLUMN in cells.column_names:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: order_by names {unknown or order_by} but the cell "
            f"metadata columns are {cells.column_names}"
            + (f" ({SOURCE_POSITION_COLUMN!r} is quarry's)" if not unknown else "")
        )
    keys = pa.table(
        [
            cells.column(c).cast(cells.column(c).type.value_type)
            if pa.types.is_dictionary(cells.column(c).type)
            else cells.column(c)
            for c in order_by
        ],
        names=[f"k{i}" for i in range(len(order_by))],
    )
    order = pc.sort_indices(keys, sort_keys=[(f"k{i}", "ascending") for i in range(len(order_by))])
    order_np = order.to_numpy()
    values = matrix.values[:, order_np]
    reordered = cells.take(order).append_column(
        SOURCE_POSITION_COLUMN, pa.array(order_np.astype(np.int64))
    )
    return ExpressionMatrix(values, matrix.genes, reordered, matrix.metadata, matrix.dataset)


def _user_metadata(dataset: str, metadata: Mapping[str, object] | None) -> dict[str, str]:
    plain: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or key.startswith("quarry."):
            raise GenesInputError(
                f"dataset {dataset}: metadata key {key!r} is not allowed; keys are strings "
                "and 'quarry.' is reserved"
            )
        plain[key] = value if isinstance(value, str) else json.dumps(value)
    return plain


def _axis_table(table: pa.Table) -> tuple[pa.Table, dict[str, list[str]]]:
    """Metadata ready to store: a position column, categories as plain values (their order kept
    aside, for the host to restore)."""
    categories: dict[str, list[str]] = {}
    columns, names = [], []
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_dictionary(column.type):
            chunks = [chunk.dictionary.cast(pa.string()) for chunk in column.chunks]
            if chunks:
                categories[name] = pa.chunked_array(chunks, pa.string()).unique().to_pylist()
            # Stored as plain values: a dictionary column does not survive the store's scans.
            column = column.cast(column.type.value_type)
        columns.append(column)
        names.append(name)
    stored = pa.table(columns, names=names)
    positions = pa.array(np.arange(table.num_rows, dtype=np.int64))
    return stored.add_column(0, POSITION_COLUMN, positions), categories


def restore_categories(table: pa.Table, categories: Mapping[str, list[str]]) -> pa.Table:
    for name, labels in categories.items():
        if name not in table.column_names:
            continue
        index = table.column_names.index(name)
        values = table.column(name).cast(pa.string())
        codes = pc.index_in(values, value_set=pa.array(labels, type=pa.string()))
        dictionary = pa.DictionaryArray.from_arrays(
            codes.combine_chunks().cast(pa.int32()), pa.array(labels, type=pa.string())
        )
        table = table.set_column(index, name, dictionary)
    return table


def _json_safe(metadata: Mapping[str, Any]) -> dict[str, Any]:
    safe: dict[str, Any] = {}
    for key, value in metadata.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
        safe[str(key)] = value
    return safe


def _drop_quietly(cluster: Cluster, dataset: str) -> None:
    try:
        cluster.refresh()
        if dataset in cluster.catalog:
            cluster.drop(dataset)
    except Exception:  # the original error matters more; a leftover is removed next ingest
        pass
