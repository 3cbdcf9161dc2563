"""Differential expression on a real cluster: devices accumulate, the host ranks.

Acceptance of issue 5 on pbmc68k_reduced (scipy to 1e-9, scanpy to 1e-6), the same bits with
pushdown always / never / auto / forced partial push-back, caching, re-ingest, cross-dataset
comparison, and errors that name the dataset, column or group.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
import scipy.stats
from scipy import sparse

from quarry import genes
from quarry.errors import DatasetExists, DatasetNotFound
from quarry.genes import ExpressionMatrix, GenesInputError
from quarry.genes.layout import slice_layout_of_schema
from quarry.pushdown import InvalidPushdown

SCIPY_RTOL = 1e-9
SCANPY_SCORE_RTOL = 1e-6
RESULT_COLUMNS = ["names", "scores", "pvals", "pvals_adj", "logfoldchanges"]


def clusters(adata) -> list[str]:
    return list(adata.obs["louvain"].cat.categories)


def scipy_ttest(adata, cluster: str, equal_var: bool) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(adata.X, dtype=np.float64)
    inside = (adata.obs["louvain"] == cluster).to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant groups: the pairs under test
        result = scipy.stats.ttest_ind(values[inside], values[~inside], equal_var=equal_var)
    return result.statistic, result.pvalue


def relative_error(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return np.abs(actual - expected) / np.abs(expected)


def by_name(frame, names) -> object:
    return frame.set_index("names").loc[list(names)]


def assert_same_bits(left, right) -> None:
    """Two rankings of the same request: identical, NaN where NaN."""
    assert list(left["names"]) == list(right["names"])
    for column in RESULT_COLUMNS[1:]:
        np.testing.assert_array_equal(left[column].to_numpy(), right[column].to_numpy())


# ---- ingest -----------------------------------------------------------------------------------


def test_ingest_stores_matrix_cells_and_genes(genes_cluster, stored_pbmc, pbmc_adata):
    names = {entry.dataset for entry in genes_cluster.datasets()}
    assert {"bio/pbmc", "bio/pbmc__cells", "bio/pbmc__genes"} <= names
    entry = genes_cluster.entry("bio/pbmc")
    # One schema for the whole matrix, whichever encoding each row took.
    assert entry.schema.names == ["gene", "cells", "values"]
    assert slice_layout_of_schema(entry.schema) == ("rows", "genes", 700)
    assert entry.rows == 765
    assert sum(p.slices for p in entry.partitions) > len(entry.partitions)  # several per partition
    assert entry.metadata["lab"] == "10x Genomics"
    description = json.loads(entry.metadata["quarry.genes"])
    assert (description["genes"], description["cells"]) == (765, 700)
    # Cell and gene metadata come back in matrix order, categories in their own order.
    assert list(stored_pbmc.cell_ids) == list(pbmc_adata.obs_names)
    assert list(stored_pbmc.gene_names) == list(pbmc_adata.var_names)
    louvain = stored_pbmc.cells.column("louvain")
    assert pa.types.is_dictionary(louvain.type)
    assert louvain.chunk(0).dictionary.to_pylist() == clusters(pbmc_adata)


def test_a_sparse_matrix_keeps_dense_rows_dense_and_sparse_rows_sparse(genes_cluster):
    matrix = mixed_matrix(seed=5)
    stored = genes.ingest(genes_cluster, matrix, "lab/mixed")
    table = genes_cluster.scan("lab/mixed").read_all().sort_by("gene")
    dense_rows = table.column("cells").is_null().to_numpy(zero_copy_only=False)
    density = np.diff(matrix.values.indptr) / matrix.cell_count
    np.testing.assert_array_equal(dense_rows, density >= 0.5)
    assert 0 < dense_rows.sum() < len(dense_rows)
    ranked = genes.rank_genes(genes_cluster, "lab/mixed", "kind", "b", pushdown="always")
    # The in-memory reference over the stored layout: the same bits.
    assert_same_bits(ranked, genes.rank_genes_local(matrix, "kind", "b", encoding="rows"))
    # Over its own slices (dense-wide or sparse per slice) only rounding differs.
    local = by_name(genes.rank_genes_local(matrix, "kind", "b"), ranked["names"])
    np.testing.assert_allclose(ranked["scores"], local["scores"], rtol=1e-12)
    assert stored.version == genes_cluster.entry("lab/mixed").version


def test_replicas_and_compression_do_not_change_the_answer(genes_cluster):
    matrix = mixed_matrix(seed=4)
    genes.ingest(genes_cluster, matrix, "lab/copies", replicas=2, compression="zstd")
    entry = genes_cluster.entry("lab/copies")
    assert entry.compression == "zstd"
    assert all(len(p.devices) == 2 for p in entry.partitions)
    expected = genes.rank_genes_local(matrix, "kind", "c", encoding="rows")
    for pushdown in ("always", "never"):
        ranked = genes.rank_genes(genes_cluster, "lab/copies", "kind", "c", pushdown=pushdown)
        assert_same_bits(ranked, expected)


# ---- agreement with scipy and scanpy --------------------------------------------------------


@pytest.mark.parametrize("method, equal_var", [("welch", False), ("student", True)])
def test_every_cluster_vs_rest_equals_scipy(
    genes_cluster, stored_pbmc, pbmc_adata, method, equal_var
):
    for cluster in clusters(pbmc_adata):
        ranked = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", cluster, method=method)
        ranked = by_name(ranked, pbmc_adata.var_names)
        t, p = scipy_ttest(pbmc_adata, cluster, equal_var)
        assert np.isfinite(t).all()
        assert relative_error(ranked["scores"].to_numpy(), t).max() < SCIPY_RTOL, cluster
        assert relative_error(ranked["pvals"].to_numpy(), p).max() < SCIPY_RTOL, cluster


def test_scores_equal_scanpy_and_scipy_where_scanpy_reports_zero(
    genes_cluster, stored_pbmc, pbmc_adata, scanpy_ranking
):
    zero_pairs = 0
    for cluster in clusters(pbmc_adata):
        names = np.asarray(scanpy_ranking["names"][cluster], dtype=object)
        scanpy_scores = np.asarray(scanpy_ranking["scores"][cluster], dtype=np.float64)
        ranked = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", cluster)
        ours = by_name(ranked, names)["scores"].to_numpy()
        reported = scanpy_scores != 0
        assert relative_error(ours[reported], scanpy_scores[reported]).max() < SCANPY_SCORE_RTOL
        t, _ = scipy_ttest(pbmc_adata, cluster, equal_var=False)
        scipy_by_name = dict(zip(pbmc_adata.var_names, t, strict=True))
        expected = np.array([scipy_by_name[name] for name in names[~reported]])
        assert relative_error(ours[~reported], expected).max(initial=0) < SCIPY_RTOL
        zero_pairs += int((~reported).sum())
    assert 100 <= zero_pairs <= 1000, zero_pairs


def test_results_look_like_scanpy_and_carry_the_metadata(genes_cluster, stored_pbmc):
    ranked = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "3")
    assert list(ranked.columns) == RESULT_COLUMNS
    assert len(ranked) == 765
    assert (np.diff(ranked["scores"].to_numpy()) <= 0).all()
    assert ranked.attrs["metadata"]["lab"] == "10x Genomics"
    assert ranked.attrs["metadata"]["source_format"] == "h5ad"
    assert ranked.attrs["dataset"] == "bio/pbmc"
    moved = ranked.attrs["quarry"]
    for key in (
        "bytes_shipped",
        "bytes_read",
        "bytes_sent",
        "slices_executed",
        "slices_pushed_back",
        "slices_cached",
        "wall_s",
    ):
        assert key in moved


# ---- pushdown ---------------------------------------------------------------------------------


def test_always_never_auto_and_forced_push_back_give_the_same_bits(
    genes_cluster, stored_pbmc, pbmc_adata
):
    entry = genes_cluster.entry("bio/pbmc")
    rng = np.random.default_rng(7)
    for cluster in clusters(pbmc_adata)[:4]:
        baseline = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", cluster, pushdown="never")
        assert baseline.attrs["quarry"]["slices_executed"] == 0
        assert baseline.attrs["quarry"]["slices_raw"] == sum(p.slices for p in entry.partitions)
        for pushdown in ("always", "auto"):
            assert_same_bits(
                genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", cluster, pushdown=pushdown),
                baseline,
            )
        # Random slice ranges pushed back: the devices run the rest, the host completes.
        forced = random_push_back(entry, rng)
        partial = genes.rank_genes(
            genes_cluster,
            "bio/pbmc",
            "louvain",
            cluster,
            pushdown="always",
            push_back={"bio/pbmc": forced},
        )
        assert_same_bits(partial, baseline)
        moved = partial.attrs["quarry"]
        pushed = sum(end - first for ranges in forced.values() for first, end in ranges)
        assert moved["slices_pushed_back"] == moved["slices_raw"] == pushed


def test_the_summary_says_which_slices_ran_and_which_came_back(genes_cluster, stored_pbmc):
    entry = genes_cluster.entry("bio/pbmc")
    partition = max(entry.partitions, key=lambda p: p.slices)
    assert partition.slices >= 4
    forced = {partition.partition: [(1, 3)]}
    ranked = genes.rank_genes(
        genes_cluster,
        "bio/pbmc",
        "louvain",
        "1",
        reference="2",
        pushdown="always",
        push_back={"bio/pbmc": forced},
    )
    devices = ranked.attrs["quarry"]["datasets"][0]["devices"]
    detail = next(
        d["partitions"][str(partition.partition)]
        for d in devices
        if str(partition.partition) in d["partitions"]
    )
    assert detail["pushed_back"] == [[1, 3]]
    done = detail["executed"] + detail["cached"]
    covered = sorted(n for first, end in done for n in range(first, end))
    assert covered == [0, *range(3, partition.slices)]


@pytest.mark.slow
def test_a_kinetic_device_pushes_back_when_the_host_is_cheaper(tmp_path):
    """auto: a 15x slower drive measures its first slices, then ships the rest raw."""
    import quarry

    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.small_kinetic]\nfrom = "kinetic"\nkv_bytes_max = 16384\n')
    matrix = mixed_matrix(seed=9, genes=400, cells=300)
    with quarry.local(devices=1, profile="small_kinetic", profiles_file=str(profiles)) as c:
        genes.ingest(c, matrix, "lab/slow")
        assert sum(p.slices for p in c.entry("lab/slow").partitions) >= 8
        ranked = genes.rank_genes(c, "lab/slow", "kind", "a", pushdown="auto")
        assert_same_bits(ranked, genes.rank_genes_local(matrix, "kind", "a", encoding="rows"))
        moved = ranked.attrs["quarry"]
        decisions = [
            d
            for device in moved["datasets"][0]["devices"]
            for p in device["partitions"].values()
            for d in p["decisions"]
        ]
        assert moved["slices_executed"] >= 2, decisions  # it measured itself first
        assert moved["slices_pushed_back"] > 0, decisions
        assert any(d["stage"] == "raw" and "raw:" in d["reason"] for d in decisions), decisions


# ---- caching ------------------------------------------------------------------------------


def test_a_repeated_or_overlapping_request_reuses_the_devices_statistics(
    genes_cluster, stored_pbmc
):
    # bulk_labels: a grouping no other test uses, so the first call starts cold.
    request = ("bio/pbmc", "bulk_labels", "CD56+ NK")
    first = genes.rank_genes(genes_cluster, *request, pushdown="always")
    again = genes.rank_genes(genes_cluster, *request, pushdown="always")
    other = genes.rank_genes(
        genes_cluster,
        "bio/pbmc",
        "bulk_labels",
        "CD14+ Monocyte",
        reference="CD56+ NK",
        pushdown="auto",
    )
    assert_same_bits(again, first)
    cold, warm, overlapping = (f.attrs["quarry"] for f in (first, again, other))
    assert cold["slices_executed"] > 0 and cold["bytes_read"] > 0 and cold["bytes_sent"] > 0
    for moved in (warm, overlapping):
        assert moved["slices_executed"] == 0
        assert moved["slices_cached"] == cold["slices_executed"]
        assert moved["bytes_read"] == 0 and moved["bytes_sent"] == 0
        total = moved["bytes_read"] + moved["bytes_sent"] + moved["bytes_shipped"]
        cold_total = cold["bytes_read"] + cold["bytes_sent"] + cold["bytes_shipped"]
        assert total * 10 < cold_total
    # What still moves is the answer: a few numbers per gene and side, never the matrix.
    assert warm["bytes_shipped"] < genes_cluster.entry("bio/pbmc").bytes_stored / 10


def test_reingesting_invalidates_the_cache(genes_cluster):
    matrix = mixed_matrix(seed=1)
    stored = genes.ingest(genes_cluster, matrix, "lab/again")
    genes.rank_genes(genes_cluster, "lab/again", "kind", "a", pushdown="always")
    warm = genes.rank_genes(genes_cluster, "lab/again", "kind", "a", pushdown="always")
    assert warm.attrs["quarry"]["slices_executed"] == 0

    with pytest.raises(DatasetExists, match="lab/again already exists"):
        genes.ingest(genes_cluster, matrix, "lab/again")
    changed = mixed_matrix(seed=2)
    genes.drop(genes_cluster, "lab/again")
    restored = genes.ingest(genes_cluster, changed, "lab/again")
    assert restored.version != stored.version
    fresh = genes.rank_genes(genes_cluster, "lab/again", "kind", "a", pushdown="always")
    assert fresh.attrs["quarry"]["slices_cached"] == 0
    assert fresh.attrs["quarry"]["slices_executed"] > 0
    assert_same_bits(fresh, genes.rank_genes_local(changed, "kind", "a", encoding="rows"))


# ---- comparisons --------------------------------------------------------------------------


def test_group_vs_group_and_cell_lists(genes_cluster, stored_pbmc, pbmc_matrix):
    assert_same_bits(
        genes.rank_genes(
            genes_cluster, "bio/pbmc", "louvain", "0", reference="5", method="student"
        ),
        genes.rank_genes_local(pbmc_matrix, "louvain", "0", reference="5", method="student"),
    )
    group = list(pbmc_matrix.cell_ids[:40])
    reference = list(pbmc_matrix.cell_ids[100:160])
    assert_same_bits(
        genes.rank_genes(genes_cluster, "bio/pbmc", group=group, reference=reference),
        genes.rank_genes_local(pbmc_matrix, group=group, reference=reference),
    )
    # cells=: only these cells take part, so "rest" is the rest of the selection.
    selection = list(pbmc_matrix.cell_ids[:350])
    selected = genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "1", cells=selection)
    assert_same_bits(selected, genes.rank_genes_local(pbmc_matrix, "louvain", "1", cells=selection))


def test_a_group_in_one_dataset_vs_a_group_in_another(genes_cluster, stored_pbmc, pbmc_matrix):
    """A second lab measured a subset of the genes, in another order, and other cells."""
    rng = np.random.default_rng(3)
    chosen = rng.permutation(pbmc_matrix.gene_count)[:500]
    cells = np.arange(300, 700)
    noise = rng.normal(0.0, 0.05, (len(chosen), len(cells)))  # no gene constant in a group
    values = np.asarray(pbmc_matrix.values)[chosen][:, cells] * 1.1 + 0.05 + noise
    other = ExpressionMatrix(
        values.astype(np.float32),
        pbmc_matrix.genes.take(pa.array(chosen)),
        pbmc_matrix.cells.take(pa.array(cells)),
        {"lab": "second lab"},
        dataset="lab/second",
    )
    genes.ingest(genes_cluster, other, "lab/second", metadata={"lab": "second lab"})
    ranked = genes.rank_genes(
        genes_cluster, "bio/pbmc", "louvain", "3", reference="3", reference_dataset="lab/second"
    )
    local = genes.rank_genes_local(
        pbmc_matrix, "louvain", "3", reference="3", reference_matrix=other
    )
    assert_same_bits(ranked, local)
    assert ranked.attrs["genes_compared"] == 500
    assert ranked.attrs["reference_metadata"]["lab"] == "second lab"
    assert ranked.attrs["metadata"]["lab"] == "10x Genomics"
    # And against scipy, gene by gene.
    inside = pbmc_matrix.cells.column("louvain").to_numpy(zero_copy_only=False) == "3"
    a = np.asarray(pbmc_matrix.values, dtype=np.float64)[chosen][:, inside]
    b_inside = inside[cells]
    b = values.astype(np.float32).astype(np.float64)[:, b_inside]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # groups constant in one dataset
        expected = scipy.stats.ttest_ind(a, b, axis=1, equal_var=False).statistic
    got = by_name(ranked, pbmc_matrix.gene_names[chosen])["scores"].to_numpy()
    assert relative_error(got, expected).max() < SCIPY_RTOL


def test_the_pivoted_orientation_gives_the_same_answer(genes_cluster, pbmc_matrix):
    genes.ingest(genes_cluster, pbmc_matrix, "bio/pbmc_pivoted", orientation="cells")
    assert genes_cluster.entry("bio/pbmc_pivoted").rows == 700
    for pushdown in ("always", "never"):
        ranked = genes.rank_genes(
            genes_cluster, "bio/pbmc_pivoted", "louvain", "4", pushdown=pushdown
        )
        local = genes.rank_genes_local(pbmc_matrix, "louvain", "4")
        ranked, local = (
            by_name(ranked, pbmc_matrix.gene_names),
            by_name(local, pbmc_matrix.gene_names),
        )
        # Partials of one gene now come from many slices, merged in another order: rounding.
        np.testing.assert_allclose(ranked["scores"], local["scores"], rtol=1e-12)


# ---- bad input ----------------------------------------------------------------------------


def test_errors_name_the_dataset_column_and_group(genes_cluster, stored_pbmc):
    with pytest.raises(DatasetNotFound, match="no expression matrix bio/nope.*bio/pbmc"):
        genes.rank_genes(genes_cluster, "bio/nope", "louvain", "1")
    with pytest.raises(GenesInputError, match="bio/pbmc__cells is not an expression matrix"):
        genes.rank_genes(genes_cluster, "bio/pbmc__cells", "louvain", "1")
    with pytest.raises(GenesInputError, match=r"'bio/pbmc': no cell metadata column 'leiden'"):
        genes.rank_genes(genes_cluster, "bio/pbmc", "leiden", "1")
    with pytest.raises(GenesInputError, match=r"column 'louvain' has no group '42'"):
        genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "42")
    with pytest.raises(GenesInputError, match=r"group 'of the given cells'.* has 1 cell"):
        genes.rank_genes(genes_cluster, "bio/pbmc", group=[stored_pbmc.cell_ids[0]])
    with pytest.raises(InvalidPushdown, match="pushdown must be one of never, always, auto"):
        genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "1", pushdown="sometimes")
    with pytest.raises(GenesInputError, match="push_back names partitions"):
        genes.rank_genes(
            genes_cluster, "bio/pbmc", "louvain", "1", push_back={"bio/pbmc": {999: [(0, 1)]}}
        )
    with pytest.raises(GenesInputError, match="'rest' means the other cells"):
        genes.rank_genes(genes_cluster, "bio/pbmc", "louvain", "1", reference_dataset="bio/pbmc")


def test_bad_matrices_are_refused_before_anything_is_stored(genes_cluster, pbmc_adata):
    broken = pbmc_adata.copy()
    broken.X = np.asarray(broken.X).copy()
    broken.X[3, 5] = np.nan
    with pytest.raises(GenesInputError, match=r"'lab/broken'.*NaN"):
        genes.ingest(genes_cluster, broken, "lab/broken")
    values = np.ones((3, 4), dtype=np.float32)
    with pytest.raises(GenesInputError, match="the matrix has 4 cells but the cells metadata"):
        ExpressionMatrix(
            values,
            pa.table({"gene": ["a", "b", "c"]}),
            pa.table({"cell": ["1", "2", "3"]}),
            dataset="lab/short",
        )
    with pytest.raises(GenesInputError, match="must be numeric"):
        ExpressionMatrix(
            np.array([["a", "b"]]),
            pa.table({"gene": ["a"]}),
            pa.table({"cell": ["1", "2"]}),
            dataset="lab/text",
        )
    with pytest.raises(GenesInputError, match="too long"):
        genes.ingest(genes_cluster, mixed_matrix(seed=0), "lab/" + "x" * 60)
    with pytest.raises(GenesInputError, match="'quarry.' is reserved"):
        genes.ingest(
            genes_cluster, mixed_matrix(seed=0), "lab/meta", metadata={"quarry.genes": "mine"}
        )
    names = {entry.dataset for entry in genes_cluster.datasets()}
    assert not {n for n in names if n.startswith(("lab/broken", "lab/meta"))}


# ---- helpers ------------------------------------------------------------------------------


def mixed_matrix(seed: int, genes: int = 120, cells: int = 90) -> ExpressionMatrix:
    """A sparse matrix whose genes range from 2% to 90% non-zero, with a cell type column."""
    rng = np.random.default_rng(seed)
    density = rng.uniform(0.02, 0.9, genes)
    mask = rng.random((genes, cells)) < density[:, np.newaxis]
    values = np.where(mask, np.log1p(rng.poisson(3.0, (genes, cells)) + 1), 0).astype(np.float32)
    kinds = np.array(["a", "b", "c"])[rng.integers(0, 3, cells)]
    return ExpressionMatrix(
        sparse.csr_matrix(values),
        pa.table({"gene": [f"g{i}" for i in range(genes)]}),
        pa.table({"cell": [f"c{i}" for i in range(cells)], "kind": kinds}),
        dataset="mixed",
    )


def random_push_back(entry, rng) -> dict[int, list[tuple[int, int]]]:
    forced: dict[int, list[tuple[int, int]]] = {}
    for partition in entry.partitions:
        if partition.slices == 0 or rng.random() < 0.3:
            continue
        first = int(rng.integers(0, partition.slices))
        end = int(rng.integers(first + 1, partition.slices + 1))
        forced[partition.partition] = [(first, end)]
    return forced
