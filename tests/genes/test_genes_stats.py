"""Accumulate -> Combine -> TStat: the decomposition gives the one-shot answer, in any order."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import sparse
from statsmodels.stats.multitest import multipletests

from quarry.genes import ExpressionMatrix, accumulate, combine, encode_slices, rest, tstat
from quarry.genes.stats import NO_GROUP, PARTIAL_SCHEMA, benjamini_hochberg, select_groups


def make_matrix(values: np.ndarray | sparse.csr_matrix) -> ExpressionMatrix:
    gene_count, cell_count = values.shape
    genes = pa.table({"gene": [f"g{i}" for i in range(gene_count)]})
    cells = pa.table({"cell": [f"c{i}" for i in range(cell_count)]})
    return ExpressionMatrix(values, genes, cells, dataset="synthetic")


def random_values(seed: int, gene_count: int, cell_count: int, density: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0.0, 1.0, (gene_count, cell_count)).astype(np.float32)
    values[rng.random((gene_count, cell_count)) >= density] = 0
    return values


def one_shot(values: np.ndarray, group_of_cell: np.ndarray, group_count: int) -> dict:
    """n, mean, m2 per (gene, group) straight from numpy, in float64."""
    values = values.astype(np.float64)
    result = {}
    for group in range(group_count):
        members = values[:, group_of_cell == group]
        count = members.shape[1]
        mean = members.mean(axis=1) if count else np.zeros(len(values))
        m2 = ((members - mean[:, None]) ** 2).sum(axis=1) if count else np.zeros(len(values))
        result[group] = (count, mean, m2)
    return result


def assert_matches_one_shot(statistics: pa.RecordBatch, expected: dict, group_count: int) -> None:
    gene = statistics.column("gene").to_numpy()
    group = statistics.column("group").to_numpy()
    for g in range(group_count):
        rows = group == g
        order = np.argsort(gene[rows])
        count, mean, m2 = expected[g]
        assert (statistics.column("n").to_numpy()[rows][order] == count).all()
        np.testing.assert_allclose(
            statistics.column("mean").to_numpy()[rows][order], mean, rtol=1e-12, atol=1e-12
        )
        np.testing.assert_allclose(
            statistics.column("m2").to_numpy()[rows][order], m2, rtol=1e-10, atol=1e-10
        )


@pytest.mark.parametrize("encoding", ["dense", "sparse"])
@pytest.mark.parametrize("orientation", ["genes", "cells"])
def test_accumulate_then_combine_equals_one_shot(encoding, orientation):
    values = random_values(1, 40, 90, density=0.3)
    group_of_cell = np.random.default_rng(2).integers(NO_GROUP, 4, 90).astype(np.int32)
    matrix = make_matrix(values)
    slices = encode_slices(matrix, rows_per_slice=7, encoding=encoding, orientation=orientation)
    partials = [accumulate(batch, group_of_cell, 4) for batch in slices]
    assert all(p.schema == PARTIAL_SCHEMA for p in partials)
    assert_matches_one_shot(combine(partials), one_shot(values, group_of_cell, 4), 4)


def test_a_group_without_cells_has_zero_statistics():
    values = random_values(3, 5, 10, density=0.5)
    group_of_cell = np.zeros(10, dtype=np.int32)  # group 1 is empty
    batch = encode_slices(make_matrix(values), rows_per_slice=5)[0]
    statistics = accumulate(batch, group_of_cell, 2)
    empty = statistics.filter(pa.compute.equal(statistics.column("group"), 1))
    assert empty.column("n").to_pylist() == [0] * 5
    assert empty.column("mean").to_pylist() == [0.0] * 5
    assert empty.column("m2").to_pylist() == [0.0] * 5


def test_accumulate_rejects_a_grouping_of_the_wrong_dataset():
    batch = encode_slices(make_matrix(random_values(4, 3, 8, 1.0)), rows_per_slice=3)[0]
    with pytest.raises(ValueError, match="covers 5 cells"):
        accumulate(batch, np.zeros(5, dtype=np.int32), 1)


@st.composite
def partial_statistics(draw):
    """Partials of a few (gene, group) keys, as slices over disjoint cells would give."""
    gene_count = draw(st.integers(1, 4))
    cell_count = draw(st.integers(2, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    cuts = sorted(draw(st.lists(st.integers(1, cell_count - 1), max_size=5, unique=True)))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([1e-3, 1.0, 1e4]))
    offset = draw(st.sampled_from([0.0, 1e3]))  # a large common mean stresses m2
    values = (offset + scale * rng.standard_normal((gene_count, cell_count))).astype(np.float32)
    values[rng.random(values.shape) < 0.3] = 0
    group_of_cell = rng.integers(NO_GROUP, 3, cell_count).astype(np.int32)
    matrix = make_matrix(sparse.csr_matrix(values))
    slices = encode_slices(matrix, rows_per_slice=1, orientation="cells")
    boundaries = [0, *cuts, cell_count]
    partials = [
        combine([accumulate(b, group_of_cell, 3) for b in slices[start:stop]])
        for start, stop in zip(boundaries[:-1], boundaries[1:], strict=True)
    ]
    return values, group_of_cell, partials


@settings(max_examples=60, deadline=None)
@given(partial_statistics(), st.randoms(use_true_random=False))
def test_combine_is_order_independent_and_equals_one_shot(case, random):
    values, group_of_cell, partials = case
    merged = combine(partials)
    shuffled = list(partials)
    random.shuffle(shuffled)
    # Bit for bit: Combine sorts its input into one canonical order before summing.
    assert combine(shuffled).equals(merged)
    # Associativity, up to rounding.
    split = random.randint(0, len(partials))
    nested = combine([combine(shuffled[:split]), combine(shuffled[split:])])
    for column in ("n", "mean", "m2"):
        np.testing.assert_allclose(
            nested.column(column).to_numpy(),
            merged.column(column).to_numpy(),
            rtol=1e-12,
            atol=1e-9,
        )
    assert_matches_one_shot(merged, one_shot(values, group_of_cell, 3), 3)


def _partial(gene: np.ndarray, group: np.ndarray, count, mean, m2) -> pa.RecordBatch:
    arrays = [pa.array(gene, pa.int64()), pa.array(group, pa.int32()), pa.array(count, pa.int64()),
              pa.array(mean, pa.float64()), pa.array(m2, pa.float64())]  # fmt: skip
    return pa.RecordBatch.from_arrays(arrays, schema=PARTIAL_SCHEMA)


@pytest.mark.parametrize("gene_step", [1, 2**40])  # dense ids, and ids too far apart for one key
def test_combine_of_many_partials_is_order_independent_and_sums_each_key(gene_step):
    """Forty partials per key (past the short runs sorted as they are gathered), ties in n and
    mean among them, NO_GROUP keys, and ids that do not fit one dense key."""
    rng = np.random.default_rng(3)
    genes = np.arange(50) * gene_step
    gene, group = np.repeat(genes, 4), np.tile(np.array([NO_GROUP, 0, 1, 2]), len(genes))
    partials = [
        _partial(
            gene,
            group,
            rng.integers(0, 3, len(gene)),
            rng.integers(0, 3, len(gene)) * 0.5,
            rng.random(len(gene)),
        )  # fmt: skip
        for _ in range(40)
    ]
    merged = combine(partials)
    shuffled = list(partials)
    rng.shuffle(shuffled)
    assert combine(shuffled).equals(merged)
    assert merged.column("gene").to_numpy().tolist() == gene.tolist()  # sorted by (gene, group)
    assert merged.column("group").to_numpy().tolist() == group.tolist()
    n = np.sum([p.column("n").to_numpy() for p in partials], axis=0)
    weighted = np.sum([p.column("n").to_numpy() * p.column("mean").to_numpy() for p in partials], 0)
    assert (merged.column("n").to_numpy() == n).all()
    expected = np.where(n > 0, weighted / np.maximum(n, 1), 0.0)
    np.testing.assert_allclose(merged.column("mean").to_numpy(), expected, rtol=1e-12)


def test_combine_passes_a_single_partial_through():
    """One partial per key is that partial, bit for bit (n * mean / n may round)."""
    gene, group = np.array([7, 3, 5]), np.array([0, 1, 0])
    mean = np.array([0.1, 1 / 3, 2.7])
    merged = combine([_partial(gene, group, [3, 7, 11], mean, [0.5, 0.25, 0.0])])
    assert merged.column("gene").to_numpy().tolist() == [3, 5, 7]
    assert merged.column("mean").to_numpy().tolist() == [1 / 3, 2.7, 0.1]
    assert combine([merged]).equals(merged)


def test_rest_is_every_other_group_including_unlabelled_cells():
    values = random_values(5, 6, 30, density=0.6)
    # Groups 0..2 are labels; 3 is the bucket of cells with no label.
    group_of_cell = np.repeat(np.arange(4, dtype=np.int32), [8, 7, 9, 6])
    statistics = accumulate(encode_slices(make_matrix(values))[0], group_of_cell, 4)
    others = rest(statistics, 1, 4)
    expected = one_shot(values, np.where(group_of_cell == 1, 1, 0).astype(np.int32), 1)[0]
    assert (others.column("n").to_numpy() == 23).all()
    np.testing.assert_allclose(others.column("mean").to_numpy(), expected[1], rtol=1e-12)
    np.testing.assert_allclose(others.column("m2").to_numpy(), expected[2], rtol=1e-10)


@pytest.mark.parametrize("method, equal_var", [("welch", False), ("student", True)])
def test_tstat_equals_scipy(method, equal_var):
    values = random_values(6, 50, 60, density=0.7)
    group_of_cell = np.repeat(np.array([0, 1], dtype=np.int32), [25, 35])
    statistics = accumulate(encode_slices(make_matrix(values))[0], group_of_cell, 2)
    result = tstat(select_groups(statistics, [0]), select_groups(statistics, [1]), method)
    expected = scipy.stats.ttest_ind(
        values[:, :25].astype(np.float64),
        values[:, 25:].astype(np.float64),
        axis=1,
        equal_var=equal_var,
    )
    np.testing.assert_allclose(result.column("score").to_numpy(), expected.statistic, rtol=1e-9)
    np.testing.assert_allclose(result.column("pval").to_numpy(), expected.pvalue, rtol=1e-9)
    assert result.column("gene").to_pylist() == list(range(50))


def stats_table(gene, n, mean, m2) -> pa.Table:
    return pa.table({"gene": gene, "n": n, "mean": mean, "m2": m2})


def test_tstat_of_constant_groups_is_scipys():
    a = stats_table([0, 1], [3, 3], [1.0, 1.0], [0.0, 0.0])
    b = stats_table([0, 1], [4, 4], [1.0, 2.0], [0.0, 0.0])
    result = tstat(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = scipy.stats.ttest_ind_from_stats(
            np.array([1.0, 1.0]),
            np.zeros(2),
            3,
            np.array([1.0, 2.0]),
            np.zeros(2),
            4,
            equal_var=False,
        )
    np.testing.assert_array_equal(result.column("score").to_numpy(), expected.statistic)
    np.testing.assert_array_equal(result.column("pval").to_numpy(), expected.pvalue)
    # Undefined p is NaN; BH counts it as 1 (scanpy's convention) and reports NaN for it.
    assert np.isnan(result.column("pval_adj").to_numpy()[0])
    assert result.column("pval_adj").to_numpy()[1] == 0.0


def test_tstat_matches_genes_by_name_and_keeps_the_first_order():
    a = stats_table(["x", "y", "z"], [5, 5, 5], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    b = stats_table(["z", "w", "x"], [6, 6, 6], [0.5, 0.1, 0.2], [1.0, 1.0, 1.0])
    result = tstat(a, b)
    assert result.column("gene").to_pylist() == ["x", "z"]
    assert result.column("mean_b").to_pylist() == [0.2, 0.5]


def test_tstat_needs_two_cells_per_group():
    a = stats_table([0], [1], [1.0], [0.0])
    b = stats_table([0], [5], [1.0], [1.0])
    with pytest.raises(ValueError, match="at least 2 cells"):
        tstat(a, b)


def test_tstat_rejects_several_groups_at_once():
    statistics = accumulate(
        encode_slices(make_matrix(random_values(7, 2, 6, 1.0)))[0],
        np.array([0, 0, 0, 1, 1, 1], dtype=np.int32),
        2,
    )
    with pytest.raises(ValueError, match="several groups"):
        tstat(statistics, statistics)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=60), st.integers(0, 3))
def test_benjamini_hochberg_equals_statsmodels(pvals, ties):
    values = np.array(pvals + pvals[:ties])  # repeated p-values exercise ties
    _, expected, _, _ = multipletests(values, method="fdr_bh")
    np.testing.assert_allclose(benjamini_hochberg(values), expected, rtol=1e-12)


def test_log_fold_change_uses_the_log1p_base():
    a = stats_table([0], [3], [np.log2(8.0)], [1.0])  # log2(1 + 7)
    b = stats_table([0], [3], [np.log2(2.0)], [1.0])  # log2(1 + 1)
    result = tstat(a, b, log1p_base=2.0)
    assert result.column("logfoldchange").to_numpy()[0] == pytest.approx(np.log2(7.0), rel=1e-9)
