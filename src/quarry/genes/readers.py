"""Read expression matrices in the formats biologists have into one `ExpressionMatrix`.

- AnnData `.h5ad` (or an AnnData already in memory): cells x genes, transposed on the way in.
- 10x Matrix Market directories: `matrix.mtx[.gz]` (genes x cells) with `barcodes.tsv[.gz]`
  and `features.tsv[.gz]` (or the older `genes.tsv[.gz]`).
- Dense TSV/CSV as expression atlases publish them: genes as rows, the first column(s) gene
  annotations, a header of cell ids.

A separate cell metadata table (cluster labels and the like) can be joined by cell id to the
MTX and TSV formats, which carry none of their own. This module is the ingest boundary: pandas
appears only where AnnData hands it over.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from scipy import sparse

from quarry.genes import matrix_market
from quarry.genes.errors import GenesInputError
from quarry.genes.matrix import CELL_COLUMN, GENE_COLUMN, ExpressionMatrix, GeneBlocks

Format = Literal["h5ad", "mtx", "tsv"]
MatrixLike = TypeVar("MatrixLike", ExpressionMatrix, GeneBlocks)

# Numbers as text: what `float()` accepts, minus the spellings of "missing" that we report
# separately as missing values.
_NUMBER_PATTERN = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"

# Ids that atlases and 10x use for a missing value; they are reported, never read as 0.
_MISSING_VALUES = ["", "NA", "N/A", "NaN", "nan", "NULL", "null"]


def read(
    source: str | Path | Any,
    format: Format | None = None,
    *,
    dataset: str | None = None,
    cell_metadata: str | Path | pa.Table | None = None,
) -> ExpressionMatrix:
    """Read `source` in `format` (guessed from the path when None) into an ExpressionMatrix."""
    if format is None:
        format = _guess_format(source)
    if format == "h5ad":
        matrix = read_h5ad(source, dataset=dataset)
        if cell_metadata is not None:
            matrix = with_cell_metadata(matrix, cell_metadata)
        return matrix
    if format == "mtx":
        return read_mtx(source, dataset=dataset, cell_metadata=cell_metadata)
    if format == "tsv":
        return read_tsv(source, dataset=dataset, cell_metadata=cell_metadata)
    raise GenesInputError(f"unknown expression matrix format {format!r}; use h5ad, mtx or tsv")


def _guess_format(source: Any) -> Format:
    if not isinstance(source, str | Path):
        return "h5ad"  # an AnnData object in memory
    path = Path(source)
    if path.is_dir():
        return "mtx"
    suffixes = [s.lower() for s in path.suffixes]
    if ".h5ad" in suffixes:
        return "h5ad"
    if {".tsv", ".csv", ".txt", ".tab"} & set(suffixes):
        return "tsv"
    raise GenesInputError(
        f"{str(path)!r}: cannot tell the format from the name; pass format='h5ad', 'mtx' or 'tsv'"
    )


# --- AnnData ----------------------------------------------------------------------------------

HDF5_CHECK_S = 30.0

_HDF5_WALK = """
import sys, h5py
def visit(name, item):
    dict(item.attrs)
with h5py.File(sys.argv[1], "r") as f:
    dict(f.attrs)
    f.visititems(visit)
"""


def _genes_by_cells(x: Any, dataset: str) -> Any:
    """X (cells x genes) turned to genes x cells. A sparse X from a file is checked in full
    first (its index pointers and indices, one pass): scipy trusts them, and a damaged one
    crashes the process when converted (found by fuzzing)."""
    if not sparse.issparse(x):
        return np.ascontiguousarray(np.asarray(x).T)
    if hasattr(x, "check_format"):
        try:
            x.check_format(full_check=True)
        except (ValueError, TypeError, IndexError) as error:
            raise GenesInputError(f"dataset {dataset!r}: a damaged sparse X ({error})") from None
    return sparse.csr_matrix(x.T)


def check_hdf5_structure(path: Path, timeout_s: float | None = None) -> None:
    """Walk the file's groups and attributes in a child process before reading it here.

    A damaged HDF5 file can make the HDF5 library loop forever while it reads attributes (found
    by fuzzing), and native code cannot be interrupted; so the structure is walked first in a
    process that can be stopped. It costs a fraction of a second per file.
    """
    timeout_s = HDF5_CHECK_S if timeout_s is None else timeout_s
    try:
        walked = subprocess.run(
            [sys.executable, "-c", _HDF5_WALK, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise GenesInputError(
            f"{str(path)!r}: reading its HDF5 structure did not finish in {timeout_s:g} s; "
            "the file is damaged"
        ) from None
    if walked.returncode != 0:
        lines = walked.stderr.strip().splitlines() or [f"exit code {walked.returncode}"]
        raise GenesInputError(f"{str(path)!r} is not a readable .h5ad file: {lines[-1]}")


def read_h5ad(
    source: str | Path | Any,
    *,
    dataset: str | None = None,
    layer: str | None = None,
    use_raw: bool = False,
) -> ExpressionMatrix:
    """Read an AnnData `.h5ad` file, or convert an AnnData object, to genes x cells.

    `layer` picks `adata.layers[layer]` instead of `X`; `use_raw` picks `adata.raw`.
    """
    import anndata

    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise GenesInputError(f"{str(path)!r}: no such .h5ad file")
        check_hdf5_structure(path)
        try:
            adata = anndata.read_h5ad(path)
        except Exception as error:  # anndata's reader raises many kinds on a damaged file
            detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            raise GenesInputError(f"{str(path)!r} is not a readable .h5ad file: {detail}") from None
        dataset = dataset or path.name
    else:
        adata = source
        dataset = dataset or "anndata"
    if layer is not None and use_raw:
        raise GenesInputError(f"dataset {dataset!r}: pass either layer or use_raw, not both")
    var = adata.var
    if use_raw:
        if adata.raw is None:
            raise GenesInputError(f"dataset {dataset!r}: use_raw=True but the AnnData has no raw")
        x = adata.raw.X
        var = adata.raw.var
    elif layer is not None:
        if layer not in adata.layers:
            raise GenesInputError(
                f"dataset {dataset!r}: no layer {layer!r} (layers: {list(adata.layers.keys())})"
            )
        x = adata.layers[layer]
    else:
        x = adata.X
    if x is None:
        raise GenesInputError(f"dataset {dataset!r}: the AnnData has no expression matrix (X)")
    values = _genes_by_cells(x, dataset)
    genes = frame_to_table(var, GENE_COLUMN)
    cells = frame_to_table(adata.obs, CELL_COLUMN)
    return ExpressionMatrix(values, genes, cells, h5ad_metadata(adata), dataset=dataset)


def h5ad_metadata(adata: Any) -> dict[str, Any]:
    """What an AnnData says about its matrix that results should carry: the format, the
    top-level scalars of `uns`, and the log1p base (scanpy's fold change undoes log1p with it,
    so ours can too)."""
    metadata: dict[str, Any] = {"source_format": "h5ad"}
    metadata.update(_plain_metadata(adata.uns))
    log1p = adata.uns.get("log1p") if hasattr(adata.uns, "get") else None
    if isinstance(log1p, Mapping) and log1p.get("base") is not None:
        metadata["log1p_base"] = float(log1p["base"])
    return metadata


def frame_to_table(frame: Any, id_column: str) -> pa.Table:
    """An AnnData obs/var frame as Arrow, its index becoming the id column (first)."""
    ids = pa.array(np.asarray(frame.index, dtype=object).astype(str), type=pa.string())
    if len(frame.columns) == 0:  # only an index (anndata's default): Arrow would see 0 rows
        return pa.table({id_column: ids})
    renamed = frame.rename(columns={id_column: f"{id_column}_original"})
    # The pandas schema metadata describes a frame we no longer have: drop it.
    table = pa.Table.from_pandas(renamed, preserve_index=False).replace_schema_metadata(None)
    return table.add_column(0, id_column, ids)


def _plain_metadata(uns: Any) -> dict[str, Any]:
    """Top-level scalars of `uns`: small enough to travel with every result."""
    plain: dict[str, Any] = {}
    for key, value in dict(uns).items():
        if isinstance(value, str | bool | int | float) and not isinstance(value, np.ndarray):
            plain[str(key)] = value
        elif isinstance(value, np.generic):
            plain[str(key)] = value.item()
    return plain


# --- 10x Matrix Market ------------------------------------------------------------------------


def read_mtx(
    directory: str | Path,
    *,
    dataset: str | None = None,
    cell_metadata: str | Path | pa.Table | None = None,
    dtype: np.dtype | type = np.float32,
) -> ExpressionMatrix:
    """Read a 10x Matrix Market directory (genes x cells), optionally joining cell metadata.

    Gene names come from the features file's second column (the symbol, as scanpy does) made
    unique with `-1`, `-2` suffixes; the first column is kept as `gene_id`.
    """
    root = Path(directory)
    if not root.is_dir():
        raise GenesInputError(f"{str(root)!r}: not a directory with a 10x matrix")
    dataset = dataset or root.name
    matrix_path = _first_existing(root, ["matrix.mtx.gz", "matrix.mtx"], dataset)
    barcodes_path = _first_existing(root, ["barcodes.tsv.gz", "barcodes.tsv"], dataset)
    features_path = _first_existing(
        root, ["features.tsv.gz", "features.tsv", "genes.tsv.gz", "genes.tsv"], dataset
    )
    try:
        values = matrix_market.read(matrix_path)
    except GenesInputError as error:
        raise GenesInputError(f"dataset {dataset!r}: {error}") from None
    barcodes = _read_plain_table(barcodes_path, dataset)
    features = _read_plain_table(features_path, dataset)
    gene_count, cell_count = values.shape
    if features.num_rows != gene_count:
        raise GenesInputError(
            f"dataset {dataset!r}: {matrix_path.name} has {gene_count} gene rows but "
            f"{features_path.name} lists {features.num_rows} features"
        )
    if barcodes.num_rows != cell_count:
        raise GenesInputError(
            f"dataset {dataset!r}: {matrix_path.name} has {cell_count} cell columns but "
            f"{barcodes_path.name} lists {barcodes.num_rows} barcodes"
        )
    # Shapes agree with the names: only now is the row index (one entry per gene) allocated.
    values = (
        sparse.csr_matrix(values).astype(dtype)
        if sparse.issparse(values)
        else np.asarray(values, dtype=dtype)
    )
    feature_ids = features.column(0).cast(pa.string())
    symbols = features.column(1).cast(pa.string()) if features.num_columns > 1 else feature_ids
    genes = pa.table({GENE_COLUMN: _make_unique(symbols), "gene_id": feature_ids})
    if features.num_columns > 2:
        genes = genes.append_column("feature_type", features.column(2).cast(pa.string()))
    cells = pa.table({CELL_COLUMN: barcodes.column(0).cast(pa.string())})
    matrix = ExpressionMatrix(values, genes, cells, {"source_format": "mtx"}, dataset=dataset)
    if cell_metadata is not None:
        matrix = with_cell_metadata(matrix, cell_metadata)
    return matrix


def _first_existing(root: Path, names: list[str], dataset: str) -> Path:
    for name in names:
        if (root / name).is_file():
            return root / name
    raise GenesInputError(f"dataset {dataset!r}: {str(root)!r} has none of {names}")


def _read_plain_table(path: Path, dataset: str) -> pa.Table:
    """A header-less tab-separated file of strings (barcodes, features)."""
    try:
        return pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(autogenerate_column_names=True),
            parse_options=pacsv.ParseOptions(delimiter="\t"),
            # Barcodes and gene ids are names: "0001" must not become the number 1.
            convert_options=pacsv.ConvertOptions(
                column_types={f"f{i}": pa.string() for i in range(3)}
            ),
        )
    except pa.ArrowInvalid as error:
        raise GenesInputError(f"dataset {dataset!r}: cannot read {path.name}: {error}") from error


def _make_unique(names: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Suffix repeated names with -1, -2, ... in order of appearance (scanpy's convention)."""
    values = np.asarray(names.to_numpy(zero_copy_only=False), dtype=object)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    if counts.max(initial=1) <= 1:
        return pa.array(values, type=pa.string())
    # Occurrence number of each name: rank within its group in order of appearance.
    order = np.argsort(inverse, kind="stable")
    group_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    occurrence = np.empty(len(values), dtype=np.int64)
    occurrence[order] = np.arange(len(values)) - np.repeat(group_starts, counts)
    suffixed = pc.binary_join_element_wise(
        pa.array(values, type=pa.string()),
        pc.cast(pa.array(occurrence), pa.string()),
        "-",
    )
    # A later suffix could collide with a real name; the ExpressionMatrix check reports that.
    return pc.if_else(pa.array(occurrence > 0), suffixed, pa.array(values, type=pa.string()))


# --- dense TSV / CSV --------------------------------------------------------------------------


def read_tsv(
    path: str | Path,
    *,
    dataset: str | None = None,
    cell_metadata: str | Path | pa.Table | None = None,
    gene_column_count: int = 1,
    delimiter: str | None = None,
    dtype: np.dtype | type = np.float32,
) -> ExpressionMatrix:
    """Read a dense genes x cells table: the header names cells, each row is one gene.

    The first `gene_column_count` columns annotate genes (the first one is the gene id, e.g.
    EBI atlases publish `Gene ID` and `Gene Name`); every other column is a cell.
    """
    source = Path(path)
    if not source.is_file():
        raise GenesInputError(f"{str(source)!r}: no such expression table")
    dataset = dataset or source.name
    if delimiter is None:
        delimiter = "," if ".csv" in [s.lower() for s in source.suffixes] else "\t"
    try:
        table = pacsv.read_csv(
            source,
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(null_values=_MISSING_VALUES),
        )
    except pa.ArrowInvalid as error:
        raise GenesInputError(
            f"dataset {dataset!r}: cannot parse {source.name}: {error}"
        ) from error
    if gene_column_count < 1 or table.num_columns <= gene_column_count:
        raise GenesInputError(
            f"dataset {dataset!r}: {source.name} has {table.num_columns} columns; expected "
            f"{gene_column_count} gene column(s) followed by one column per cell"
        )
    gene_table = table.select(range(gene_column_count))
    gene_names = [GENE_COLUMN] + gene_table.column_names[1:]
    genes = gene_table.rename_columns(gene_names)
    genes = genes.set_column(0, GENE_COLUMN, genes.column(0).cast(pa.string()))
    cell_table = table.select(range(gene_column_count, table.num_columns))
    values = _numeric_block(cell_table, genes.column(0), dataset, source.name)
    cells = pa.table({CELL_COLUMN: pa.array(cell_table.column_names, type=pa.string())})
    matrix = ExpressionMatrix(
        values.astype(dtype), genes, cells, {"source_format": "tsv"}, dataset=dataset
    )
    if cell_metadata is not None:
        matrix = with_cell_metadata(matrix, cell_metadata)
    return matrix


def _numeric_block(
    table: pa.Table, gene_ids: pa.ChunkedArray, dataset: str, file_name: str
) -> np.ndarray:
    """Cell columns as a genes x cells float64 array, with a clear error on bad values."""
    # The schema loop is per column of metadata, not per value: the values go through Arrow.
    for index, column_type in enumerate(table.schema.types):
        if pa.types.is_integer(column_type) or pa.types.is_floating(column_type):
            continue
        if pa.types.is_null(column_type):
            continue  # an all-missing column is reported below with the other missing values
        column = table.column(index).cast(pa.string())
        is_number = pc.match_substring_regex(column, _NUMBER_PATTERN)
        bad_rows = np.flatnonzero(~is_number.to_numpy(zero_copy_only=False))
        first = int(bad_rows[0])
        raise GenesInputError(
            f"dataset {dataset!r}: {file_name} column {table.column_names[index]!r} has "
            f"{len(bad_rows)} non-numeric values, first {column[first].as_py()!r} at gene "
            f"{gene_ids[first].as_py()!r}"
        )
    if table.num_rows == 0:
        return np.zeros((0, table.num_columns))
    float_table = table.cast(pa.schema([(name, pa.float64()) for name in table.column_names]))
    block = float_table.combine_chunks().to_batches()[0].to_tensor(null_to_nan=True).to_numpy()
    missing = np.isnan(block)
    if missing.any():
        gene_index, cell_index = (int(i) for i in np.argwhere(missing)[0])
        raise GenesInputError(
            f"dataset {dataset!r}: {file_name} has {int(missing.sum())} missing or NaN values, "
            f"first in column {table.column_names[cell_index]!r} at gene "
            f"{gene_ids[gene_index].as_py()!r}"
        )
    return block


# --- cell metadata ----------------------------------------------------------------------------


def with_cell_metadata(
    matrix: MatrixLike, metadata: str | Path | pa.Table, *, id_column: str | None = None
) -> MatrixLike:
    """Join a cell metadata table (by cell id) onto `matrix.cells` (of a matrix or its blocks).

    The id column is `id_column`, else a column named `cell`, else the first column. Every cell
    of the matrix must have a row; extra rows (cells filtered out upstream) are ignored.
    """
    if isinstance(metadata, str | Path):
        source = Path(metadata)
        if not source.is_file():
            raise GenesInputError(
                f"dataset {matrix.dataset!r}: no cell metadata file {str(source)!r}"
            )
        delimiter = "," if ".csv" in [s.lower() for s in source.suffixes] else "\t"
        table = pacsv.read_csv(
            source,
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(
                null_values=_MISSING_VALUES, strings_can_be_null=True
            ),
        )
        label = source.name
    else:
        table = metadata
        label = "cell metadata table"
    if id_column is None:
        id_column = CELL_COLUMN if CELL_COLUMN in table.column_names else table.column_names[0]
    if id_column not in table.column_names:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: {label} has no column {id_column!r} "
            f"(columns: {table.column_names})"
        )
    ids = table.column(id_column).cast(pa.string())
    if len(ids.unique()) != table.num_rows:
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: {label} lists some cell ids more than once"
        )
    positions = pc.index_in(matrix.cells.column(CELL_COLUMN), value_set=ids)
    missing = positions.is_null()
    missing_count = int(pc.sum(missing).as_py() or 0)
    if missing_count:
        first = matrix.cell_ids[np.flatnonzero(missing.to_numpy(zero_copy_only=False))[0]]
        raise GenesInputError(
            f"dataset {matrix.dataset!r}: the matrix has {matrix.cell_count} cells but {label} "
            f"describes only {matrix.cell_count - missing_count} of them ({missing_count} "
            f"missing, first {first!r})"
        )
    joined = table.drop_columns([id_column]).take(positions)
    cells = matrix.cells
    for name, column in zip(joined.column_names, joined.columns, strict=True):
        if name in cells.column_names:
            cells = cells.set_column(cells.column_names.index(name), name, column)
        else:
            cells = cells.append_column(name, column)
    return dataclasses.replace(matrix, cells=cells)
