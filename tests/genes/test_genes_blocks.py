"""A matrix stored from blocks of genes (`GeneBlocks`): the same dataset as from the whole
matrix, checked block by block, atomic, and in memory bounded by a block, not the matrix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy import sparse

import quarry
from quarry import genes
from quarry.genes import ExpressionMatrix, GeneBlocks, GenesInputError
from tests.genes.test_genes_cluster import mixed_matrix

SRC = Path(__file__).resolve().parents[2] / "src"


def blocks_of(matrix: ExpressionMatrix, sizes: list[int], **options) -> GeneBlocks:
    """The matrix's genes cut into blocks of the given sizes, in several encodings: CSR, a
    dense array, COO, and an empty block, as readers of files hand them over."""
    assert sum(sizes) == matrix.gene_count

    def blocks():
        start = 0
        for index, size in enumerate(sizes):
            block = matrix.values[start : start + size]
            yield [block, block.toarray(), block.tocoo()][index % 3]
            if index == 1:
                yield sparse.csr_matrix((0, matrix.cell_count), dtype=block.dtype)
            start += size

    return GeneBlocks(blocks(), matrix.genes, matrix.cells, matrix.metadata, "mixed", **options)


def stored_rows(cluster, dataset: str) -> pa.Table:
    return cluster.scan(dataset).read_all().sort_by("gene")


def names_on(cluster, prefix: str) -> set[str]:
    return {e.dataset for e in cluster.datasets() if e.dataset.startswith(prefix)}


@pytest.mark.slow
def test_blocks_store_the_rows_and_ranking_of_the_whole_matrix(genes_cluster):
    matrix = mixed_matrix(seed=7, genes=150, cells=120)
    whole = genes.ingest(genes_cluster, matrix, "lab/whole", metadata={"lab": "x"})
    blocks = blocks_of(matrix, [40, 1, 64, 45], nonzero=matrix.nonzero_count)
    stored = genes.ingest(genes_cluster, blocks, "lab/blocks", metadata={"lab": "x"})
    assert stored_rows(genes_cluster, "lab/blocks").equals(stored_rows(genes_cluster, "lab/whole"))
    assert stored.entry.schema.equals(whole.entry.schema, check_metadata=True)
    ours, theirs = dict(stored.description), dict(whole.description)
    for name in ("cells_dataset", "genes_dataset"):
        assert ours.pop(name) == theirs.pop(name).replace("whole", "blocks")
    assert ours == theirs
    assert stored.metadata == whole.metadata
    for method in ("t-test", "wilcoxon"):
        expected = genes.rank_genes_groups(genes_cluster, "lab/whole", "kind", method=method)
        got = genes.rank_genes_groups(genes_cluster, "lab/blocks", "kind", method=method)
        pd.testing.assert_frame_equal(got, expected)
    assert list(stored.cell_ids) == list(matrix.cell_ids)
    assert list(stored.gene_names) == list(matrix.gene_names)


def test_cell_blocks_store_the_rows_of_the_whole_matrix_by_cells(genes_cluster):
    matrix = mixed_matrix(seed=8, genes=60, cells=140)
    genes.ingest(genes_cluster, matrix, "lab/whole_cells", orientation="cells")
    by_cell = matrix.values.T.tocsr()
    blocks = genes.CellBlocks(
        (by_cell[start : start + 50] for start in range(0, 140, 50)),
        matrix.genes,
        matrix.cells,
        matrix.metadata,
        "mixed",
    )
    genes.ingest(genes_cluster, blocks, "lab/cell_blocks", orientation="cells")
    whole = genes_cluster.scan("lab/whole_cells").read_all().sort_by("cell")
    assert genes_cluster.scan("lab/cell_blocks").read_all().sort_by("cell").equals(whole)
    query = genes.query(genes_cluster, "lab/cell_blocks", var=list(matrix.gene_names[:5]))
    np.testing.assert_array_equal(query.to_anndata().X.toarray(), matrix.values[:5].T.toarray())
    wrong = genes.CellBlocks(iter([by_cell]), matrix.genes, matrix.cells, dataset="mixed")
    with pytest.raises(GenesInputError, match="blocks of cells is stored by cells"):
        genes.ingest(genes_cluster, wrong, "lab/wrong")


def test_unknown_nonzero_count_and_integer_counts(genes_cluster):
    matrix = mixed_matrix(seed=8, genes=30, cells=40)
    counts = sparse.csr_matrix(np.rint(matrix.values.toarray() * 3).astype(np.int32))
    source = GeneBlocks((counts[i : i + 7] for i in range(0, 30, 7)), matrix.genes, matrix.cells)
    stored = genes.ingest(genes_cluster, source, "lab/counts")
    assert stored.description["nonzero"] is None
    assert stored.description["value_type"] == "float"
    rows = stored_rows(genes_cluster, "lab/counts")
    assert rows.num_rows == 30
    assert sum(len(v) for v in rows.column("values").to_pylist()) >= counts.count_nonzero()


def bad_blocks(matrix: ExpressionMatrix, fault: str) -> GeneBlocks:
    """A matrix in 5 blocks of 20 genes, one of them (the 4th, after some are stored) wrong."""
    values = matrix.values
    cut = [values[i : i + 20] for i in range(0, 100, 20)]
    nonzero = None
    if fault == "width":
        cut[3] = cut[3][:, :-1]
    elif fault == "nan":
        cut[3] = cut[3].toarray()
        cut[3][4, 6] = np.nan
    elif fault == "dtype":
        cut[3] = cut[3].astype(np.float64)
    elif fault == "too_few":
        cut = cut[:4]
    elif fault == "too_many":
        cut.append(values[:3])
    elif fault == "nonzero":
        nonzero = values.count_nonzero() + 1
    elif fault == "first":
        cut[0] = cut[0][:, :-2]
    return GeneBlocks(iter(cut), matrix.genes, matrix.cells, dataset="bad", nonzero=nonzero)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("width", r"'bad': block 3 \(genes 60 to 79\) has 89 columns but the matrix has 90 cells"),
        ("nan", r"block 3 \(genes 60 to 79\) has 1 NaN .* first at gene 'g64', cell 'c6'"),
        ("dtype", r"block 3 .* holds float64 values but the first block float32"),
        ("too_few", r"the 4 blocks hold 80 genes but genes lists 100"),
        ("too_many", r"block 5 \(genes 100 to 102\) goes past the last gene: genes lists 100"),
        ("nonzero", r"non-zero values but nonzero says"),
        ("first", r"block 0 \(genes 0 to 19\) has 88 columns"),
    ],
)
def test_a_wrong_block_names_itself_and_leaves_nothing_stored(genes_cluster, fault, message):
    matrix = mixed_matrix(seed=9, genes=100, cells=90)
    with pytest.raises(GenesInputError, match=message):
        genes.ingest(genes_cluster, bad_blocks(matrix, fault), f"lab/bad_{fault}")
    assert not names_on(genes_cluster, f"lab/bad_{fault}")
    # the name is free again, and the same matrix whole is stored under it
    genes.ingest(genes_cluster, matrix, f"lab/bad_{fault}")
    assert names_on(genes_cluster, f"lab/bad_{fault}") == {
        f"lab/bad_{fault}" + suffix for suffix in ("", "__cells", "__genes")
    }


def test_blocks_are_read_once_and_stored_by_genes_only(genes_cluster):
    matrix = mixed_matrix(seed=10, genes=20, cells=30)
    source = GeneBlocks(iter([matrix.values]), matrix.genes, matrix.cells, dataset="once")
    with pytest.raises(GenesInputError, match="stored by genes"):
        genes.ingest(genes_cluster, source, "lab/pivoted", orientation="cells")
    genes.ingest(genes_cluster, source, "lab/once")
    with pytest.raises(GenesInputError, match="no blocks to read .* read once"):
        genes.ingest(genes_cluster, source, "lab/twice")
    assert not names_on(genes_cluster, "lab/twice") | names_on(genes_cluster, "lab/pivoted")


def test_a_failing_reader_leaves_nothing_stored(genes_cluster):
    matrix = mixed_matrix(seed=11, genes=60, cells=50)

    def reader():
        yield matrix.values[:30]
        raise OSError("the disk went away")

    source = GeneBlocks(reader(), matrix.genes, matrix.cells, dataset="flaky")
    with pytest.raises(quarry.errors.QuarryError, match="the disk went away"):
        genes.ingest(genes_cluster, source, "lab/flaky")
    assert not names_on(genes_cluster, "lab/flaky")


@pytest.mark.slow
def test_blocks_may_take_longer_than_a_call_to_devices(genes_cluster):
    """A put stream lasts as long as its blocks take to make or read, past any call's
    deadline (here cut to 1 s, the ingest taking about 3 s)."""
    matrix = mixed_matrix(seed=14, genes=60, cells=30_000)  # rows of ~100 KB: streams open early

    def slow():
        for start in range(0, 60, 5):
            time.sleep(0.25)
            yield matrix.values[start : start + 5]

    clients = list(genes_cluster.devices.values())
    deadlines = [client.timeout_s for client in clients]
    try:
        for client in clients:
            client.timeout_s = 1.0
        source = GeneBlocks(slow(), matrix.genes, matrix.cells, dataset="slow")
        genes.ingest(genes_cluster, source, "lab/slow")
    finally:
        for client, deadline in zip(clients, deadlines, strict=True):
            client.timeout_s = deadline
    assert stored_rows(genes_cluster, "lab/slow").num_rows == 60


# ---- .h5ad files read in blocks ---------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["csr", "csc", "dense"])
def test_h5ad_blocks_read_the_matrix_read_h5ad_reads(tmp_path, encoding):
    import anndata

    matrix = mixed_matrix(seed=12, genes=70, cells=80)
    x = matrix.values.T  # cells x genes, as AnnData holds it
    x = {"csr": x.tocsr(), "csc": x.tocsc(), "dense": x.toarray()}[encoding]
    obs = matrix.cells.to_pandas().set_index("cell")
    adata = anndata.AnnData(X=x, obs=obs, var=pd.DataFrame(index=matrix.gene_names))
    adata.uns["log1p"] = {"base": 2.0}
    path = tmp_path / f"{encoding}.h5ad"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adata.write_h5ad(path)
    # blocks of about 2 KB: many blocks, and for CSR many passes over the file
    source = genes.read_h5ad_blocks(path, block_bytes=2048)
    expected = genes.read_h5ad(path)
    assert source.genes.equals(expected.genes) and source.cells.equals(expected.cells)
    assert source.metadata == expected.metadata
    blocks = list(source.blocks)
    assert len(blocks) > 5
    got = sparse.vstack([sparse.csr_matrix(b) for b in blocks]).toarray()
    np.testing.assert_array_equal(got, sparse.csr_matrix(expected.values).toarray())


def test_h5ad_blocks_store_the_same_ranking(genes_cluster, tmp_path):
    import anndata

    matrix = mixed_matrix(seed=13, genes=60, cells=70)
    obs = matrix.cells.to_pandas().set_index("cell")
    adata = anndata.AnnData(X=matrix.values.T.tocsr(), obs=obs)
    adata.var_names = matrix.gene_names
    path = tmp_path / "atlas.h5ad"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adata.write_h5ad(path)
    genes.ingest(genes_cluster, path, "lab/atlas_whole")
    genes.ingest(genes_cluster, genes.read_h5ad_blocks(path, block_bytes=4096), "lab/atlas")
    pd.testing.assert_frame_equal(
        genes.rank_genes_groups(genes_cluster, "lab/atlas", "kind"),
        genes.rank_genes_groups(genes_cluster, "lab/atlas_whole", "kind"),
    )


# ---- memory -----------------------------------------------------------------------------------

# In a process of its own, so its peak resident memory is the ingest's: 200 blocks of 50 genes x
# 10,000 cells at 25% (about 200 MB in CSR in all, 1 MB a block) are made on the fly and stored.
STREAM_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np, pyarrow as pa
    from scipy import sparse
    import quarry
    from quarry import genes

    GENES, CELLS, PER_BLOCK, DENSITY = int(sys.argv[2]), 10_000, 50, 0.25
    rng = np.random.default_rng(3)

    def blocks(count):
        for _ in range(count):
            yield sparse.random(
                PER_BLOCK, CELLS, density=DENSITY, format="csr", dtype=np.float32, rng=rng
            )

    gene_table = pa.table({"gene": [f"g{i}" for i in range(GENES)]})
    cell_table = pa.table({"cell": [f"c{i}" for i in range(CELLS)]})
    cluster = quarry.connect(sys.argv[1])
    # two blocks first: every code path runs once, and what one block costs is paid
    warm = genes.GeneBlocks(blocks(2), gene_table.slice(0, 2 * PER_BLOCK), cell_table)
    genes.ingest(cluster, warm, "mem/warm")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    source = genes.GeneBlocks(blocks(GENES // PER_BLOCK), gene_table, cell_table)
    stored = genes.ingest(cluster, source, "mem/big")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"grew": after - before, "stored": stored.entry.bytes_stored}))
    """
)


@pytest.mark.slow
def test_memory_is_bounded_by_a_block_not_by_the_matrix():
    """The ingesting process's peak resident memory grows by far less than the matrix while
    it stores 200 blocks, after storing two (which pays for one block in flight)."""
    with quarry.local(devices=2) as cluster:
        run = subprocess.run(
            [sys.executable, "-c", STREAM_SCRIPT, str(cluster.cluster_file), "10000"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        assert run.returncode == 0, run.stderr
        measured = json.loads(run.stdout.strip().splitlines()[-1])
    matrix_bytes = 10_000 * 10_000 * 0.25 * 8
    assert measured["stored"] > 0.9 * matrix_bytes
    assert measured["grew"] < matrix_bytes / 10, measured
