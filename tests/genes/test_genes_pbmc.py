"""Acceptance on pbmc68k_reduced: every louvain cluster vs rest, against scipy and scanpy."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from statsmodels.stats.multitest import multipletests

from quarry.genes import rank_genes_local
from quarry.genes.stats import benjamini_hochberg

SCIPY_RTOL = 1e-9
SCANPY_SCORE_RTOL = 1e-6


def clusters(adata) -> list[str]:
    return list(adata.obs["louvain"].cat.categories)


def scipy_ttest(adata, cluster: str, equal_var: bool) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(adata.X, dtype=np.float64)
    inside = (adata.obs["louvain"] == cluster).to_numpy()
    with warnings.catch_warnings():
        # scipy warns about the constant groups; those are exactly the pairs under test.
        warnings.simplefilter("ignore", RuntimeWarning)
        result = scipy.stats.ttest_ind(values[inside], values[~inside], equal_var=equal_var)
    return result.statistic, result.pvalue


def relative_error(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return np.abs(actual - expected) / np.abs(expected)


def test_pbmc68k_reduced_ships_inside_scanpy(pbmc_adata):
    import scanpy

    shipped = Path(scanpy.__file__).parent / "datasets" / "10x_pbmc68k_reduced.h5ad"
    assert shipped.is_file()
    assert pbmc_adata.shape == (700, 765)
    assert pbmc_adata.X.dtype == np.float32


@pytest.mark.slow
@pytest.mark.parametrize("method, equal_var", [("welch", False), ("student", True)])
@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"encoding": "sparse", "rows_per_slice": 64},
        {"orientation": "cells", "rows_per_slice": 100},
        {"orientation": "cells", "encoding": "sparse", "slice_bytes_target": 64 << 10},
    ],
    ids=["genes-auto", "genes-sparse", "cells-dense", "cells-sparse"],
)
def test_scores_and_pvals_equal_scipy(pbmc_adata, pbmc_matrix, method, equal_var, layout):
    for cluster in clusters(pbmc_adata):
        ranked = rank_genes_local(pbmc_matrix, "louvain", cluster, method=method, **layout)
        ranked = ranked.set_index("names").loc[pbmc_adata.var_names]
        t, p = scipy_ttest(pbmc_adata, cluster, equal_var)
        assert np.isfinite(t).all()
        assert relative_error(ranked["scores"].to_numpy(), t).max() < SCIPY_RTOL, cluster
        assert relative_error(ranked["pvals"].to_numpy(), p).max() < SCIPY_RTOL, cluster


def test_scores_equal_scanpy_and_scipy_where_scanpy_reports_zero(
    pbmc_adata, pbmc_matrix, scanpy_ranking, record_property
):
    zero_pairs = 0
    worst = 0.0
    for cluster in clusters(pbmc_adata):
        names = np.asarray(scanpy_ranking["names"][cluster], dtype=object)
        scanpy_scores = np.asarray(scanpy_ranking["scores"][cluster], dtype=np.float64)
        ranked = rank_genes_local(pbmc_matrix, "louvain", cluster).set_index("names")
        ours = ranked.loc[names, "scores"].to_numpy()

        reported = scanpy_scores != 0
        errors = relative_error(ours[reported], scanpy_scores[reported])
        assert errors.max() < SCANPY_SCORE_RTOL, cluster
        worst = max(worst, float(errors.max()))

        # Where scanpy's float32 one-pass variance broke down it reports 0; quarry gives scipy's t.
        t, _ = scipy_ttest(pbmc_adata, cluster, equal_var=False)
        scipy_by_name = dict(zip(pbmc_adata.var_names, t, strict=True))
        expected = np.array([scipy_by_name[name] for name in names[~reported]])
        assert relative_error(ours[~reported], expected).max(initial=0) < SCIPY_RTOL
        assert (ours[~reported] != 0).all()
        zero_pairs += int((~reported).sum())
    record_property("scanpy_zero_score_pairs", zero_pairs)
    record_property("scanpy_score_relative_error_max", worst)
    # scanpy 1.11.5 reports 371 such pairs; a few hundred is what the issue describes.
    assert 100 <= zero_pairs <= 1000, zero_pairs


def test_pvals_agree_with_scanpy_as_far_as_its_scores_do(pbmc_adata, pbmc_matrix, scanpy_ranking):
    """A relative error e in t moves p by about t^2 e; scanpy's t is good to 1e-6 (above)."""
    for cluster in clusters(pbmc_adata):
        names = np.asarray(scanpy_ranking["names"][cluster], dtype=object)
        scanpy_scores = np.asarray(scanpy_ranking["scores"][cluster], dtype=np.float64)
        scanpy_pvals = np.asarray(scanpy_ranking["pvals"][cluster], dtype=np.float64)
        ranked = rank_genes_local(pbmc_matrix, "louvain", cluster).set_index("names")
        ours = ranked.loc[names, "pvals"].to_numpy()
        reported = scanpy_scores != 0
        allowed = SCANPY_SCORE_RTOL * (1 + scanpy_scores[reported] ** 2)
        assert (relative_error(ours[reported], scanpy_pvals[reported]) < allowed).all(), cluster
        # Where scanpy's score is 0 its p-value is 1: no evidence, while scipy finds some.
        assert (scanpy_pvals[~reported] == 1).all()


def test_pvals_adj_are_benjamini_hochberg_as_statsmodels_and_scanpy(
    pbmc_adata, pbmc_matrix, scanpy_ranking
):
    for cluster in clusters(pbmc_adata):
        ranked = rank_genes_local(pbmc_matrix, "louvain", cluster)
        _, expected, _, _ = multipletests(ranked["pvals"].to_numpy(), method="fdr_bh")
        np.testing.assert_allclose(ranked["pvals_adj"].to_numpy(), expected, rtol=1e-12)
        # The same adjustment applied to scanpy's p-values gives scanpy's adjusted p-values.
        # (Ours differ from scanpy's where scanpy's p is 1 for a broken variance.)
        scanpy_pvals = np.asarray(scanpy_ranking["pvals"][cluster], dtype=np.float64)
        np.testing.assert_allclose(
            benjamini_hochberg(scanpy_pvals),
            np.asarray(scanpy_ranking["pvals_adj"][cluster], dtype=np.float64),
            rtol=1e-12,
        )


def test_logfoldchanges_equal_scanpy(pbmc_adata, pbmc_matrix, scanpy_ranking):
    for cluster in clusters(pbmc_adata):
        names = np.asarray(scanpy_ranking["names"][cluster], dtype=object)
        expected = np.asarray(scanpy_ranking["logfoldchanges"][cluster], dtype=np.float64)
        ranked = rank_genes_local(pbmc_matrix, "louvain", cluster).set_index("names")
        ours = ranked.loc[names, "logfoldchanges"].to_numpy()
        # X is scaled (negative means), so expm1 is negative for many genes and both give NaN.
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
        finite = np.isfinite(expected)
        # scanpy stores fold changes as float32.
        np.testing.assert_allclose(ours[finite], expected[finite], rtol=1e-6, atol=1e-6)


def test_results_are_sorted_like_scanpy(pbmc_adata, pbmc_matrix):
    ranked = rank_genes_local(pbmc_matrix, "louvain", "3")
    assert list(ranked.columns) == ["names", "scores", "pvals", "pvals_adj", "logfoldchanges"]
    assert len(ranked) == pbmc_adata.n_vars
    scores = ranked["scores"].to_numpy()
    assert (np.diff(scores) <= 0).all()
