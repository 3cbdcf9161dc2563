"""Gene statistics out of core (`mean_var`, `highly_variable_genes`) equal scanpy's on data
that fits, under every pushdown, and over a collection equal scanpy's on the concatenation;
rank_genes_groups and pseudobulk over a collection equal them on the concatenation."""

from __future__ import annotations

import warnings

import anndata
import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from quarry import genes


@pytest.fixture(scope="module")
def counts_adata(pbmc_adata):
    """Counts behind pbmc68k_reduced's log-normalized raw layer: what seurat_v3 expects."""
    raw = pbmc_adata.raw.to_adata()
    values = raw.X.toarray() if sparse.issparse(raw.X) else raw.X
    x = sparse.csr_matrix(np.rint(np.expm1(values)).astype(np.float32))
    return anndata.AnnData(X=x, obs=pbmc_adata.obs.copy(), var=pd.DataFrame(index=raw.var_names))


@pytest.fixture(scope="module")
def stored_counts(genes_cluster, counts_adata):
    return genes.ingest(genes_cluster, counts_adata, "bio/counts")


@pytest.fixture(scope="module")
def pbmc_twice(genes_cluster, stored_pbmc, pbmc_adata):
    """A collection of pbmc68k_reduced and a copy stored by cells, and their concatenation."""
    genes.ingest(genes_cluster, pbmc_adata, "bio/pbmc_copy", orientation="cells")
    genes.collect(genes_cluster, "bio/twice", [stored_pbmc.dataset, "bio/pbmc_copy"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joined = anndata.concat([pbmc_adata, pbmc_adata], merge="same")
    return "bio/twice", joined


def _scanpy_mean_var(x):
    from scanpy.preprocessing._utils import _get_mean_var

    return _get_mean_var(x)


@pytest.mark.slow  # the module's first statistics: its devices load the compiled kernels
def test_mean_and_variance_per_gene_equal_scanpys(genes_cluster, stored_pbmc, pbmc_adata):
    found = genes.mean_var(genes_cluster, stored_pbmc.dataset, pushdown="always")
    mean, var = _scanpy_mean_var(pbmc_adata.X)
    assert list(found.index) == list(pbmc_adata.var_names)
    np.testing.assert_allclose(found["mean"], mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(found["var"], var, rtol=1e-6)
    assert found.attrs["quarry"]["bytes_shipped"] < found.attrs["quarry"]["bytes_read"] / 20


def test_mean_and_variance_per_group_equal_scanpys_aggregate(
    genes_cluster, stored_pbmc, pbmc_adata
):
    import scanpy as sc

    found = genes.mean_var(genes_cluster, stored_pbmc.dataset, groupby="louvain")
    expected = sc.get.aggregate(pbmc_adata, by="louvain", func=["mean", "var"])
    expected = expected[found.obs_names]
    np.testing.assert_allclose(found.layers["mean"], expected.layers["mean"], rtol=1e-6, atol=1e-9)
    # scanpy's aggregate takes E[x^2] - E[x]^2 from float32 products: 1e-4 is its rounding
    np.testing.assert_allclose(found.layers["var"], expected.layers["var"], rtol=1e-4, atol=1e-6)
    counts = pbmc_adata.obs["louvain"].value_counts()
    assert list(found.obs["n_cells"]) == [counts[g] for g in found.obs_names]


@pytest.mark.parametrize("n_top_genes", [None, 100])
def test_seurat_highly_variable_genes_equal_scanpys(
    genes_cluster, stored_pbmc, pbmc_adata, n_top_genes
):
    import scanpy as sc

    found = genes.highly_variable_genes(genes_cluster, stored_pbmc.dataset, n_top_genes=n_top_genes)
    expected = sc.pp.highly_variable_genes(pbmc_adata, n_top_genes=n_top_genes, inplace=False)
    np.testing.assert_array_equal(found["highly_variable"], expected["highly_variable"])
    np.testing.assert_allclose(found["means"], expected["means"], rtol=1e-6)
    np.testing.assert_allclose(found["dispersions"], expected["dispersions"], rtol=1e-5)
    np.testing.assert_allclose(
        found["dispersions_norm"], expected["dispersions_norm"], rtol=1e-5, atol=1e-6
    )
    assert found["highly_variable"].sum() == (n_top_genes or 186)


def test_seurat_v3_highly_variable_genes_equal_scanpys(genes_cluster, stored_counts, counts_adata):
    pytest.importorskip("skmisc.loess", reason="seurat_v3's loess needs scikit-misc")
    import scanpy as sc

    found = genes.highly_variable_genes(
        genes_cluster, stored_counts.dataset, flavor="seurat_v3", n_top_genes=300
    )
    expected = sc.pp.highly_variable_genes(
        counts_adata, flavor="seurat_v3", n_top_genes=300, inplace=False
    )
    np.testing.assert_array_equal(found["highly_variable"], expected["highly_variable"])
    np.testing.assert_allclose(found["variances_norm"], expected["variances_norm"], rtol=1e-9)
    np.testing.assert_array_equal(
        found["highly_variable_rank"], expected["highly_variable_rank"].to_numpy()
    )


def test_statistics_are_identical_under_every_pushdown(genes_cluster, stored_pbmc):
    frames = {
        mode: genes.highly_variable_genes(genes_cluster, stored_pbmc.dataset, pushdown=mode)
        for mode in ("always", "never", "auto")
    }
    for frame in frames.values():
        pd.testing.assert_frame_equal(frame, frames["always"])
    moments = {
        mode: genes.mean_var(genes_cluster, stored_pbmc.dataset, pushdown=mode)
        for mode in ("always", "never", "auto")
    }
    for frame in moments.values():
        pd.testing.assert_frame_equal(frame, moments["always"])
    assert frames["never"].attrs["quarry"]["slices_executed"] == 0


@pytest.mark.slow
def test_a_collection_counts_as_its_concatenation(genes_cluster, pbmc_twice):
    import scanpy as sc

    name, joined = pbmc_twice
    found = genes.mean_var(genes_cluster, name)
    mean, var = _scanpy_mean_var(joined.X)
    np.testing.assert_allclose(found["mean"], mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(found["var"], var, rtol=1e-6)
    hvg = genes.highly_variable_genes(genes_cluster, name)
    expected = sc.pp.highly_variable_genes(joined, inplace=False)
    np.testing.assert_array_equal(hvg["highly_variable"], expected["highly_variable"])

    ranked = genes.rank_genes_groups(genes_cluster, name, "louvain", method="t-test")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc.tl.rank_genes_groups(joined, "louvain", method="t-test", use_raw=False)
    for group in ("0", "3"):
        ours = ranked[ranked["group"] == group].set_index("names")
        theirs = sc.get.rank_genes_groups_df(joined, group=group).set_index("names")
        shared = theirs.index[theirs["scores"] != 0]
        np.testing.assert_allclose(
            ours.loc[shared, "scores"], theirs.loc[shared, "scores"], rtol=1e-5
        )


@pytest.mark.slow
@pytest.mark.parametrize("reference", ["rest", "2"])
def test_wilcoxon_over_a_collection_ranks_the_concatenation(genes_cluster, pbmc_twice, reference):
    """Each member ships its genes' distinct values per group; the host ranks them as one."""
    import scanpy as sc

    name, joined = pbmc_twice
    ranked = genes.rank_genes_groups(
        genes_cluster, name, "louvain", method="wilcoxon", reference=reference, tie_correct=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc.tl.rank_genes_groups(
            joined, "louvain", method="wilcoxon", reference=reference, tie_correct=True,
            use_raw=False,
        )  # fmt: skip
    for group in ("0", "3", "7"):
        ours = ranked[ranked["group"] == group].set_index("names")
        theirs = sc.get.rank_genes_groups_df(joined, group=group).set_index("names")
        np.testing.assert_allclose(
            ours.loc[theirs.index, "scores"], theirs["scores"], rtol=1e-6, atol=1e-9
        )


def test_pseudobulk_over_a_collection_sums_both(genes_cluster, pbmc_twice, stored_pbmc):
    name, _ = pbmc_twice
    both = genes.pseudobulk(genes_cluster, name, "phase", "louvain")
    one = genes.pseudobulk(genes_cluster, stored_pbmc.dataset, "phase", "louvain")
    assert list(both.obs_names) == list(one.obs_names)
    np.testing.assert_allclose(both.X, 2 * one.X, rtol=1e-9, atol=1e-9)
    assert list(both.obs["n_cells"]) == [2 * n for n in one.obs["n_cells"]]
