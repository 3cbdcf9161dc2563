"""Readers: h5ad, 10x Matrix Market, dense TSV/CSV, and errors that name what is wrong."""

from __future__ import annotations

import gzip
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import scipy.io
from scipy import sparse

from quarry.genes import ExpressionMatrix, GenesInputError, read, read_h5ad, read_mtx, read_tsv

# 3 genes x 4 cells, genes as rows.
VALUES = np.array([[0, 1, 0, 2], [3, 0, 0, 0], [0.5, 0, 4, 0]], dtype=np.float32)
GENES = ["CD3E", "MS4A1", "LYZ"]
CELLS = ["AAAC-1", "AAAG-1", "AACT-1", "AAGT-1"]
CLUSTERS = ["T", "B", "B", "T"]


def small_anndata() -> anndata.AnnData:
    obs = pd.DataFrame({"cluster": pd.Categorical(CLUSTERS)}, index=CELLS)
    var = pd.DataFrame({"highly_variable": [True, False, True]}, index=GENES)
    adata = anndata.AnnData(sparse.csr_matrix(VALUES.T), obs=obs, var=var)
    adata.uns["title"] = "small test set"
    adata.uns["log1p"] = {"base": 2.0}
    return adata


def dense(matrix: ExpressionMatrix) -> np.ndarray:
    values = matrix.values
    return values.toarray() if sparse.issparse(values) else values


def write_gzip(path: Path, text: str) -> None:
    with gzip.open(path, "wt") as stream:
        stream.write(text)


def write_mtx_directory(root: Path, values=VALUES, barcodes=CELLS, symbols=GENES) -> Path:
    root.mkdir()
    with gzip.open(root / "matrix.mtx.gz", "wb") as stream:
        scipy.io.mmwrite(stream, sparse.coo_matrix(values))
    write_gzip(root / "barcodes.tsv.gz", "".join(f"{b}\n" for b in barcodes))
    features = "".join(
        f"ENSG{i:05d}\t{symbol}\tGene Expression\n" for i, symbol in enumerate(symbols)
    )
    write_gzip(root / "features.tsv.gz", features)
    return root


def write_tsv(path: Path, values=VALUES, separator: str = "\t") -> Path:
    lines = [separator.join(["gene_id", *CELLS])]
    lines += [
        separator.join([gene, *(f"{v:g}" for v in row)])
        for gene, row in zip(GENES, values, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- h5ad ---------------------------------------------------------------------------------


def test_h5ad_file_reads_as_genes_by_cells(tmp_path):
    path = tmp_path / "small.h5ad"
    small_anndata().write_h5ad(path)
    matrix = read_h5ad(path)
    assert matrix.dataset == "small.h5ad"
    assert sparse.issparse(matrix.values) and matrix.values.dtype == np.float32
    np.testing.assert_array_equal(dense(matrix), VALUES)
    assert matrix.gene_names.tolist() == GENES
    assert matrix.cell_ids.tolist() == CELLS
    assert matrix.cells.column("cluster").to_pylist() == CLUSTERS
    assert matrix.genes.column("highly_variable").to_pylist() == [True, False, True]
    assert matrix.metadata["title"] == "small test set"
    assert matrix.metadata["log1p_base"] == 2.0
    assert read(path).cell_count == 4  # format guessed from the name


def test_h5ad_in_memory_layer_and_raw():
    adata = small_anndata()
    adata.layers["counts"] = np.asarray(VALUES.T * 10, dtype=np.int64)
    adata.raw = adata.copy()
    from_layer = read_h5ad(adata, layer="counts")
    assert from_layer.values.dtype == np.float32  # integer counts become float32
    np.testing.assert_array_equal(dense(from_layer), VALUES * 10)
    np.testing.assert_array_equal(dense(read_h5ad(adata, use_raw=True)), VALUES)
    with pytest.raises(GenesInputError, match="no layer 'spliced'"):
        read_h5ad(adata, layer="spliced")


def test_h5ad_with_nothing_but_indexes_reads(tmp_path):
    """anndata's default: obs and var hold an index and no column."""
    path = tmp_path / "bare.h5ad"
    values = sparse.random(40, 25, density=0.2, format="csr", dtype=np.float32, random_state=1)
    anndata.AnnData(X=values).write_h5ad(path)
    matrix = read_h5ad(path)
    assert matrix.cells.column_names == ["cell"] and matrix.cells.num_rows == 40
    assert matrix.genes.column_names == ["gene"] and matrix.genes.num_rows == 25
    assert matrix.cells.column("cell").to_pylist()[:2] == ["0", "1"]


def test_h5ad_missing_file_is_named(tmp_path):
    with pytest.raises(GenesInputError, match="nothing.h5ad"):
        read_h5ad(tmp_path / "nothing.h5ad")


def test_nan_in_anndata_names_gene_and_cell():
    adata = small_anndata()
    x = VALUES.T.copy()
    x[2, 1] = np.nan
    adata.X = x
    with pytest.raises(GenesInputError, match=r"1 NaN .*gene 'MS4A1', cell 'AACT-1'"):
        read_h5ad(adata, dataset="nan-set")


# --- 10x Matrix Market ----------------------------------------------------------------------


def test_mtx_directory_with_gzip_and_cell_metadata(tmp_path):
    root = write_mtx_directory(tmp_path / "filtered", symbols=["CD3E", "CD3E", "LYZ"])
    metadata = tmp_path / "cells.csv"
    rows = [
        f"{cell},{cluster},{i}"
        for i, (cell, cluster) in enumerate(zip(CELLS, CLUSTERS, strict=True))
    ]
    metadata.write_text("cell,cluster,batch\n" + "\n".join(reversed(rows)) + "\n")
    matrix = read_mtx(root, cell_metadata=metadata)
    assert matrix.dataset == "filtered"
    np.testing.assert_array_equal(dense(matrix), VALUES)
    # Repeated symbols are made unique as scanpy does; the Ensembl id stays alongside.
    assert matrix.gene_names.tolist() == ["CD3E", "CD3E-1", "LYZ"]
    assert matrix.genes.column("gene_id").to_pylist() == ["ENSG00000", "ENSG00001", "ENSG00002"]
    # Joined by id, not by position: the metadata file lists cells in reverse.
    assert matrix.cells.column("cluster").to_pylist() == CLUSTERS
    assert read(root).gene_count == 3


def test_mtx_integer_counts_become_float32(tmp_path):
    counts = np.array([[0, 7, 0, 2], [3, 0, 0, 0], [1, 0, 4, 0]], dtype=np.int64)
    matrix = read_mtx(write_mtx_directory(tmp_path / "counts", values=counts))
    assert matrix.values.dtype == np.float32
    np.testing.assert_array_equal(dense(matrix), counts)


def test_mtx_directory_uncompressed_with_old_genes_file(tmp_path):
    root = tmp_path / "old"
    root.mkdir()
    scipy.io.mmwrite(root / "matrix.mtx", sparse.coo_matrix(VALUES))
    (root / "barcodes.tsv").write_text("".join(f"{b}\n" for b in CELLS))
    (root / "genes.tsv").write_text("".join(f"ENSG{i}\t{g}\n" for i, g in enumerate(GENES)))
    matrix = read_mtx(root)
    np.testing.assert_array_equal(dense(matrix), VALUES)
    assert matrix.gene_names.tolist() == GENES


def test_mtx_with_more_barcodes_than_columns_names_the_counts(tmp_path):
    root = write_mtx_directory(tmp_path / "bad", barcodes=[*CELLS, "EXTRA-1"])
    with pytest.raises(GenesInputError, match=r"'bad'.* 4 cell columns .*5 barcodes"):
        read_mtx(root)


def test_cell_metadata_missing_cells_is_reported(tmp_path):
    root = write_mtx_directory(tmp_path / "m")
    metadata = tmp_path / "cells.tsv"
    metadata.write_text("cell\tcluster\nAAAC-1\tT\nAAAG-1\tB\n")
    with pytest.raises(
        GenesInputError, match=r"describes only 2 of them \(2 missing, first 'AACT-1'\)"
    ):
        read_mtx(root, cell_metadata=metadata)


# --- dense TSV / CSV -----------------------------------------------------------------------


def test_tsv_genes_as_rows_and_csv(tmp_path):
    matrix = read_tsv(write_tsv(tmp_path / "atlas.tsv"))
    assert isinstance(matrix.values, np.ndarray) and matrix.values.dtype == np.float32
    np.testing.assert_array_equal(matrix.values, VALUES)
    assert matrix.gene_names.tolist() == GENES and matrix.cell_ids.tolist() == CELLS
    from_csv = read(write_tsv(tmp_path / "atlas.csv", separator=","))
    np.testing.assert_array_equal(from_csv.values, VALUES)


def test_tsv_with_gene_name_column_and_cell_metadata(tmp_path):
    path = tmp_path / "ebi.tsv"
    lines = ["Gene ID\tGene Name\t" + "\t".join(CELLS)]
    lines += [
        f"ENSG{i}\t{gene}\t" + "\t".join(f"{v:g}" for v in row)
        for i, (gene, row) in enumerate(zip(GENES, VALUES, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")
    cells = pa.table({"cell": CELLS[::-1], "cluster": CLUSTERS[::-1]})
    matrix = read_tsv(path, gene_column_count=2, cell_metadata=cells)
    assert matrix.gene_names.tolist() == ["ENSG0", "ENSG1", "ENSG2"]
    assert matrix.genes.column("Gene Name").to_pylist() == GENES
    assert matrix.cells.column("cluster").to_pylist() == CLUSTERS


def test_non_numeric_value_names_file_column_and_gene(tmp_path):
    path = write_tsv(tmp_path / "bad.tsv")
    path.write_text(path.read_text().replace("\t4\t", "\tfour\t"))
    with pytest.raises(GenesInputError, match=r"bad.tsv column 'AACT-1' .*'four' at gene 'LYZ'"):
        read_tsv(path)


def test_missing_value_in_tsv_is_reported_not_read_as_zero(tmp_path):
    path = write_tsv(tmp_path / "holes.tsv")
    path.write_text(path.read_text().replace("\t3\t", "\tNA\t"))
    with pytest.raises(GenesInputError, match=r"1 missing or NaN .*'AAAC-1' at gene 'MS4A1'"):
        read_tsv(path)


# --- the matrix itself ---------------------------------------------------------------------


def test_matrix_and_metadata_of_different_lengths():
    genes = pa.table({"gene": GENES[:2]})
    cells = pa.table({"cell": CELLS})
    with pytest.raises(GenesInputError, match=r"'lab-x': the matrix has 3 genes but .* 2 rows"):
        ExpressionMatrix(VALUES, genes, cells, dataset="lab-x")


def test_duplicate_cell_ids_and_non_numeric_dtype():
    genes = pa.table({"gene": GENES})
    with pytest.raises(GenesInputError, match="1 duplicate ids"):
        ExpressionMatrix(VALUES, genes, pa.table({"cell": ["a", "b", "c", "a"]}), dataset="d")
    with pytest.raises(GenesInputError, match="must be numeric"):
        ExpressionMatrix(VALUES.astype(str), genes, pa.table({"cell": CELLS}), dataset="d")


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(GenesInputError, match="cannot tell the format"):
        read(tmp_path / "matrix.loom")
