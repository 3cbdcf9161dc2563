"""Axis queries (`genes.query`): the cells and genes a filter selects, read on the devices,
equal `adata[obs_mask, var_mask]` whatever the orientation, the pushdown or a collection."""

from __future__ import annotations

import anndata
import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from typer.testing import CliRunner

from quarry import genes
from quarry.genes.cli import app

FIRST_CELLS = 12

# (obs filter in SQL, the same as a pandas mask, var selection, the same as a mask over var)
CASES = {
    "everything": (None, None, None, None),
    "one cluster": ("louvain = '3'", lambda o: o.louvain == "3", None, None),
    "cluster, count and genes by name": (
        "louvain = '3' AND n_genes > 800",
        lambda o: (o.louvain == "3") & (o.n_genes > 800),
        ["NKG7", "CD3D", "HES4"],
        lambda v: v.index.isin(["CD3D", "NKG7", "HES4"]),
    ),
    "nothing": ("n_genes > 100000", lambda o: o.n_genes > 100000, None, None),
    "labels in a list, highly variable genes": (
        "bulk_labels IN ('CD14+ Monocyte', 'Dendritic')",
        lambda o: o.bulk_labels.isin(["CD14+ Monocyte", "Dendritic"]),
        "highly_variable",
        lambda v: v.highly_variable.to_numpy(),
    ),
    "or, and a gene filter": (
        "percent_mito < 0.02 OR phase = 'S'",
        lambda o: (o.percent_mito.astype(np.float64) < 0.02) | (o.phase == "S"),
        "dispersions_norm > 1.5",
        lambda v: v.dispersions_norm > 1.5,
    ),
    "one gene": ("louvain = '1'", lambda o: o.louvain == "1", ["CST3"], None),
    "genes only": (None, None, "means > 0.5", lambda v: v.means > 0.5),
    "two scores": (
        "S_score > 0 AND G2M_score < 0",
        lambda o: (o.S_score > 0) & (o.G2M_score < 0),
        None,
        None,
    ),
    "a range": (
        "n_counts BETWEEN 1000 AND 2000",
        lambda o: (o.n_counts >= 1000) & (o.n_counts <= 2000),
        None,
        None,
    ),
    "no gene": ("louvain = '2'", lambda o: o.louvain == "2", [], None),
    "cells by id": ("first", None, ["CD3D", "CST3"], None),
}


@pytest.fixture(scope="module")
def stored_by_cells(genes_cluster, pbmc_adata):
    """pbmc68k_reduced again, stored by cells: cell filters prune its slices."""
    return genes.ingest(genes_cluster, pbmc_adata, "bio/pbmc_cells", orientation="cells")


@pytest.fixture(scope="module")
def both(stored_pbmc, stored_by_cells):
    return {"genes": stored_pbmc.dataset, "cells": stored_by_cells.dataset}


def _expected(adata, case):
    obs_sql, obs_mask, var, var_mask = CASES[case]
    cells = np.ones(adata.n_obs, bool) if obs_mask is None else np.asarray(obs_mask(adata.obs))
    if obs_sql == "first":
        cells = np.arange(adata.n_obs) < FIRST_CELLS
    if var is not None and not isinstance(var, str) and var_mask is None:
        var_mask = lambda v: v.index.isin(var)  # noqa: E731
    kept = np.ones(adata.n_vars, bool) if var_mask is None else np.asarray(var_mask(adata.var))
    return adata[cells][:, kept]


def _obs_filter(adata, case):
    obs_sql = CASES[case][0]
    if obs_sql == "first":
        ids = ", ".join(f"'{c}'" for c in adata.obs_names[:FIRST_CELLS])
        return f"cell IN ({ids})"
    return obs_sql


def assert_same(got, expected):
    assert got.shape == expected.shape
    dense = expected.X.toarray() if hasattr(expected.X, "toarray") else np.asarray(expected.X)
    np.testing.assert_array_equal(got.X.toarray(), dense)
    assert got.X.dtype == dense.dtype
    pd.testing.assert_frame_equal(got.obs, pd.DataFrame(expected.obs), check_names=False)
    pd.testing.assert_frame_equal(got.var, pd.DataFrame(expected.var), check_names=False)


@pytest.mark.slow
@pytest.mark.parametrize("orientation", ["genes", "cells"])
def test_a_dozen_filters_equal_the_anndata_subset(genes_cluster, both, pbmc_adata, orientation):
    for case in CASES:
        q = genes.query(
            genes_cluster,
            both[orientation],
            _obs_filter(pbmc_adata, case),
            CASES[case][2],
        )
        expected = _expected(pbmc_adata, case)
        assert_same(q.to_anndata(), expected)
        report = q.report
        assert report.cells_selected == expected.n_obs and report.genes_selected == expected.n_vars
        if expected.n_obs == 0 or expected.n_vars == 0:
            assert report.bytes_read == 0 and report.bytes_shipped == 0, case


def test_cell_filters_prune_slices_of_a_matrix_stored_by_cells(
    genes_cluster, stored_by_cells, pbmc_adata
):
    obs = _obs_filter(pbmc_adata, "cells by id")
    q = genes.query(genes_cluster, stored_by_cells.dataset, obs, ["CD3D", "CST3"])
    adata = q.to_anndata()
    assert adata.n_obs == FIRST_CELLS
    report = q.report
    assert report.slices_pruned > report.slices_total / 2
    assert report.bytes_read * 4 < report.bytes_matrix
    assert report.bytes_shipped < report.bytes_read / 10  # only two genes' values
    assert report.to_json()["matrices"][0]["slices_pruned"] == report.slices_pruned


@pytest.mark.slow
def test_a_run_of_cells_is_read_from_the_slice_holding_it(cluster):
    """A matrix travels to its partitions a slice at a time (ingest's ``contiguous_slices``),
    so each slice holds one run of cells: 1% of the cells, in a run, are read from the slice
    that holds them (two if they straddle), not from a slice of every partition (4 MiB slices
    of 1 MiB groups dealt round-robin each spanned four groups' worth of every partition)."""
    cells, gene_count = 20_000, 2_000  # about 16 MB stored: several 4 MiB slices a partition
    x = sparse.random(cells, gene_count, density=0.05, format="csr", dtype=np.float32, rng=7)
    adata = anndata.AnnData(
        X=x,
        obs=pd.DataFrame(index=[f"c{i}" for i in range(cells)]),
        var=pd.DataFrame(index=[f"g{i}" for i in range(gene_count)]),
    )
    genes.ingest(cluster, adata, "bio/runs", orientation="cells")
    first, count = cells // 2, cells // 100
    ids = ", ".join(f"'c{i}'" for i in range(first, first + count))
    q = genes.query(cluster, "bio/runs", f"cell IN ({ids})", ["g1", "g2"])
    got = q.to_anndata()
    np.testing.assert_array_equal(got.X.toarray(), x[first : first + count][:, [1, 2]].toarray())
    report = q.report
    assert report.slices_total >= 5
    assert report.slices_total - report.slices_pruned <= 2
    genes.drop(cluster, "bio/runs")


def test_gene_selections_prune_slices_of_a_matrix_stored_by_genes(genes_cluster, stored_pbmc):
    q = genes.query(genes_cluster, stored_pbmc.dataset, "louvain = '3'", ["CD3D", "CST3"])
    q.to_anndata()
    assert q.report.slices_pruned > q.report.slices_total / 2
    assert q.report.bytes_read * 4 < q.report.bytes_matrix


@pytest.mark.parametrize("orientation", ["genes", "cells"])
def test_answers_are_identical_under_every_pushdown(genes_cluster, both, pbmc_adata, orientation):
    dataset = both[orientation]
    obs = "louvain IN ('1', '3') AND n_genes > 500"
    answers = {
        mode: genes.query(genes_cluster, dataset, obs, "means > 0.2", pushdown=mode)
        for mode in ("always", "never", "auto")
    }
    entry = genes_cluster.entry(dataset)
    forced = {dataset: {p.partition: [(0, 2)] for p in entry.partitions}}
    answers["forced"] = genes.query(
        genes_cluster, dataset, obs, "means > 0.2", pushdown="always", push_back=forced
    )
    adatas = {mode: q.to_anndata() for mode, q in answers.items()}
    for adata in adatas.values():
        assert_same(adata, adatas["always"])
        np.testing.assert_array_equal(adata.X.data, adatas["always"].X.data)
    assert answers["never"].report.slices_executed == 0
    assert answers["forced"].report.slices_pushed_back > 0
    assert answers["always"].report.bytes_shipped < answers["never"].report.bytes_shipped


@pytest.mark.parametrize("orientation", ["genes", "cells"])
def test_streamed_chunks_concatenate_to_the_whole(genes_cluster, both, orientation):
    q = genes.query(genes_cluster, both[orientation], "louvain IN ('0', '1', '2')", "means > 0.1")
    whole = q.to_anndata()
    chunks = list(q.batches(values_max=2_000))
    assert len(chunks) > 2
    axis = {"genes": "var", "cells": "obs"}[orientation]
    assert all(chunk.uns["quarry_axis"] == axis for chunk in chunks)
    joined = anndata.concat(chunks, axis=0 if axis == "obs" else 1, merge="same")
    joined = joined[whole.obs_names, whole.var_names]
    np.testing.assert_array_equal(joined.X.toarray(), whole.X.toarray())
    pd.testing.assert_frame_equal(joined.obs, whole.obs, check_dtype=False)


@pytest.mark.filterwarnings("ignore:Observation names are not unique")
def test_a_collection_answers_as_the_concatenation(genes_cluster, both, pbmc_adata):
    genes.collect(genes_cluster, "bio/atlas", [both["genes"], both["cells"]])
    try:
        for case in ("cluster, count and genes by name", "nothing", "or, and a gene filter"):
            obs = _obs_filter(pbmc_adata, case)
            q = genes.query(genes_cluster, "bio/atlas", obs, CASES[case][2])
            got = q.to_anndata()
            part = _expected(pbmc_adata, case)
            expected = anndata.concat([part, part], merge="same")
            expected.obs.insert(
                0, "dataset", [both["genes"]] * part.n_obs + [both["cells"]] * part.n_obs
            )
            np.testing.assert_array_equal(got.X.toarray(), np.asarray(expected.X))
            assert list(got.obs_names) == list(expected.obs_names)
            assert list(got.obs["dataset"]) == list(expected.obs["dataset"])
            pd.testing.assert_frame_equal(
                got.obs.drop(columns="dataset"),
                expected.obs.drop(columns="dataset"),
                check_names=False,
                check_categorical=False,
            )
            assert q.report.datasets == [both["genes"], both["cells"]]
    finally:
        genes.drop(genes_cluster, "bio/atlas")


def test_a_collection_needs_one_gene_space(genes_cluster, both, pbmc_adata):
    fewer = pbmc_adata[:, :700].copy()
    genes.ingest(genes_cluster, fewer, "bio/fewer")
    try:
        with pytest.raises(genes.GenesInputError, match="share one gene space"):
            genes.collect(genes_cluster, "bio/bad", [both["genes"], "bio/fewer"])
    finally:
        genes.drop(genes_cluster, "bio/fewer")


def test_errors_name_the_filter_and_the_columns(genes_cluster, stored_pbmc):
    with pytest.raises(genes.GenesInputError, match="the obs filter 'no_such > 1' failed"):
        genes.query(genes_cluster, stored_pbmc.dataset, "no_such > 1")
    with pytest.raises(genes.GenesInputError, match="has no gene 'NOPE'"):
        genes.query(genes_cluster, stored_pbmc.dataset, var=["CD3D", "NOPE"])
    with pytest.raises(genes.GenesInputError, match="not metadata columns"):
        genes.query(genes_cluster, stored_pbmc.dataset, columns=["louvain", "nope"])


def test_columns_keeps_the_asked_cell_metadata(genes_cluster, stored_pbmc, pbmc_adata):
    q = genes.query(genes_cluster, stored_pbmc.dataset, "louvain = '4'", columns=["n_genes"])
    assert list(q.obs.columns) == ["n_genes"]
    expected = pbmc_adata.obs.loc[pbmc_adata.obs.louvain == "4", ["n_genes"]]
    pd.testing.assert_frame_equal(q.obs, expected, check_names=False)


def test_quarry_genes_get_writes_an_h5ad(genes_cluster, stored_by_cells, pbmc_adata, tmp_path):
    output = tmp_path / "t_cells.h5ad"
    where = ["--cluster", str(genes_cluster.cluster_file)]
    command = ["get", stored_by_cells.dataset, "--obs", "louvain = '3'", "--genes", "CD3D,NKG7"]
    result = CliRunner().invoke(app, [*command, "--output", str(output), *where])
    assert result.exit_code == 0, result.output
    assert "cells x 2 genes" in result.output and "slices pruned" in result.output
    written = anndata.read_h5ad(output)
    expected = pbmc_adata[pbmc_adata.obs.louvain == "3"][:, ["CD3D", "NKG7"]]
    np.testing.assert_array_equal(written.X.toarray(), expected.X)
    assert list(written.obs_names) == list(expected.obs_names)


@pytest.fixture(scope="module")
def ordered_by_cells(genes_cluster, pbmc_adata):
    """pbmc68k_reduced stored by cells in the order of two of its labels, in small blocks (a
    slice here is about twenty cells; blocks of 8 KiB hold two or three)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("quarry.genes.datasets.MATRIX_BLOCK_BYTES", 8 << 10)
        stored = genes.ingest(
            genes_cluster,
            pbmc_adata,
            "bio/pbmc_ordered",
            orientation="cells",
            order_by=["louvain", "phase"],
        )
    yield stored
    genes.drop(genes_cluster, stored.dataset)


@pytest.mark.slow
def test_a_matrix_ordered_by_cell_labels_answers_in_the_source_order(
    genes_cluster, ordered_by_cells, pbmc_adata
):
    """Stored in louvain order, read in blocks: the answer is still ``adata[obs, var]``, cells
    in the AnnData's own order, whatever ran where."""
    for case in CASES:
        for mode in ("always", "never", "auto"):
            q = genes.query(
                genes_cluster,
                ordered_by_cells.dataset,
                _obs_filter(pbmc_adata, case),
                CASES[case][2],
                pushdown=mode,
            )
            assert_same(q.to_anndata(), _expected(pbmc_adata, case))
    q = genes.query(genes_cluster, ordered_by_cells.dataset, "phase = 'S'", "means > 0.1")
    assert q.source == ordered_by_cells.dataset
    whole = q.to_anndata()
    assert list(whole.obs_names) == list(pbmc_adata.obs_names[pbmc_adata.obs.phase == "S"])
    chunks = list(q.batches(values_max=2_000))
    assert len(chunks) > 2
    for chunk in chunks:  # each chunk's cells in the source's order too
        assert list(chunk.obs_names) == [c for c in whole.obs_names if c in set(chunk.obs_names)]
    joined = anndata.concat(chunks, axis=0, merge="same")[whole.obs_names]
    np.testing.assert_array_equal(joined.X.toarray(), whole.X.toarray())
    assert "source_position" not in q.obs.columns


def test_order_by_names_cell_metadata_columns(genes_cluster, pbmc_adata, tmp_path):
    with pytest.raises(genes.GenesInputError, match="order_by names \\['tissue'\\]"):
        genes.ingest(genes_cluster, pbmc_adata, "bio/bad_order", order_by=["tissue"])
    path = tmp_path / "pbmc.h5ad"
    pbmc_adata.write_h5ad(path)
    where = ["--cluster", str(genes_cluster.cluster_file)]
    command = ["ingest", str(path), "--dataset", "bio/cli_ordered", "--orientation", "cells"]
    result = CliRunner().invoke(app, [*command, "--order-by", "phase, louvain", *where])
    assert result.exit_code == 0, result.output
    genes_cluster.refresh()
    try:
        q = genes.query(genes_cluster, "bio/cli_ordered", "louvain = '5'", ["CD3D"])
        expected = pbmc_adata[pbmc_adata.obs.louvain == "5"][:, ["CD3D"]]
        np.testing.assert_array_equal(q.to_anndata().X.toarray(), expected.X)
        assert list(q.obs.index) == list(expected.obs_names)
    finally:
        genes.drop(genes_cluster, "bio/cli_ordered")


@pytest.mark.slow
def test_ordered_cells_in_blocks_cut_the_bytes_a_narrow_query_reads(cluster):
    """A donor's T cells are one in ten of the donor's cells: stored in the source's order,
    every block of the donor's run holds some; ordered by donor and cell type they are one run,
    read from the blocks that hold it. Same answer, a fraction of the bytes."""
    cells, gene_count = 20_000, 2_000
    x = sparse.random(cells, gene_count, density=0.05, format="csr", dtype=np.float32, rng=11)
    obs = pd.DataFrame(
        {
            "donor": pd.Categorical([f"D{i // 2_000:02d}" for i in range(cells)]),
            "cell_type": pd.Categorical([f"type{i % 10}" for i in range(cells)]),
        },
        index=[f"c{i}" for i in range(cells)],
    )
    adata = anndata.AnnData(
        X=x, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(gene_count)])
    )
    genes.ingest(cluster, adata, "bio/unordered", orientation="cells")
    genes.ingest(
        cluster, adata, "bio/ordered", orientation="cells", order_by=["donor", "cell_type"]
    )
    where, names = "donor = 'D04' AND cell_type = 'type3'", ["g1", "g5", "g9"]
    mask = ((obs.donor == "D04") & (obs.cell_type == "type3")).to_numpy()
    try:
        reports = {}
        for name in ("unordered", "ordered"):
            q = genes.query(cluster, f"bio/{name}", where, names)
            got = q.to_anndata()
            np.testing.assert_array_equal(got.X.toarray(), x[mask][:, [1, 5, 9]].toarray())
            assert list(got.obs_names) == list(obs.index[mask])
            reports[name] = q.report
        slice_bytes = reports["ordered"].bytes_matrix / reports["ordered"].slices_total
        assert reports["ordered"].bytes_read * 3 < reports["unordered"].bytes_read
        assert reports["ordered"].bytes_read < slice_bytes  # blocks: less than a slice
        assert reports["ordered"].bytes_read >= x[mask].nnz * 8  # what its cells hold, read
    finally:
        genes.drop(cluster, "bio/unordered")
        genes.drop(cluster, "bio/ordered")
