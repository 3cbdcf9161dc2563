"""An .h5ad file too large to load, read as blocks of genes (`GeneBlocks`) for `ingest`.

anndata's backed mode loads obs, var and uns and leaves X on disk; X is then read with h5py
one block of genes at a time, so memory holds about `block_bytes` of it whatever the file's
size. X's three encodings read differently:

- `csc_matrix` (cells x genes stored by column: genes are its major axis): one read per block.
- `csr_matrix` (stored by cell, what most tools write): a gene's values are spread over every
  cell, so each block is gathered in a pass over the file, `CHUNK_VALUES` values at a time; a
  file holding N times `block_bytes` is read N times. Larger blocks, fewer passes.
- a dense array: a range of columns per block.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from quarry.genes.errors import GenesInputError
from quarry.genes.matrix import CELL_COLUMN, GENE_COLUMN, GeneBlocks
from quarry.genes.readers import check_hdf5_structure, frame_to_table, h5ad_metadata

BLOCK_BYTES = 512 << 20  # a block's values and indices in memory
CHUNK_VALUES = 16 << 20  # values of a CSR file read at once while a block is gathered
INDEX_BYTES = 4


def read_h5ad_blocks(
    path: str | Path, *, dataset: str | None = None, block_bytes: int = BLOCK_BYTES
) -> GeneBlocks:
    """The matrix of an .h5ad file as `GeneBlocks`: cell and gene metadata now, X (cells x
    genes on disk) as genes x cells blocks of about `block_bytes`, read while they are stored.

    `genes.ingest(cluster, read_h5ad_blocks("atlas.h5ad"), "lab/atlas")` stores a matrix
    larger than memory; the metadata is what `read_h5ad` keeps.
    """
    import anndata

    source = Path(path)
    if not source.is_file():
        raise GenesInputError(f"{str(source)!r}: no such .h5ad file")
    assert block_bytes > 0, block_bytes
    check_hdf5_structure(source)
    dataset = dataset or source.name
    try:
        adata = anndata.read_h5ad(source, backed="r")
    except Exception as error:  # anndata's reader raises many kinds on a damaged file
        raise GenesInputError(f"{str(source)!r} is not a readable .h5ad file: {error}") from None
    try:
        genes = frame_to_table(adata.var, GENE_COLUMN)
        cells = frame_to_table(adata.obs, CELL_COLUMN)
        metadata = h5ad_metadata(adata)
    finally:
        adata.file.close()
    blocks = _blocks(source, (cells.num_rows, genes.num_rows), block_bytes)
    return GeneBlocks(blocks, genes, cells, metadata, dataset, nonzero=None)


def _blocks(path: Path, shape: tuple[int, int], block_bytes: int) -> Iterator[Any]:
    """X's blocks, opened only when the first is asked for; read errors name the file."""
    import h5py

    try:
        with h5py.File(path, "r") as file:
            x = file["X"]
            if isinstance(x, h5py.Dataset):
                _check_shape(path, x.shape, shape)
                yield from _dense_blocks(x, block_bytes)
                return
            encoding = _encoding(x)
            _check_shape(path, tuple(x.attrs.get("shape", x.attrs.get("h5sparse_shape"))), shape)
            if encoding == "csc_matrix":
                yield from _csc_blocks(x, shape, block_bytes, path)
            elif encoding == "csr_matrix":
                yield from _csr_blocks(x, shape, block_bytes, path)
            else:
                raise GenesInputError(f"{str(path)!r}: X is stored as {encoding!r}, not a matrix")
    except (OSError, KeyError, TypeError) as error:
        raise GenesInputError(f"{str(path)!r}: cannot read X: {error}") from None


def _encoding(group: Any) -> str:
    """anndata's encoding name, or the older h5sparse attribute's."""
    kind = group.attrs.get("encoding-type") or f"{group.attrs.get('h5sparse_format')}_matrix"
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def _check_shape(path: Path, stored: tuple[int, ...], expected: tuple[int, int]) -> None:
    if tuple(int(n) for n in stored) != expected:
        raise GenesInputError(
            f"{str(path)!r}: X is {tuple(stored)} but obs and var describe {expected} "
            "(cells x genes)"
        )


def _dense_blocks(x: Any, block_bytes: int) -> Iterator[np.ndarray]:
    cell_count, gene_count = x.shape
    step = max(1, block_bytes // max(1, cell_count * x.dtype.itemsize))
    for start in range(0, gene_count, step):
        yield np.ascontiguousarray(x[:, start : start + step].T)


def _csc_blocks(
    group: Any, shape: tuple[int, int], block_bytes: int, path: Path
) -> Iterator[sparse.csr_matrix]:
    """Genes are CSC's major axis: each block is one contiguous read."""
    cell_count, gene_count = shape
    indptr = _indptr(group, gene_count, path)
    data, indices = group["data"], group["indices"]
    for start, stop in _gene_ranges(np.diff(indptr), data.dtype.itemsize, block_bytes):
        first, end = int(indptr[start]), int(indptr[stop])
        yield sparse.csr_matrix(
            (data[first:end], indices[first:end], indptr[start : stop + 1] - first),
            shape=(stop - start, cell_count),
        )


def _csr_blocks(
    group: Any, shape: tuple[int, int], block_bytes: int, path: Path
) -> Iterator[sparse.csr_matrix]:
    """Cells are CSR's major axis: count each gene's values once, then gather each block of
    genes in a pass over the file."""
    cell_count, gene_count = shape
    indptr = _indptr(group, cell_count, path)
    indices = group["indices"]
    per_gene = np.zeros(gene_count, dtype=np.int64)
    for first in range(0, len(indices), CHUNK_VALUES):
        chunk = indices[first : first + CHUNK_VALUES]
        if len(chunk) and (chunk.min() < 0 or chunk.max() >= gene_count):
            raise GenesInputError(f"{str(path)!r}: X names genes outside 0..{gene_count - 1}")
        per_gene += np.bincount(chunk, minlength=gene_count)
    for start, stop in _gene_ranges(per_gene, group["data"].dtype.itemsize, block_bytes):
        yield _gather(group, indptr, start, stop, cell_count)


def _gather(
    group: Any, indptr: np.ndarray, start: int, stop: int, cell_count: int
) -> sparse.csr_matrix:
    """Genes [start, stop) of a cells x genes CSR file, as a genes x cells CSR block."""
    indices, data = group["indices"], group["data"]
    genes, cells, values = [], [], []
    for first in range(0, len(indices), CHUNK_VALUES):
        chunk = indices[first : first + CHUNK_VALUES]
        kept = np.flatnonzero((chunk >= start) & (chunk < stop))
        if not len(kept):
            continue
        genes.append(chunk[kept] - start)
        cells.append(np.searchsorted(indptr, first + kept, side="right") - 1)
        values.append(data[first : first + CHUNK_VALUES][kept])
    if not values:
        return sparse.csr_matrix((stop - start, cell_count), dtype=data.dtype)
    coordinates = (np.concatenate(genes), np.concatenate(cells))
    return sparse.csr_matrix(
        (np.concatenate(values), coordinates), shape=(stop - start, cell_count)
    )


def _indptr(group: Any, major_count: int, path: Path) -> np.ndarray:
    """The index pointers, checked: a damaged one would make blocks out of the wrong values."""
    indptr = np.asarray(group["indptr"][:], dtype=np.int64)
    valid = (
        len(indptr) == major_count + 1
        and indptr[0] == 0
        and indptr[-1] == len(group["indices"]) == len(group["data"])
        and bool((np.diff(indptr) >= 0).all())
    )
    if not valid:
        raise GenesInputError(f"{str(path)!r}: X has damaged index pointers")
    return indptr


def _gene_ranges(per_gene: np.ndarray, itemsize: int, block_bytes: int) -> list[tuple[int, int]]:
    """Runs of genes whose values and indices come to about `block_bytes` (at least one gene)."""
    gene_bytes = per_gene * (itemsize + INDEX_BYTES)
    before = np.cumsum(gene_bytes) - gene_bytes
    starts = np.flatnonzero(np.diff(before // block_bytes, prepend=-1))
    stops = np.append(starts[1:], len(per_gene))
    return [(int(a), int(b)) for a, b in zip(starts, stops, strict=True)]
