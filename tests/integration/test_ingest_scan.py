"""Ingest from every source kind and scan it back, through real device processes."""

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from quarry.errors import DatasetExists, DatasetNotFound, SchemaMismatch, SourceError


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(table.column_names[0], "ascending")])


def test_parquet_ingest_scan_and_listing(cluster, particle_table, tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(particle_table, path)
    entry = cluster.ingest(path, "physics/parquet_particles", compression="zstd")
    assert entry.rows == particle_table.num_rows
    listed = {d.dataset: d for d in cluster.datasets()}["physics/parquet_particles"]
    assert listed.rows == particle_table.num_rows
    assert sum(v.rows for v in listed.devices.values()) == particle_table.num_rows
    assert len(listed.devices) == 3  # spread over every device
    back = cluster.scan("physics/parquet_particles").read_all()
    assert _sorted(back).equals(_sorted(particle_table))
    cluster.drop("physics/parquet_particles")
    assert "physics/parquet_particles" not in {d.dataset for d in cluster.datasets()}


def test_a_small_table_gets_a_partition_per_row_group_it_fills(cluster):
    """Every partition a query reads costs a stream: a table of a few rows is one partition, a
    larger one a partition per row group it fills, up to one per device."""
    from quarry.coordinator.ingest.layout import PARTITIONS_PER_DEVICE, ROW_GROUP_BYTES

    per_group = ROW_GROUP_BYTES // 8  # int64 rows
    rows = {"t/tiny": 1_000, "t/three": 3 * per_group - 10, "t/large": 13 * per_group}
    expected = {"t/tiny": 1, "t/three": 3, "t/large": PARTITIONS_PER_DEVICE * 3}
    for name, count in rows.items():
        entry = cluster.ingest(pa.table({"k": pa.array(range(count), pa.int64())}), name)
        assert len(entry.partitions) == expected[name], name
        assert sum(p.rows for p in entry.partitions) == count
        cluster.drop(name)


def test_a_table_under_the_partition_size_is_one_partition(cluster, monkeypatch):
    """Rule ``partitions_for`` at its default (the suite sets 0 in conftest.py): a table under
    QUARRY_PARTITION_MIB_MIN is one partition, replicated and erasure coded as asked; with the
    size at 1 MiB, the same table spreads over every device again."""
    from quarry import settings
    from quarry.coordinator.ingest.layout import ROW_GROUP_BYTES

    monkeypatch.delenv(settings.PARTITION_MIB_MIN.name, raising=False)
    rows = 3 * ROW_GROUP_BYTES // 8  # int64 rows: 3 MiB
    table = pa.table({"k": pa.array(range(rows), pa.int64())})
    entry = cluster.ingest(table, "t/small")
    assert [p.rows for p in entry.partitions] == [rows]
    twice = cluster.ingest(table, "t/small_twice", replicas=2)
    assert len(twice.partitions) == 1 and len(set(twice.partitions[0].devices)) == 2
    coded = cluster.ingest(table, "t/small_coded", redundancy="ec:2+1")
    assert len(coded.partitions) == 2 and len(coded.parity) == 1  # a stripe needs K of them
    monkeypatch.setenv(settings.PARTITION_MIB_MIN.name, "1")
    spread = cluster.ingest(table, "t/spread")
    assert len({p.devices[0] for p in spread.partitions}) == 3
    assert cluster.sql("SELECT count(*) AS n FROM t.small").read_all()["n"][0].as_py() == rows
    for name in ("t/small", "t/small_twice", "t/small_coded", "t/spread"):
        cluster.drop(name)


def test_contiguous_slices_hold_one_run_of_the_source_each(cluster):
    """Rule ``contiguous_slices``: rows dealt a slice at a time, so each slice's zone map of a
    column in the source's order spans exactly its rows (1 MiB groups give a slice three or
    four stretches of the source); the source's order still reads back."""
    rows = 30_000  # about 1 KB each: about eight 4 MiB slices over three partitions
    table = pa.table(
        {"k": pa.array(range(rows), pa.int64()), "pad": pa.array([b"x" * 1000] * rows)}
    )
    spans = {}
    for name, contiguous in (("t/runs", True), ("t/groups", False)):
        entry = cluster.ingest(table, name, partitions=3, contiguous_slices=contiguous)
        described = [
            cluster.devices[p.devices[0]].describe("t", name.split("/")[1], p.partition)
            for p in entry.partitions
        ]
        spans[name] = [
            (s.zone_map["k"].max - s.zone_map["k"].min + 1, s.rows)
            for d in described
            for s in d.slices
        ]
        assert sum(len(d.slices) for d in described) >= 6
    assert all(span == held for span, held in spans["t/runs"])
    assert any(span > 2 * held for span, held in spans["t/groups"])
    assert cluster.scan("t/runs", ordered=True).read_all().equals(table)
    cluster.drop("t/runs")
    cluster.drop("t/groups")


@pytest.mark.parametrize("kind", ["csv", "arrow", "table", "pandas"])
def test_other_sources(cluster, kind, tmp_path):
    table = pa.table(
        {
            "k": pa.array(range(5000), pa.int64()),
            "name": [f"n{i}" for i in range(5000)],
            "v": [i * 0.5 for i in range(5000)],
        }
    )
    if kind == "csv":
        source = tmp_path / "t.csv"
        pacsv.write_csv(table, source)
    elif kind == "arrow":
        source = tmp_path / "t.arrow"
        feather.write_feather(table, source)
    elif kind == "table":
        source = table
    else:
        source = table.to_pandas()
    dataset = f"src/{kind}_table"
    cluster.ingest(source, dataset)
    back = cluster.scan(dataset).read_all()
    assert _sorted(back).equals(_sorted(table))
    cluster.drop(dataset)


def test_replicas_place_each_partition_on_distinct_devices(cluster, particle_table):
    entry = cluster.ingest(particle_table.slice(0, 50_000), "physics/replicated", replicas=2)
    assert all(len(set(p.devices)) == 2 for p in entry.partitions)
    assert cluster.scan("physics/replicated").read_all().num_rows == 50_000
    cluster.drop("physics/replicated")


def test_catalog_is_rebuilt_from_devices(cluster, particle_table):
    import quarry

    cluster.ingest(particle_table.slice(0, 1000), "physics/rebuild")
    other = quarry.connect(cluster.cluster_file)  # a fresh coordinator: no state but the file
    try:
        assert other.describe("physics/rebuild").rows == 1000
        assert (
            other.describe("physics/rebuild").version == cluster.describe("physics/rebuild").version
        )
    finally:
        other.close()
    cluster.drop("physics/rebuild")


def test_custom_metadata_travels_with_the_dataset(cluster):
    table = pa.table({"a": [1, 2, 3]})
    cluster.ingest(table, "lab/meta", metadata={"lab": "Stuart", "assay": "10x"})
    assert cluster.describe("lab/meta").metadata == {"lab": "Stuart", "assay": "10x"}
    cluster.drop("lab/meta")


# ---- bad input -----------------------------------------------------------------------------------


def test_missing_file(cluster, tmp_path):
    with pytest.raises(SourceError, match="no file .*missing.parquet"):
        cluster.ingest(tmp_path / "missing.parquet", "bad/missing")


def test_unreadable_file(cluster, tmp_path):
    import os

    path = tmp_path / "secret.csv"
    path.write_text("a,b\n1,2\n")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # running as root: permission bits do not stop us
            pytest.skip("root reads files regardless of permissions")
        with pytest.raises(SourceError, match="permission denied"):
            cluster.ingest(path, "bad/secret")
    finally:
        path.chmod(0o600)


def test_malformed_file_leaves_nothing(cluster, tmp_path):
    path = tmp_path / "broken.csv"
    good = "".join(f"{i},{i * 2}\n" for i in range(200_000))
    path.write_text("a,b\n" + good + "1,2,3,4\n" + good)
    before = {n: c.stats().keys for n, c in cluster.devices.items()}
    with pytest.raises(SourceError, match="broken.csv"):
        cluster.ingest(path, "bad/broken")
    assert "bad/broken" not in {d.dataset for d in cluster.datasets()}
    assert {n: c.stats().keys for n, c in cluster.devices.items()} == before


def test_not_parquet(cluster, tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_text("this is not parquet")
    with pytest.raises(SourceError, match="fake.parquet"):
        cluster.ingest(path, "bad/fake")


def test_existing_name_and_schema_mismatch(cluster):
    cluster.ingest(pa.table({"a": [1, 2], "b": ["x", "y"]}), "bad/exists")
    with pytest.raises(DatasetExists, match="already exists"):
        cluster.ingest(pa.table({"a": [3]}), "bad/exists")
    with pytest.raises(SchemaMismatch, match="column b: int64, expected string"):
        cluster.ingest(pa.table({"a": [3], "b": [4]}), "bad/exists", mode="append")
    cluster.ingest(pa.table({"a": [3], "b": ["z"]}), "bad/exists", mode="append")
    assert cluster.describe("bad/exists").rows == 3
    cluster.drop("bad/exists")
    with pytest.raises(DatasetNotFound, match="no dataset bad/exists"):
        cluster.describe("bad/exists")


def test_invalid_dataset_name(cluster):
    with pytest.raises(ValueError, match="DOMAIN/NAME"):
        cluster.ingest(pa.table({"a": [1]}), "nodomain")


def test_categorical_columns_are_stored_decoded(cluster):
    import pandas as pd

    frame = pd.DataFrame({"label": pd.Categorical(["b", "a", "b", "c"]), "v": [1, 2, 3, 4]})
    cluster.ingest(frame, "src/categorical")
    back = cluster.scan("src/categorical").read_all().sort_by("v")
    assert back.column("label").to_pylist() == ["b", "a", "b", "c"]
    assert back.schema.field("label").type == pa.string()
    cluster.drop("src/categorical")


def test_parallel_scan_ordered_scan_and_early_close(cluster, particle_table):
    cluster.ingest(particle_table, "physics/scan_modes")
    parallel = cluster.scan("physics/scan_modes").read_all()
    ordered = cluster.scan("physics/scan_modes", ordered=True).read_all()
    assert parallel.num_rows == ordered.num_rows == particle_table.num_rows
    assert parallel.sort_by("id").equals(ordered.sort_by("id"))
    assert ordered.equals(particle_table)  # ordered: the source's own order, row for row
    reader = cluster.scan("physics/scan_modes")
    reader.read_next_batch()
    reader.close()  # the producers stop; nothing hangs
    cluster.drop("physics/scan_modes")


def test_an_ordered_scan_gives_the_source_back_across_appends(cluster):
    import numpy as np

    from quarry.samples import particles

    first = particles.table(300_000, seed=31)
    more = particles.table(50_000, seed=32)
    more = more.set_column(0, more.schema.field("id"), pa.array(np.arange(300_000, 350_000)))
    cluster.ingest(first, "physics/order", partitions=7)
    cluster.ingest(more, "physics/order", mode="append", partitions=3)
    records = cluster.entry("physics/order").ingests
    assert all(r.group_rows > 0 for r in records)
    assert first.num_rows > 7 * records[0].group_rows  # several groups per partition
    back = cluster.scan("physics/order", ordered=True).read_all()
    assert back.equals(pa.concat_tables([first, more]))
    cluster.drop("physics/order")
