"""rank_genes_local: every way to name two groups, and errors that say which group is wrong."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import scipy.stats

from quarry.genes import ExpressionMatrix, GenesInputError, rank_genes_local


def scipy_scores(values: np.ndarray, inside: np.ndarray, against: np.ndarray, equal_var=False):
    values = np.asarray(values, dtype=np.float64)
    return scipy.stats.ttest_ind(
        values[:, inside], values[:, against], axis=1, equal_var=equal_var
    ).statistic


def by_gene(ranked, genes) -> np.ndarray:
    return ranked.set_index("names").loc[list(genes), "scores"].to_numpy()


@pytest.fixture(scope="module")
def small() -> ExpressionMatrix:
    """60 genes x 40 cells with labels A, B, C and 4 unlabelled cells."""
    rng = np.random.default_rng(11)
    values = rng.lognormal(0, 1, (60, 40)).astype(np.float32)
    values[rng.random(values.shape) < 0.4] = 0
    labels = ["A"] * 12 + ["B"] * 14 + ["C"] * 10 + [None] * 4
    cells = pa.table({"cell": [f"c{i}" for i in range(40)], "label": labels})
    genes = pa.table({"gene": [f"g{i}" for i in range(60)]})
    return ExpressionMatrix(values, genes, cells, {"lab": "demo"}, dataset="small")


def test_group_vs_rest_counts_unlabelled_cells_in_the_rest(small):
    ranked = rank_genes_local(small, "label", "B")
    inside = np.arange(40) >= 12
    inside &= np.arange(40) < 26
    expected = scipy_scores(small.values, inside, ~inside)
    np.testing.assert_allclose(by_gene(ranked, small.gene_names), expected, rtol=1e-9)
    assert ranked.attrs["metadata"] == {"lab": "demo"}


def test_group_vs_group(small):
    ranked = rank_genes_local(small, "label", "A", reference="C", method="student")
    cells = np.arange(40)
    expected = scipy_scores(small.values, cells < 12, (cells >= 26) & (cells < 36), True)
    np.testing.assert_allclose(by_gene(ranked, small.gene_names), expected, rtol=1e-9)


def test_explicit_cell_lists(small):
    group = [f"c{i}" for i in (0, 5, 7, 30, 39)]
    reference = [f"c{i}" for i in (1, 2, 3, 20)]
    ranked = rank_genes_local(small, group=group, reference=reference)
    expected = scipy_scores(small.values, [0, 5, 7, 30, 39], [1, 2, 3, 20])
    np.testing.assert_allclose(by_gene(ranked, small.gene_names), expected, rtol=1e-9)

    versus_rest = rank_genes_local(small, group=group)
    inside = np.isin(np.arange(40), [0, 5, 7, 30, 39])
    expected = scipy_scores(small.values, inside, ~inside)
    np.testing.assert_allclose(by_gene(versus_rest, small.gene_names), expected, rtol=1e-9)


def test_label_against_a_cell_list(small):
    ranked = rank_genes_local(small, "label", "A", reference=["c36", "c37", "c38"])
    expected = scipy_scores(small.values, np.arange(40) < 12, [36, 37, 38])
    np.testing.assert_allclose(by_gene(ranked, small.gene_names), expected, rtol=1e-9)


def test_group_in_one_dataset_vs_group_in_another(small):
    """Genes are matched by name; genes only one dataset has are left out."""
    rng = np.random.default_rng(12)
    other_values = rng.lognormal(0.3, 1, (50, 30)).astype(np.float32)
    # The other lab measured genes g10..g59 in reverse order.
    other_genes = [f"g{i}" for i in range(59, 9, -1)]
    other = ExpressionMatrix(
        other_values,
        pa.table({"gene": other_genes}),
        pa.table({"cell": [f"x{i}" for i in range(30)], "kind": ["T"] * 18 + ["NK"] * 12}),
        dataset="other-lab",
    )
    ranked = rank_genes_local(
        small, "label", "B", reference="NK", reference_matrix=other, reference_groupby="kind"
    )
    assert ranked.attrs["genes_compared"] == 50
    shared = [f"g{i}" for i in range(10, 60)]
    a = small.values[10:60, 12:26].astype(np.float64)
    b = other_values[::-1][:, 18:].astype(np.float64)  # rows back in g10..g59 order
    expected = scipy.stats.ttest_ind(a, b, axis=1, equal_var=False).statistic
    np.testing.assert_allclose(by_gene(ranked, shared), expected, rtol=1e-9)


@pytest.mark.parametrize("layout", [{"orientation": "cells"}, {"encoding": "sparse"}])
def test_the_layout_does_not_change_the_answer(small, layout):
    baseline = rank_genes_local(small, "label", "C")
    other = rank_genes_local(small, "label", "C", rows_per_slice=3, **layout)
    np.testing.assert_allclose(
        by_gene(other, small.gene_names), by_gene(baseline, small.gene_names), rtol=1e-12
    )


def test_unknown_column_lists_the_columns(small):
    with pytest.raises(
        GenesInputError, match=r"'small': no cell metadata column 'cluster'.*'label'"
    ):
        rank_genes_local(small, "cluster", "A")


def test_unknown_group_lists_the_groups(small):
    with pytest.raises(
        GenesInputError, match=r"column 'label' has no group 'D' \(groups: 'A', 'B', 'C'\)"
    ):
        rank_genes_local(small, "label", "D")


def test_a_group_of_one_cell_is_refused_by_name():
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    matrix = ExpressionMatrix(
        values,
        pa.table({"gene": ["a", "b", "c"]}),
        pa.table({"cell": ["1", "2", "3", "4"], "type": ["x", "x", "x", "lonely"]}),
        dataset="tiny",
    )
    with pytest.raises(
        GenesInputError, match=r"'tiny': group 'lonely' of column 'type' has 1 cell\(s\)"
    ):
        rank_genes_local(matrix, "type", "lonely")
    with pytest.raises(GenesInputError, match=r"group 'lonely' of column 'type' has 1 cell"):
        rank_genes_local(matrix, "type", "x", reference="lonely")


def test_unknown_and_shared_cells_are_refused(small):
    with pytest.raises(GenesInputError, match=r"1 ids the dataset does not have, first 'nope'"):
        rank_genes_local(small, group=["c1", "c2", "nope"])
    with pytest.raises(GenesInputError, match="1 cells are in both group"):
        rank_genes_local(small, group=["c1", "c2"], reference=["c2", "c3"])


def test_requests_that_make_no_sense(small):
    with pytest.raises(GenesInputError, match="say which cell metadata column"):
        rank_genes_local(small, group="A")
    with pytest.raises(GenesInputError, match="'rest' means the other cells of the same"):
        rank_genes_local(small, "label", "A", reference_matrix=small)
    with pytest.raises(GenesInputError, match="unknown t-test method"):
        rank_genes_local(small, "label", "A", method="wilcoxon")
    with pytest.raises(GenesInputError, match="both 'A'"):
        rank_genes_local(small, "label", "A", reference="A")
