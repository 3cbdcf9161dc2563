"""Aggregates answered from slice statistics on real devices: slices every row of which passes
are answered from their zone maps and not read; the answer is DuckDB's in every mode, and
EXPLAIN ANALYZE says which slices were answered."""

from __future__ import annotations

import pytest

from quarry.coordinator.query.explain import Explain
from quarry.protocol.counters import WorkCounters
from quarry.samples import particles
from tests.plan.harness import assert_same_rows, duckdb_answer

ROWS = 600_000  # a few slices a partition on the host profile
AGGREGATE = "count(*) AS n, sum(ke) AS s, min(x) AS lo, max(id) AS hi, count(ke) AS c"


@pytest.fixture(scope="module")
def stored(cluster):
    table = particles.table(ROWS, seed=8)
    cluster.ingest(table, "physics/stats_plain", partitions=3)
    cluster.ingest(table, "physics/stats_sorted", partitions=3, cluster_by="ke")
    yield cluster, table
    for name in ("physics/stats_plain", "physics/stats_sorted"):
        cluster.drop(name)


def _duckdbs_in_every_mode(stored, sql: str, name: str) -> None:
    cluster, table = stored
    expected = duckdb_answer(table, "t", sql.format(t="t"))
    for mode in ("always", "auto", "never"):
        got = cluster.sql(sql.format(t=name), pushdown=mode).read_all()
        assert_same_rows(got, expected, ordered=True, context=mode)


def _totals(explained: Explain) -> WorkCounters:
    return WorkCounters.sum(p.counters for p in explained.analyze.partitions)


@pytest.mark.parametrize("where", ["", " WHERE ke > 0 AND id >= 0"])
def test_an_aggregate_every_row_passes_reads_nothing(stored, where):
    cluster, _ = stored
    sql = f"SELECT {AGGREGATE} FROM {{t}}{where}"
    _duckdbs_in_every_mode(stored, sql, "stats_plain")
    answered = cluster.explain(sql.format(t="stats_plain"), analyze=True, pushdown="always")
    totals = _totals(answered)
    assert totals.slices_answered == totals.slices_total > 0, totals
    assert answered.analyze.bytes_read == 0
    # the host asked for the rows as stored: nothing is answered for it
    read = cluster.explain(sql.format(t="stats_plain"), analyze=True, pushdown="never")
    assert _totals(read).slices_answered == 0
    assert read.analyze.bytes_read >= 8 * ROWS


def test_slices_that_pass_in_part_are_read_and_the_rest_answered(stored):
    cluster, _ = stored
    sql = f"SELECT {AGGREGATE} FROM {{t}} WHERE ke > {particles.ke_threshold(0.6)}"
    _duckdbs_in_every_mode(stored, sql, "stats_sorted")
    totals = _totals(cluster.explain(sql.format(t="stats_sorted"), analyze=True))
    # sorted by ke: the slices above the threshold are answered, and only those across it
    # (one a partition) read
    assert totals.slices_answered > 0, totals
    assert 0 < totals.slices_scanned <= 3, totals
    assert totals.slices_answered + totals.slices_scanned + totals.slices_pruned == (
        totals.slices_total
    )


def test_an_aggregate_of_an_expression_is_read(stored):
    cluster, table = stored
    sql = "SELECT sum(ke * 2) AS s FROM {t}"
    got = cluster.sql(sql.format(t="stats_plain")).read_all()
    assert_same_rows(got, duckdb_answer(table, "t", sql.format(t="t")), ordered=True)
    totals = _totals(cluster.explain(sql.format(t="stats_plain"), analyze=True))
    assert totals.slices_answered == 0 and totals.slices_scanned == totals.slices_total
