"""Every group of a column ranked in one request: scipy's and scanpy's answers, per group."""

from __future__ import annotations

import numpy as np
import pytest

from quarry import genes
from quarry.genes.errors import GenesInputError
from tests.genes.test_genes_pbmc import (
    SCANPY_SCORE_RTOL,
    SCIPY_RTOL,
    clusters,
    relative_error,
    scipy_ttest,
)

COLUMNS = ["group", "names", "scores", "pvals", "pvals_adj", "logfoldchanges"]


@pytest.fixture(scope="module")
def all_groups(genes_cluster, stored_pbmc):
    return genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", pushdown="always")


def test_every_cluster_vs_rest_in_one_request_equals_scipy(all_groups, pbmc_adata):
    assert list(all_groups.columns) == COLUMNS
    assert list(all_groups["group"].cat.categories) == clusters(pbmc_adata)
    # one request per device for all eleven clusters, not one per cluster (and once more for
    # the grouping, which a device without the statistics cached asks for)
    assert all_groups.attrs["quarry"]["requests"] <= 2 * 3
    for cluster, ranked in all_groups.groupby("group", observed=True):
        scores = ranked["scores"].to_numpy()
        assert (np.diff(scores[np.isfinite(scores)]) <= 0).all(), "best score first"
        ranked = ranked.set_index("names").loc[pbmc_adata.var_names]
        t, p = scipy_ttest(pbmc_adata, cluster, equal_var=False)
        assert relative_error(ranked["scores"].to_numpy(), t).max() < SCIPY_RTOL, cluster
        assert relative_error(ranked["pvals"].to_numpy(), p).max() < SCIPY_RTOL, cluster


def test_each_group_equals_its_own_comparison(all_groups, genes_cluster):
    for cluster in ("0", "3", "10"):
        alone = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", cluster)
        alone = alone.set_index("names")
        ours = all_groups[all_groups["group"] == cluster].set_index("names").loc[alone.index]
        for column in ("scores", "pvals", "pvals_adj", "logfoldchanges"):
            np.testing.assert_allclose(
                ours[column].to_numpy(), alone[column].to_numpy(), rtol=1e-9, err_msg=column
            )


def test_scores_equal_scanpy_where_scanpy_reports_one(all_groups, scanpy_ranking):
    for cluster, ranked in all_groups.groupby("group", observed=True):
        names = np.asarray(scanpy_ranking["names"][cluster], dtype=object)
        expected = np.asarray(scanpy_ranking["scores"][cluster], dtype=np.float64)
        ours = ranked.set_index("names").loc[names, "scores"].to_numpy()
        reported = expected != 0  # scanpy's float32 variance breaks down elsewhere
        assert relative_error(ours[reported], expected[reported]).max() < SCANPY_SCORE_RTOL


@pytest.mark.parametrize("pushdown", ["never", "auto"])
def test_the_answer_does_not_depend_on_where_accumulate_ran(all_groups, genes_cluster, pushdown):
    other = genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", pushdown=pushdown)
    np.testing.assert_array_equal(other["names"].to_numpy(), all_groups["names"].to_numpy())
    for column in ("scores", "pvals", "logfoldchanges"):
        np.testing.assert_allclose(
            other[column].to_numpy(), all_groups[column].to_numpy(), rtol=1e-12
        )


def test_some_groups_against_one_reference(genes_cluster, stored_pbmc):
    ranked = genes.rank_genes_groups(
        genes_cluster, "bio/pbmc", "louvain", groups=["2", "5", "7"], reference="5",
        method="student",
    )  # fmt: skip
    assert list(ranked["group"].cat.categories) == ["2", "7"]  # the reference is not ranked
    alone = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "7", "5", method="student")
    ours = ranked[ranked["group"] == "7"].set_index("names").loc[alone["names"]]
    expected = alone["scores"].to_numpy()
    defined = np.isfinite(expected)  # both groups constant: scanpy (and so this) reports 0
    np.testing.assert_allclose(ours["scores"].to_numpy()[defined], expected[defined], rtol=1e-12)
    assert (ours["scores"].to_numpy()[~defined] == 0).all()
    assert (ours["pvals"].to_numpy()[~defined] == 1).all()


def test_errors_name_the_group(genes_cluster, stored_pbmc):
    with pytest.raises(GenesInputError, match="no-such"):
        genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", groups=["no-such"])
    with pytest.raises(GenesInputError, match="no group left"):
        genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", groups=["1"], reference="1")
    with pytest.raises(GenesInputError, match="'all' or a list"):
        genes.rank_genes_groups(genes_cluster, "bio/pbmc", "louvain", groups="1")


@pytest.mark.slow
@pytest.mark.parametrize("stored", ["bio/pbmc", "bio/pbmc_sparse"])
def test_wilcoxon_is_one_request_with_the_t_tests_fold_changes(
    genes_cluster, stored_pbmc, pbmc_adata, stored
):
    """Against the rest, Wilcoxon's pass also sums each group's values as Accumulate does: no
    moments request, and the fold changes are the t-test's to the bit (dense and sparse rows)."""
    if stored == "bio/pbmc_sparse" and stored not in genes_cluster.catalog:
        counts = pbmc_adata.copy()
        counts.X = np.where(counts.X > 1.0, counts.X, 0.0).astype(np.float32)  # mostly zeros
        genes.ingest(genes_cluster, counts, stored)
    ranked = genes.rank_genes_groups(genes_cluster, stored, "louvain", method="wilcoxon")
    t_test = genes.rank_genes_groups(genes_cluster, stored, "louvain", method="t-test")
    assert len(ranked.attrs["quarry"]["datasets"]) == 1
    for label, part in ranked.groupby("group", observed=True):
        theirs = t_test[t_test["group"] == label].set_index("names")["logfoldchanges"]
        ours = part.set_index("names")["logfoldchanges"].loc[theirs.index]
        np.testing.assert_array_equal(ours.to_numpy(), theirs.to_numpy())
