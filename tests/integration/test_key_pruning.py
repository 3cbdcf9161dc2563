"""A join's keys prune the slices of its probe whose zone maps hold none of them, where that
pays (the probe stored in key order), and never change the answer."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

ROWS = 600_000  # past the probe size a join's keys are sent for (``PROBE_ROWS_MIN``)
KEYS = 6_000
WANTED = range(1_000, 1_030)  # 30 keys of 6,000: TPC-DS Q21's dates of inventory
SQL = (
    "SELECT d.tag, count(*) AS n, sum(f.v) AS total FROM pruning.{facts} f "
    "JOIN pruning.dims d ON f.k = d.k WHERE d.tag = 'x' GROUP BY d.tag"
)


@pytest.fixture(scope="module")
def tables(cluster):
    rng = np.random.default_rng(7)
    keys = np.repeat(np.arange(KEYS), ROWS // KEYS)
    wide = {f"w{i}": rng.integers(0, 1 << 40, len(keys)) for i in range(6)}  # ~10 slices
    ordered = pa.table({"k": keys, "v": rng.integers(0, 1000, len(keys)), **wide})
    scattered = ordered.take(rng.permutation(len(keys)))
    tags = np.where(np.isin(np.arange(KEYS), list(WANTED)), "x", "y")
    dims = pa.table({"k": np.arange(KEYS), "tag": tags})
    for name, table in (("ordered", ordered), ("scattered", scattered), ("dims", dims)):
        cluster.ingest(table, f"pruning/{name}", contiguous_slices=True)
    yield {"ordered": ordered, "scattered": scattered, "dims": dims}
    for name in ("ordered", "scattered", "dims"):
        cluster.drop(f"pruning/{name}")


def _expected(tables, facts: str) -> pa.Table:
    con = duckdb.connect()
    con.register("f", tables[facts])
    con.register("d", tables["dims"])
    sql = SQL.replace("pruning.{facts}", "f").replace("pruning.dims", "d")
    return con.execute(sql).fetch_arrow_table()


def _pruned(cluster, facts: str, pushdown: str) -> tuple[pa.Table, int, int]:
    planned = cluster.query(SQL.format(facts=facts), pushdown=pushdown)
    answer = planned.execute().read_all()
    analyzed = planned.explain(analyze=True)
    outcomes = [f.outcome for f in analyzed.join_filters]
    assert pushdown == "never" or any(o.startswith("sent") for o in outcomes), outcomes
    devices = analyzed.analyze.devices
    pruned = sum(d.counters.slices_pruned for d in devices)
    scanned = sum(d.counters.slices_scanned for d in devices)
    return answer, pruned, scanned


@pytest.mark.slow
def test_a_probe_in_key_order_reads_only_the_slices_that_hold_a_key(cluster, tables):
    expected = _expected(tables, "ordered")
    for pushdown in ("always", "auto", "never"):
        answer, pruned, scanned = _pruned(cluster, "ordered", pushdown)
        assert answer.to_pylist() == expected.to_pylist(), pushdown
        if pushdown != "never":
            assert pruned > 0 and scanned < pruned, (pushdown, pruned, scanned)


@pytest.mark.slow
def test_a_probe_whose_keys_are_everywhere_is_read_whole(cluster, tables):
    expected = _expected(tables, "scattered")
    answer, pruned, scanned = _pruned(cluster, "scattered", "always")
    assert answer.to_pylist() == expected.to_pylist()
    assert pruned == 0 and scanned > 0
