"""Columns read as needed (Kinetic Pipe's column reads) and clustered partitions (its clustered
index): a device takes off its store only the byte ranges of the columns a sub-plan touches, and
``ingest(cluster_by=)`` sorts each partition so zone maps skip slices. Answers stay DuckDB's."""

from __future__ import annotations

import pytest

from quarry.errors import InvalidOption
from quarry.samples import particles
from tests.plan.harness import assert_same_rows, duckdb_answer

ROWS = 1_000_000  # four slices a partition on the host profile
SLICE_OVERHEAD_BYTES = 1024  # a one-column IPC stream's schema and batch headers, generously


@pytest.fixture(scope="module")
def stored(cluster):
    table = particles.table(ROWS, seed=5)
    cluster.ingest(table, "physics/cols_plain", partitions=3)
    cluster.ingest(table, "physics/cols_sorted", partitions=3, cluster_by="ke")
    yield cluster, table
    for name in ("physics/cols_plain", "physics/cols_sorted"):
        cluster.drop(name)


def _expected(table, sql):
    return duckdb_answer(table, "t", sql.format(t="t"))


@pytest.mark.parametrize("mode", ["always", "never"])
def test_a_sum_over_one_column_reads_only_that_column(stored, mode):
    cluster, table = stored
    x = particles.ke_threshold(0.01)
    sql = "SELECT sum(ke) AS s FROM {t} WHERE ke > " + str(x)
    explained = cluster.explain(sql.format(t="cols_plain"), analyze=True, pushdown=mode)
    slices = sum(p.counters.slices_scanned for p in explained.analyze.partitions)
    ke_bytes = 8 * ROWS
    read = explained.analyze.bytes_read
    assert ke_bytes <= read <= ke_bytes + slices * SLICE_OVERHEAD_BYTES, (read, slices)
    assert read < table.nbytes / 4  # the other four columns stayed on the drives
    result = cluster.sql(sql.format(t="cols_plain"), pushdown=mode).read_all()
    assert result.column("s")[0].as_py() == pytest.approx(
        _expected(table, sql).column("s")[0].as_py(), rel=1e-9
    )


@pytest.mark.parametrize("select", ["*", "sum(ke) AS s, count(*) AS n"])
def test_a_clustered_dataset_answers_the_same_and_skips_slices(stored, select):
    cluster, table = stored
    sql = f"SELECT {select} FROM {{t}} WHERE ke > {particles.ke_threshold(0.01)}"
    expected = _expected(table, sql)
    for mode in ("never", "always", "auto"):
        for name in ("cols_plain", "cols_sorted"):
            result = cluster.sql(sql.format(t=name), pushdown=mode).read_all()
            assert_same_rows(result, expected, ordered=False, context=f"{name} {mode}")
    plain = cluster.explain(sql.format(t="cols_plain"), analyze=True, pushdown="always")
    clustered = cluster.explain(sql.format(t="cols_sorted"), analyze=True, pushdown="always")
    pruned = sum(p.counters.slices_pruned for p in clustered.analyze.partitions)
    total = sum(p.counters.slices_total for p in clustered.analyze.partitions)
    # 1% of the rows: the top slice of each partition (a second where the threshold falls
    # on a slice boundary)
    assert total - pruned <= 3 + 1, (pruned, total)
    assert sum(p.counters.slices_pruned for p in plain.analyze.partitions) == 0
    assert clustered.analyze.bytes_read < plain.analyze.bytes_read / 4


def test_cluster_by_is_checked_and_described(stored):
    cluster, table = stored
    assert cluster.describe("physics/cols_sorted").cluster_by == ("ke",)
    assert cluster.describe("physics/cols_plain").cluster_by == ()
    with pytest.raises(InvalidOption, match="no such column"):
        cluster.ingest(table, "physics/cols_bad", cluster_by="energy")
    assert "physics/cols_bad" not in {d.dataset for d in cluster.datasets()}
