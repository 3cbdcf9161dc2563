"""Ray Data reading a quarry cluster: one read task per partition, pushdown, DuckDB's answers."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import ray
from ray.data.expressions import col

import quarry
from quarry.ray import QuarryDatasource, read_dataset
from quarry.ray.datasource import sql_of
from quarry.samples import particles
from tests.plan.harness import assert_same_rows

ROWS = 200_000
PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster_and_ray():
    """Three devices with the particles in four partitions, and a local Ray of two CPUs."""
    with quarry.local(devices=3) as cluster:
        table = particles.table(ROWS, seed=21)
        cluster.ingest(table, "physics/particles", partitions=PARTITIONS)
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 << 20,
                 log_to_driver=False)  # fmt: skip
        try:
            yield cluster, table
        finally:
            ray.shutdown()


def duck(table: pa.Table, sql: str) -> pa.Table:
    connection = duckdb.connect()
    connection.register("particles", table)
    return connection.execute(sql).fetch_arrow_table()


@pytest.mark.slow
def test_one_task_per_partition_ships_only_the_selected_rows_and_columns(cluster_and_ray):
    cluster, table = cluster_and_ray
    source = QuarryDatasource(cluster.cluster_file, "physics/particles", columns=["id", "ke"],
                              filter="ke > 3")  # fmt: skip
    assert len(source.get_read_tasks(parallelism=2)) == PARTITIONS
    got = pa.concat_tables(ray.get(ray.data.read_datasource(source).to_arrow_refs()))
    expected = duck(table, "SELECT id, ke FROM particles WHERE ke > 3")
    assert_same_rows(got, expected, ordered=False)
    moved = source.moved()
    assert sorted(moved["partitions"]) == list(range(PARTITIONS))
    assert moved["rows"] == expected.num_rows
    selected = expected.num_rows * 2 * 8  # two 8-byte columns of the rows that pass
    assert selected <= moved["bytes_shipped"] < 1.2 * selected + 64 * 1024
    assert moved["bytes_read"] >= 2 * 8 * ROWS  # the devices read both columns, nothing else
    assert moved["bytes_read"] < 3 * 8 * ROWS


def test_rays_filter_and_select_are_pushed_into_the_query(cluster_and_ray, capsys):
    cluster, table = cluster_and_ray
    ds = (
        read_dataset(cluster.cluster_file, "physics/particles")
        .filter(expr=(col("x") < 50) & (col("ke") > 2))
        .select_columns(["id", "x"])
    )
    got = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    expected = duck(table, "SELECT id, x FROM particles WHERE x < 50 AND ke > 2")
    assert_same_rows(got, expected, ordered=False)
    ds.explain()
    optimized = capsys.readouterr().out.split("Logical Plan (Optimized)")[1].split("Physical")[0]
    assert "ReadQuarry" in optimized  # the filter and the projection went into the read
    assert "Filter" not in optimized and "Project" not in optimized


@pytest.mark.slow
def test_a_group_by_in_ray_equals_duckdbs(cluster_and_ray):
    cluster, table = cluster_and_ray
    ds = read_dataset(cluster.cluster_file, "physics/particles", columns=["id", "ke"],
                      filter="ke > 0.5")  # fmt: skip
    ds = ds.map_batches(lambda b: {"g": b["id"] % 7, "ke": b["ke"]}, batch_format="numpy")
    got = ds.groupby("g").sum("ke").to_pandas().sort_values("g").reset_index(drop=True)
    expected = duck(table, "SELECT id % 7 AS g, sum(ke) AS s FROM particles WHERE ke > 0.5 "
                    "GROUP BY 1 ORDER BY 1").to_pandas()  # fmt: skip
    assert list(got["g"]) == list(expected["g"])
    np.testing.assert_allclose(got["sum(ke)"], expected["s"], rtol=1e-12)


@pytest.mark.slow
def test_an_aggregate_in_ray_over_the_pushed_scan(cluster_and_ray):
    cluster, table = cluster_and_ray
    ds = read_dataset(cluster.cluster_file, "physics/particles", filter="ke > 1")
    total = ds.sum("ke")
    expected = duck(table, "SELECT sum(ke) AS s FROM particles WHERE ke > 1")["s"][0].as_py()
    assert np.isclose(total, expected, rtol=1e-12)


def test_ray_expressions_become_quoted_typed_sql():
    assert sql_of((col("ke") > 3) & ~col("x").is_null()) == '(("ke" > 3) AND (NOT ("x" IS NULL)))'
    assert sql_of(col("name") == "O'Brien") == "(\"name\" = 'O''Brien')"
    assert sql_of(col("id").is_in([1, 2])) == '("id" IN (1, 2))'


@pytest.mark.slow
def test_a_predicate_sql_cannot_say_is_evaluated_by_the_read_task(cluster_and_ray):
    cluster, table = cluster_and_ray
    ds = read_dataset(cluster.cluster_file, "physics/particles", columns=["id", "ke"])
    got = pa.concat_tables(ray.get(ds.filter(expr=col("ke").log2() > 1).to_arrow_refs()))
    expected = duck(table, "SELECT id, ke FROM particles WHERE log2(ke) > 1")
    assert_same_rows(got, expected, ordered=False)


def test_only_row_local_queries_are_read_by_partition(cluster_and_ray):
    from quarry.coordinator.reads.partition_read import read_partition
    from quarry.errors import QueryError

    cluster, _ = cluster_and_ray
    with pytest.raises(QueryError, match="filters and projects rows only"):
        read_partition(cluster, "SELECT count(*) FROM physics.particles", 0)
