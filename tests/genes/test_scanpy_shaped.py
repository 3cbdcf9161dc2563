"""scanpy's rank_genes_groups, computed on the devices: every method and option against scanpy
itself on pbmc68k_reduced and on a sparse synthetic matrix, and the result read back by
scanpy's own ``rank_genes_groups_df`` and plot from the AnnData quarry writes."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy import sparse, stats

from quarry import genes
from quarry.genes import kernels
from quarry.genes.matrix import ExpressionMatrix

RTOL = 1e-6  # scanpy stores scores as float32


def scanpy_ranking(adata, **options) -> dict:
    import scanpy as sc

    adata = adata.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc.tl.rank_genes_groups(adata, "louvain", use_raw=False, **options)
    return adata.uns["rank_genes_groups"]


def assert_like_scanpy(ours: pd.DataFrame, theirs: dict, columns=("scores", "pvals")) -> None:
    """Equal to scanpy's figures, except where scanpy's float32 one-pass variance broke down
    and it reports a score of 0 (docs/genes.md; those equal scipy's in test_genes_pbmc)."""
    for group, ranked in ours.groupby("group", observed=True):
        names = np.asarray(theirs["names"][group], dtype=object)
        mine = ranked.set_index("names").loc[names]
        broken = (np.asarray(theirs["scores"][group]) == 0) & (mine["scores"].to_numpy() != 0)
        assert broken.mean() < 0.15, group  # 371 of 8,415 pairs with the t-test
        mine = mine[~broken]
        for column in columns:
            expected = np.asarray(theirs[column][group], dtype=np.float64)[~broken]
            got = mine[column].to_numpy()
            if column == "pvals":  # a relative error e in z moves p by about z^2 e
                scores = np.asarray(theirs["scores"][group], dtype=np.float64)[~broken]
                allowed = RTOL * (1 + scores**2)
                assert (np.abs(got - expected) <= allowed * np.abs(expected) + 1e-300).all()
            else:
                np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-6, err_msg=group)


@pytest.mark.slow
@pytest.mark.parametrize("tie_correct", [False, True])
def test_wilcoxon_against_the_rest_equals_scanpy(
    genes_cluster, stored_pbmc, pbmc_adata, tie_correct
):
    ours = genes.rank_genes_groups(
        genes_cluster, "bio/pbmc", "louvain", method="wilcoxon", tie_correct=tie_correct
    )
    theirs = scanpy_ranking(pbmc_adata, method="wilcoxon", tie_correct=tie_correct)
    assert_like_scanpy(ours, theirs, ("scores", "pvals", "logfoldchanges"))


def test_wilcoxon_against_one_group_ranks_the_pair_only(genes_cluster, stored_pbmc, pbmc_adata):
    ours = genes.rank_genes_groups(
        genes_cluster, "bio/pbmc", "louvain", groups=["1", "4"], reference="2",
        method="wilcoxon",
    )  # fmt: skip
    theirs = scanpy_ranking(pbmc_adata, method="wilcoxon", groups=["1", "4"], reference="2")
    assert_like_scanpy(ours, theirs)


@pytest.mark.parametrize("method", ["t-test", "t-test_overestim_var", "wilcoxon"])
def test_every_method_one_group_against_another_equals_scanpy(
    genes_cluster, stored_pbmc, pbmc_adata, method
):
    ours = genes.rank_genes_groups(
        genes_cluster, "bio/pbmc", "louvain", groups="all", reference="2", method=method
    )
    theirs = scanpy_ranking(pbmc_adata, method=method, reference="2")
    assert "2" not in set(ours["group"])
    if method == "wilcoxon":  # ranks: no float32 moments on scanpy's side
        assert_like_scanpy(ours, theirs, ("scores", "pvals", "logfoldchanges"))
        return
    # scanpy's t-tests take float32 one-pass variances: where those lose digits (two small
    # groups), quarry equals the same test in float64 instead (scipy), as for the rest
    values = np.asarray(pbmc_adata.X, dtype=np.float64)
    labels = pbmc_adata.obs["louvain"].astype(str).to_numpy()
    reference = values[labels == "2"]
    for group, ranked in ours.groupby("group", observed=True):
        names = np.asarray(theirs["names"][group], dtype=object)
        mine = ranked.set_index("names").loc[names, "scores"].to_numpy()
        scanpy_scores = np.asarray(theirs["scores"][group], dtype=np.float64)
        inside = values[labels == group][:, pbmc_adata.var_names.get_indexer(names)]
        outside = reference[:, pbmc_adata.var_names.get_indexer(names)]
        nobs_rest = len(inside) if method == "t-test_overestim_var" else len(outside)
        exact, _ = stats.ttest_ind_from_stats(
            inside.mean(0), inside.std(0, ddof=1), len(inside),
            outside.mean(0), outside.std(0, ddof=1), nobs_rest, equal_var=False,
        )  # fmt: skip
        close_to_scanpy = np.abs(mine - scanpy_scores) <= RTOL * np.abs(scanpy_scores) + 1e-6
        close_to_exact = np.abs(mine - exact) <= 1e-9 * np.abs(exact)
        assert (close_to_scanpy | close_to_exact).all(), group
        assert close_to_scanpy.mean() > 0.9, group


def test_t_test_overestim_var_and_bonferroni_equal_scanpy(genes_cluster, stored_pbmc, pbmc_adata):
    ours = genes.rank_genes_groups(
        genes_cluster, "bio/pbmc", "louvain", method="t-test_overestim_var",
        corr_method="bonferroni",
    )  # fmt: skip
    theirs = scanpy_ranking(pbmc_adata, method="t-test_overestim_var", corr_method="bonferroni")
    assert_like_scanpy(ours, theirs, ("scores", "pvals", "pvals_adj"))


def test_pts_equal_scanpy_and_scanpy_reads_the_result(genes_cluster, stored_pbmc, pbmc_adata):
    import scanpy as sc

    ours = genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", pts=True)
    theirs = scanpy_ranking(pbmc_adata, method="t-test", pts=True)
    for group in theirs["pts"].columns:
        mine = ours[ours["group"] == group].set_index("names")
        for column, name in (("pct_nz_group", "pts"), ("pct_nz_reference", "pts_rest")):
            expected = theirs[name][group]
            np.testing.assert_allclose(mine.loc[expected.index, column], expected, rtol=1e-12)
    adata = genes.to_anndata(ours, pbmc_adata.var_names)
    back = sc.get.rank_genes_groups_df(adata, group=None)
    assert len(back) == len(ours)
    first = back[back["group"] == "0"].reset_index(drop=True)
    mine = ours[ours["group"] == "0"].reset_index(drop=True)
    assert list(first["names"]) == list(mine["names"])
    np.testing.assert_allclose(first["pvals"], mine["pvals"])
    np.testing.assert_allclose(first["pct_nz_group"], mine["pct_nz_group"])
    import matplotlib

    matplotlib.use("Agg")
    sc.pl.rank_genes_groups(adata, n_genes=5, show=False)


def test_filter_keeps_the_genes_scanpy_keeps(genes_cluster, stored_pbmc, pbmc_adata):
    import scanpy as sc

    ours = genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", pts=True)
    kept = genes.filter_ranked(ours, min_in_group_fraction=0.3, min_fold_change=0.5)
    adata = pbmc_adata.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc.tl.rank_genes_groups(adata, "louvain", method="t-test", use_raw=False, pts=True)
        sc.tl.filter_rank_genes_groups(
            adata, min_in_group_fraction=0.3, min_fold_change=0.5, use_raw=False
        )
    names = pd.DataFrame(adata.uns["rank_genes_groups_filtered"]["names"])
    for group in names.columns:
        theirs = {n for n in names[group] if isinstance(n, str)}
        assert set(kept.loc[kept["group"] == group, "names"]) == theirs, group


def _sparse_matrix() -> tuple[ExpressionMatrix, object]:
    """Counts with many zeros and ties, 400 genes x 900 cells, four clusters."""
    import anndata

    rng = np.random.default_rng(11)
    values = sparse.random(400, 900, density=0.15, format="csr", random_state=3,
                           data_rvs=lambda k: np.log1p(rng.poisson(2.0, k) + 1.0))  # fmt: skip
    values = values.astype(np.float32)
    clusters = rng.integers(0, 4, 900).astype(str)
    cells = pa.table({"cell": [f"c{i}" for i in range(900)], "cluster": clusters})
    names = pa.table({"gene": [f"g{i}" for i in range(400)]})
    matrix = ExpressionMatrix(values, names, cells, {}, dataset="synthetic")
    adata = anndata.AnnData(
        X=values.T.tocsr(),
        obs=pd.DataFrame({"louvain": pd.Categorical(clusters)}, index=cells["cell"].to_pylist()),
        var=pd.DataFrame(index=names["gene"].to_pylist()),
    )
    return matrix, adata


@pytest.fixture(scope="module")
def sparse_ties(genes_cluster):
    matrix, adata = _sparse_matrix()
    genes.ingest(genes_cluster, matrix, "bio/sparse_ties")
    return adata


@pytest.mark.slow
@pytest.mark.parametrize("pushdown", ["always", "never"])
def test_wilcoxon_on_a_sparse_matrix_with_ties_equals_scanpy(genes_cluster, sparse_ties, pushdown):
    adata = sparse_ties
    ours = genes.rank_genes_groups(
        genes_cluster, "bio/sparse_ties", "cluster", method="wilcoxon", tie_correct=True,
        pushdown=pushdown,
    )  # fmt: skip
    theirs = scanpy_ranking(adata, method="wilcoxon", tie_correct=True)
    assert_like_scanpy(ours, theirs)


def test_rank_sums_equal_scipy_ranks_with_negatives_zeros_and_ties():
    rng = np.random.default_rng(1)
    block = sparse.random(30, 500, density=0.3, format="csr", random_state=2, dtype=np.float32)
    block.data = np.round(block.data * 5) / 5 - 0.4  # negatives, ties and stored zeros
    groups = rng.integers(-1, 4, 500).astype(np.int32)
    cells_in_group = np.bincount(groups[groups >= 0], minlength=4)
    from_sparse = kernels.sparse_rank_sums(
        block.indptr, block.indices, block.data, groups, cells_in_group
    )
    from_dense = kernels.dense_rank_sums(block.toarray(), groups, cells_in_group)
    ranked = groups >= 0
    for row in range(30):
        values = block[row].toarray().ravel()[ranked]
        ranks = stats.rankdata(values)
        expected = [ranks[groups[ranked] == g].sum() for g in range(4)]
        _, runs = np.unique(values, return_counts=True)
        ties = float((runs.astype(float) ** 3 - runs).sum())
        for rank_sum, expressed, tie_terms in (from_sparse, from_dense):
            np.testing.assert_allclose(rank_sum[row], expected, rtol=1e-12)
            assert tie_terms[row] == ties
            nonzero = [(values[groups[ranked] == g] != 0).sum() for g in range(4)]
            assert list(expressed[row]) == nonzero


def test_pseudobulk_sums_equal_scanpys_aggregate(genes_cluster, stored_pbmc, pbmc_adata):
    import scanpy as sc

    bulk = genes.pseudobulk(genes_cluster, "bio/pbmc", "phase", "louvain")
    adata = pbmc_adata.copy()
    adata.X = np.asarray(adata.X, dtype=np.float64)
    aggregated = sc.get.aggregate(adata, by=["phase", "louvain"], func=["sum", "count_nonzero"])
    labels = aggregated.obs.astype(str)
    row_of = {
        (p, g): i for i, (p, g) in enumerate(zip(labels["phase"], labels["louvain"], strict=True))
    }
    sums = aggregated.layers["sum"]
    assert bulk.n_obs == len(row_of) and list(bulk.var_names) == list(pbmc_adata.var_names)
    for row, (sample, group) in enumerate(zip(bulk.obs["sample"], bulk.obs["group"], strict=True)):
        expected = np.asarray(sums[row_of[(sample, group)]]).ravel()
        np.testing.assert_allclose(bulk.X[row], expected, rtol=1e-9, atol=1e-9)
    cells = adata.obs.groupby(["phase", "louvain"], observed=True).size()
    for row, (sample, group) in enumerate(zip(bulk.obs["sample"], bulk.obs["group"], strict=True)):
        assert bulk.obs["n_cells"].iloc[row] == cells.loc[(sample, group)]


def test_pseudobulk_of_counts_is_whole_numbers_for_deseq(genes_cluster):
    rng = np.random.default_rng(4)
    counts = lambda k: rng.poisson(3.0, k) + 1.0  # noqa: E731
    values = sparse.random(50, 300, density=0.3, format="csr", random_state=5, data_rvs=counts)
    values = values.astype(np.float32)
    cells = pa.table({
        "cell": [f"c{i}" for i in range(300)],
        "donor": rng.choice(["d1", "d2", "d3"], 300),
        "type": rng.choice(["T", "B"], 300),
    })  # fmt: skip
    matrix = ExpressionMatrix(values, pa.table({"gene": [f"g{i}" for i in range(50)]}), cells, {},
                              dataset="counts")  # fmt: skip
    genes.ingest(genes_cluster, matrix, "bio/counts")
    bulk = genes.pseudobulk(genes_cluster, "bio/counts", "donor", "type", min_cells=10)
    assert bulk.X.dtype == np.int64
    dense = values.toarray()
    for row, (donor, kind) in enumerate(zip(bulk.obs["sample"], bulk.obs["group"], strict=True)):
        inside = (cells["donor"].to_numpy(zero_copy_only=False) == donor) & (
            cells["type"].to_numpy(zero_copy_only=False) == kind
        )
        assert (bulk.X[row] == dense[:, inside].sum(axis=1)).all()
