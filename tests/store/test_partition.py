import pyarrow as pa
import pytest

from quarry.errors import DatasetExists, VersionConflict
from quarry.store import naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore


def _meta(schema, compression="none", partition=0, ingest_id="t1"):
    return partitions.PartitionMeta(
        domain="d",
        dataset="n",
        partition=partition,
        ingest={
            "id": ingest_id,
            "first_partition": 0,
            "partitions": 1,
            "replicas": 1,
            "mode": "create",
            "created_at": 0.0,
        },
        schema=schema,
        compression=compression,
        metadata={"lab": "x"},
    )


def _table(rows=10_000):
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "v": pa.array([float(i % 97) for i in range(rows)]),
            "s": pa.array([f"s{i % 13}" if i % 11 else None for i in range(rows)]),
        }
    )


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_write_commit_read_round_trip(tmp_path, compression):
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    table = _table()
    writer = partitions.PartitionWriter(store, _meta(table.schema, compression))
    for batch in table.to_batches(max_chunksize=777):
        writer.write(batch)
    writer.finish()
    assert partitions.inventory(store) == []  # pending: invisible
    assert partitions.commit(store, "t1", "dev0") == [0]
    meta = partitions.read_meta(store, "d", "n", 0)
    assert meta.rows == 10_000 and len(meta.slices) > 3
    assert all(s.bytes_stored <= 16 * 1024 * s.stripes for s in meta.slices)
    back = pa.Table.from_batches(list(partitions.read_slices(store, meta)))
    assert back.equals(table)
    # zone maps describe each slice exactly
    first = meta.slices[0].zone_map
    assert first["id"]["min"] == 0 and first["id"]["max"] == meta.slices[0].rows - 1
    assert first["s"]["null_count"] > 0
    assert meta.metadata == {"lab": "x"}
    keys = store.list("d/n/0000/")
    assert keys[0] == "d/n/0000/00000000" and keys[-1] == "d/n/0000/meta"


def test_large_slice_is_striped(tmp_path):
    store = KeyValueStore(tmp_path, kv_bytes_max=4096)
    wide = pa.table({"text": pa.array(["x" * 10_000])})  # one row larger than a key-value
    writer = partitions.PartitionWriter(store, _meta(wide.schema))
    writer.write(wide.to_batches()[0])
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    meta = partitions.read_meta(store, "d", "n", 0)
    assert meta.slices[0].stripes >= 3
    assert store.list("d/n/0000/00000000.")[:2] == [
        "d/n/0000/00000000.000",
        "d/n/0000/00000000.001",
    ]
    assert partitions.read_slice(store, meta, 0).column("text")[0].as_py() == "x" * 10_000


def test_debris_of_unfinished_ingest_is_collected(tmp_path):
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    before = store.count()
    writer = partitions.PartitionWriter(store, _meta(_table().schema))
    writer.write(_table().to_batches()[0])  # then "the process dies": no finish, no commit
    assert store.count() > before
    from quarry.device.janitor import resolve

    # its record names no decider (a failed ingest of old): debris, aborted when settled
    assert resolve(store, "dev0", startup=True) == {"t1": "aborted"}
    assert store.count() == before


def test_second_writer_of_a_committed_partition_is_refused(tmp_path):
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    table = _table(100)
    w = partitions.PartitionWriter(store, _meta(table.schema))
    w.write(table.to_batches()[0])
    w.finish()
    partitions.commit(store, "t1", "dev0")
    with pytest.raises(DatasetExists):
        partitions.PartitionWriter(store, _meta(table.schema, ingest_id="t2")).write(
            table.to_batches()[0]
        )


def test_update_slice_compare_and_swap(tmp_path):
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    table = _table(100)
    w = partitions.PartitionWriter(store, _meta(table.schema))
    w.write(table.to_batches()[0])
    w.finish()
    partitions.commit(store, "t1", "dev0")
    new = table.slice(0, 10).to_batches()[0]
    assert partitions.update_slice(store, "d", "n", 0, 0, new, expected_version=1) == 2
    before = {k: store.get(k) for k in store.list("d/")}
    with pytest.raises(VersionConflict):
        partitions.update_slice(store, "d", "n", 0, 0, table.slice(0, 5).to_batches()[0], 1)
    assert {k: store.get(k) for k in store.list("d/")} == before  # the loser changed nothing
    meta = partitions.read_meta(store, "d", "n", 0)
    assert meta.rows == 10 and meta.slices[0].version == 2


def test_slice_names_follow_the_convention():
    assert naming.slice_key("bio", "pbmc", 3, 12) == "bio/pbmc/0003/00000012"
    assert naming.stripe_key("bio/pbmc/0003/00000012", 2) == "bio/pbmc/0003/00000012.002"
    assert naming.meta_key("bio", "pbmc", 3) == "bio/pbmc/0003/meta"
    with pytest.raises(ValueError, match="DOMAIN/NAME"):
        naming.split_dataset("nodomain")
    with pytest.raises(ValueError, match="invalid dataset name"):
        naming.split_dataset("bio/bad-name")


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("slice_rows", [10_000, 200])  # striped across key-values, and not
def test_columns_read_as_byte_ranges(tmp_path, compression, slice_rows):
    """A device reads only the columns asked for: the bytes taken off the store are their
    streams', and the rows are the same as when the slice is read whole."""
    store = KeyValueStore(tmp_path, kv_bytes_max=8 * 1024)
    table = _table()
    writer = partitions.PartitionWriter(store, _meta(table.schema, compression), slice_rows)
    writer.write(table.combine_chunks().to_batches()[0])
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    meta = partitions.read_meta(store, "d", "n", 0)
    for number, info in enumerate(meta.slices):
        whole = partitions.read_slice(store, meta, number)
        for columns in (["v"], ["s", "id"], ["id", "v"], ["s"]):
            part = partitions.read_slice(store, meta, number, columns)
            assert part.schema.names == columns
            assert part.equals(whole.select(columns))
            read = partitions.read_bytes(meta, number, columns)
            assert read == sum(info.columns[table.schema.get_field_index(c)] for c in columns)
            assert read < info.bytes_stored
        assert partitions.read_bytes(meta, number) == info.bytes_stored
    assert any(info.stripes > 1 for info in meta.slices) == (slice_rows == 10_000)
    # worked out once per set of columns, again when a writer's metadata has grown
    sizes = partitions.whole_read_bytes(meta, ["v"])
    assert sizes == tuple(partitions.read_bytes(meta, n, ["v"]) for n in range(len(sizes)))
    meta.slices.append(meta.slices[0])
    assert len(partitions.whole_read_bytes(meta, ["v"])) == len(sizes) + 1


def test_a_damaged_column_range_is_a_corrupt_slice(tmp_path):
    from quarry.errors import CorruptSlice, QueryError

    store = KeyValueStore(tmp_path, kv_bytes_max=1 << 20)
    table = _table(1000)
    writer = partitions.PartitionWriter(store, _meta(table.schema))
    writer.write(table.combine_chunks().to_batches()[0])
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    meta = partitions.read_meta(store, "d", "n", 0)
    key = naming.slice_key("d", "n", 0, 0)
    value = bytearray(store.get(key)[0])
    start = meta.slices[0].columns[0]  # the second column's stream
    value[start + 8 : start + 40] = b"\xff" * 32
    store.put(key, bytes(value))
    assert partitions.read_slice(store, meta, 0, ["id"]).num_rows == 1000  # untouched column
    with pytest.raises(CorruptSlice, match="column v"):
        partitions.read_slice(store, meta, 0, ["v"])
    with pytest.raises(QueryError, match="no column nope"):
        partitions.read_slice(store, meta, 0, ["nope"])


def test_a_clustered_partition_is_stored_sorted_by_its_column(tmp_path):
    """--cluster-by: each partition sorted (stable, nulls last), so each slice's zone map holds a
    narrow range of the column and a range predicate skips most slices."""
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    table = _table(5000)
    meta = _meta(table.schema)
    meta.ingest["cluster_by"] = "v"
    writer = partitions.PartitionWriter(store, meta)
    for batch in table.to_batches(max_chunksize=333):
        writer.write(batch)
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    meta = partitions.read_meta(store, "d", "n", 0)
    back = pa.Table.from_batches(list(partitions.read_slices(store, meta)))
    assert back.equals(table.sort_by([("v", "ascending")]))  # stable: ids in order within v
    maxima = [s.zone_map["v"]["max"] for s in meta.slices]
    assert maxima == sorted(maxima) and len(meta.slices) > 3
    assert all(s.zone_map["v"]["min"] >= prev for s, prev in zip(meta.slices[1:], maxima))


def test_columns_read_in_place_lie_on_the_engines_alignment(tmp_path):
    """Each uncompressed column's largest buffer lies on a 16-byte boundary of the memory map,
    so the engine takes it as it is (a decimal misaligned, it copies it)."""
    from decimal import Decimal

    from quarry.store import codec

    store = KeyValueStore(tmp_path, kv_bytes_max=1 << 20)
    table = _table(5000).append_column(
        "d", pa.array([Decimal(i) / 100 for i in range(5000)], pa.decimal128(15, 2))
    )
    table = table.append_column("e", pa.array([None if i % 3 else 1.5 for i in range(5000)]))
    writer = partitions.PartitionWriter(store, _meta(table.schema))
    writer.write(table.combine_chunks().to_batches()[0])
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    meta = partitions.read_meta(store, "d", "n", 0)
    snapshot = store.snapshot()
    names = table.schema.names
    for number in range(len(meta.slices)):
        fetched = partitions.fetch_slice(store, meta, number, names, snapshot)
        batch = partitions.decode_read(meta, fetched)
        for column in batch.columns:
            largest = max((b for b in column.buffers() if b is not None), key=lambda b: b.size)
            assert largest.address % codec.ALIGNMENT == 0, column.type
        assert batch.equals(
            table.slice(sum(s.rows for s in meta.slices[:number]), batch.num_rows)
            .combine_chunks()
            .to_batches()[0]
        )


def _stored(store, table, ingest_id="t1", copy=False):
    writer = partitions.PartitionWriter(store, _meta(table.schema, ingest_id=ingest_id), copy=copy)
    for batch in table.to_batches(max_chunksize=1000):
        writer.write(batch)
    writer.finish()
    return partitions.commit(store, ingest_id, "dev0")


def test_a_moved_partition_leaves_the_inventory_and_its_rows_stay_a_grace(tmp_path):
    """Retired (moved elsewhere), a partition is out of the inventory at once; its rows stay
    for work planned before the move until the grace has passed; a copy coming back before then
    replaces them; a partition of another ingest under the same name is never retired."""
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    table = _table(5000)
    assert _stored(store, table) == [0]
    assert not partitions.retire(store, "d", "n", 0, "another", now=100.0)
    assert partitions.retire(store, "d", "n", 0, "t1", now=100.0)
    assert partitions.inventory(store) == []
    meta = partitions.read_meta(store, "d", "n", 0)  # a query planned before the move
    assert pa.Table.from_batches(list(partitions.read_slices(store, meta))).equals(table)
    assert partitions.purge_retired(store, keep_s=60.0, now=150.0) == 0
    assert partitions.purge_retired(store, keep_s=60.0, now=161.0) == 1
    assert store.list("d/n/") == [] and store.list(naming.RETIRED_PREFIX) == []

    assert _stored(store, table) == [0]
    assert partitions.retire(store, "d", "n", 0, "t1", now=200.0)
    assert _stored(store, table, copy=True) == [0]  # moved back within the grace
    assert partitions.purge_retired(store, keep_s=0.0, now=300.0) == 0  # not retired now
    meta = partitions.read_meta(store, "d", "n", 0)
    assert pa.Table.from_batches(list(partitions.read_slices(store, meta))).equals(table)


def test_the_holders_a_copy_remembers_change_with_a_move(tmp_path):
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    _stored(store, _table(100))
    assert not partitions.set_holders(store, "d", "n", 0, "another", ["dev1", "dev4"])
    assert partitions.set_holders(store, "d", "n", 0, "t1", ["dev1", "dev4"])
    (summary,) = partitions.inventory(store)
    assert summary["ingest"]["placement"] == {"0": ["dev1", "dev4"]}
    assert partitions.read_meta(store, "d", "n", 0).ingest["placement"] == {"0": ["dev1", "dev4"]}


def test_only_writes_a_query_could_see_change_the_visible_count(tmp_path):
    """A device's catalog generation follows ``visible_writes``: a copy streaming in, its
    commit, a lease renewed and the holders told leave it; an ingest's commit and a
    partition moved away change it."""
    store = KeyValueStore(tmp_path, kv_bytes_max=16 * 1024)
    before = store.visible_writes()
    writer = partitions.PartitionWriter(store, _meta(_table(100).schema), copy=True)
    writer.write(_table(100).to_batches()[0])
    writer.finish()
    partitions.renew(store, "t1", 30.0)
    assert partitions.commit(store, "t1", "dev0") == [0]
    partitions.set_holders(store, "d", "n", 0, "t1", ["dev0"])
    assert store.visible_writes() == before and store.writes() > before
    partitions.retire(store, "d", "n", 0, "t1", now=1.0)
    assert store.visible_writes() == before + 2
    _stored(store, _table(100), ingest_id="t2")
    assert store.visible_writes() == before + 4
