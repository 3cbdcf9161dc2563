"""Checksums on stored values: every column stream of every slice and every metadata slice is
checked when it is read, whatever damaged it (a flipped bit, a value cut short, a stale one), and
damage is a ``CorruptSlice`` naming the copy, never rows."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest

from quarry.errors import CorruptSlice
from quarry.protocol.control import PartitionDescription
from quarry.store import checksum, codec, mend, naming, stored
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore
from tests.store.test_partition import _meta


def _ones(rows: int = 20_000) -> pa.Table:
    return pa.table({"id": pa.array(range(rows), pa.int64()), "v": pa.array([1.0] * rows)})


def _stored(tmp_path, compression: str = "none", kv_bytes_max: int = 64 << 10) -> KeyValueStore:
    store = KeyValueStore(tmp_path, kv_bytes_max=kv_bytes_max)
    table = _ones()
    writer = partitions.PartitionWriter(store, _meta(table.schema, compression))
    for batch in table.to_batches(max_chunksize=3000):
        writer.write(batch)
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    return store


def test_seal_and_unseal_a_value():
    body = b'{"a":1}'
    sealed = checksum.seal(body)
    assert checksum.is_sealed(sealed) and checksum.unseal(sealed, "x") == (body, True)
    assert checksum.unseal(body, "x") == (body, False)  # written before checksums
    damaged = bytearray(sealed)
    damaged[-2] ^= 0x01
    with pytest.raises(CorruptSlice, match="the thing: checksum mismatch"):
        checksum.unseal(bytes(damaged), "the thing")
    with pytest.raises(CorruptSlice, match="neither"):
        checksum.unseal(b"\x00" + body, "x")


def test_check_reads_lengths_and_digests_of_any_buffer():
    data = bytes(range(256)) * 100
    expected = checksum.digest(data)
    for view in (data, memoryview(data), pa.py_buffer(data)):
        assert checksum.check(view, len(data), expected, "c")
    assert not checksum.check(data, len(data), None, "c")  # nothing to check against
    with pytest.raises(CorruptSlice, match="cut short"):
        checksum.check(data[:-1], len(data), expected, "c")
    with pytest.raises(CorruptSlice, match="mismatch"):
        checksum.check(data[::-1], len(data), expected, "c")


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_codec_round_trip_keeps_a_checksum_per_column_stream(tmp_path, compression):
    store = _stored(tmp_path, compression)
    meta = partitions.read_meta(store, "d", "n", 0)
    assert meta.verified and len(meta.slices) > 2
    for number, info in enumerate(meta.slices):
        key = naming.slice_key("d", "n", 0, number)
        value = codec.unstripe(store.get_many(naming.slice_value_keys(key, info.stripes)))
        assert info.checksums == checksum.of_columns(value, info.columns)
    back = pa.Table.from_batches(list(partitions.read_slices(store, meta)))
    assert back.equals(_ones())
    # a describe carries them, typed
    slices = meta.to_json()["slices"]
    described = PartitionDescription.from_json({"summary": meta.summary(), "slices": slices})
    assert described.slices[0].checksums == meta.slices[0].checksums
    assert described.summary.verified


def test_a_flipped_value_is_a_corrupt_slice_naming_the_copy(tmp_path):
    """The issue's experiment at the store: one float64 1.0 of column v turned into 2.0."""
    store = _stored(tmp_path)
    meta = partitions.read_meta(store, "d", "n", 0)
    key = naming.slice_key("d", "n", 0, 1)
    value = bytearray(store.get(key)[0])
    at = value.find(struct.pack("<d", 1.0) * 4, meta.slices[1].columns[0])
    value[at : at + 8] = struct.pack("<d", 2.0)
    store.put(key, bytes(value))
    assert partitions.read_slice(store, meta, 1, ["id"]).num_rows  # the column left alone
    with pytest.raises(CorruptSlice, match="column v: checksum mismatch") as raised:
        partitions.read_slice(store, meta, 1, ["v"])
    error = raised.value
    assert (error.dataset, error.partition, error.slice, error.device) == ("d/n", 0, 1, "dev0")
    assert error.part == "slice"
    with pytest.raises(CorruptSlice):  # as stored, for another to decode: checked first
        partitions.read_stored(store, meta, 1, ["v"])


def test_a_truncated_value_is_a_corrupt_slice(tmp_path):
    store = _stored(tmp_path, "zstd")
    meta = partitions.read_meta(store, "d", "n", 0)
    key = naming.slice_key("d", "n", 0, 0)
    store.put(key, store.get(key)[0][:-20])
    with pytest.raises(CorruptSlice, match="cut short|mismatch"):
        partitions.read_slice(store, meta, 0)


def test_a_damaged_metadata_slice_is_never_read_as_one(tmp_path):
    """A zone map's max turned from 1.0 into 2.0 in the stored JSON: a statistics answer would
    say 2.0; the checksum refuses it, and the catalog entry is rebuilt from nothing damaged."""
    store = _stored(tmp_path)
    key = naming.meta_key("d", "n", 0)
    value = store.get(key)[0]
    assert b'"max":1.0' in value
    store.put(key, value.replace(b'"max":1.0', b'"max":2.0', 1))
    with pytest.raises(CorruptSlice, match="the metadata slice of partition 0 of d/n") as raised:
        partitions.read_meta(store, "d", "n", 0)
    assert raised.value.part == "metadata" and raised.value.slice is None
    assert raised.value.on("dev7").device == "dev7"
    assert len(partitions.inventory(store)) == 1  # the catalog entry is intact
    catalog = partitions._catalog_key("d", "n", 0)
    store.put(catalog, store.get(catalog)[0][:-3])
    damaged: list[CorruptSlice] = []
    assert partitions.inventory(store, damaged) == []  # neither can describe it
    assert [e.part for e in damaged] == ["catalog", "metadata"]


def test_a_catalog_entry_that_fails_its_check_is_rebuilt(tmp_path):
    store = _stored(tmp_path)
    catalog = partitions._catalog_key("d", "n", 0)
    store.put(catalog, store.get(catalog)[0].replace(b'"rows":20000', b'"rows":20001'))
    damaged: list[CorruptSlice] = []
    (entry,) = partitions.inventory(store, damaged)
    assert entry["rows"] == 20_000 and [e.part for e in damaged] == ["catalog"]
    meta = partitions.read_meta(store, "d", "n", 0)
    assert not mend.catalog_agrees(store, meta)
    mend.rewrite_catalog(store, "d", "n", 0)
    assert mend.catalog_agrees(store, meta)


def test_a_partition_written_before_checksums_reads_unverified(tmp_path):
    """Bare JSON metadata, slices without checksums: read as before, and said so."""
    store = _stored(tmp_path)
    meta = partitions.read_meta(store, "d", "n", 0)
    body = meta.to_json()
    for entry in body["slices"]:
        del entry["checksums"]
    del body["verified"]
    with store.transaction() as txn:
        txn.put(naming.meta_key("d", "n", 0), json.dumps(body).encode())
    old = partitions.read_meta(store, "d", "n", 0)
    assert not old.verified and old.slices[0].checksums is None
    assert pa.Table.from_batches(list(partitions.read_slices(store, old))).equals(_ones())


def test_repairing_one_slice_keeps_its_version_and_restores_its_checksum(tmp_path):
    store = _stored(tmp_path)
    meta = partitions.read_meta(store, "d", "n", 0)
    good = partitions.read_slice(store, meta, 2)
    key = naming.slice_key("d", "n", 0, 2)
    store.put(key, store.get(key)[0][:100])
    with pytest.raises(CorruptSlice):
        partitions.read_slice(store, meta, 2)
    assert mend.rewrite_slice(store, "d", "n", 0, 2, good, version=1) == 1
    mended = partitions.read_meta(store, "d", "n", 0)
    assert mended.slices[2].version == 1
    assert partitions.read_slice(store, mended, 2).equals(good)
    with pytest.raises(Exception, match="rows"):
        mend.rewrite_slice(store, "d", "n", 0, 2, good.slice(1), version=1)


def test_slices_shipped_as_stored_carry_their_checksums_to_the_receiver(tmp_path):
    store = _stored(tmp_path, "zstd")
    meta = partitions.read_meta(store, "d", "n", 0)
    parts, sums = partitions.read_stored(store, meta, 0, ["v", "id"])
    stream = stored.schema(pa.schema([meta.schema.field("v"), meta.schema.field("id")]))
    shipped = stored.batch(parts, meta.slices[0].rows, stream, sums)
    assert stored.verified(shipped) == 1
    (back,) = stored.decode(shipped)
    assert back.num_rows == meta.slices[0].rows
    flipped = bytearray(parts[0])
    flipped[len(flipped) // 2] ^= 0x10
    broken = stored.batch([bytes(flipped), parts[1]], meta.slices[0].rows, stream, sums)
    with pytest.raises(CorruptSlice, match="shipped as stored: column v: checksum mismatch"):
        stored.decode(broken)


def _blocked(tmp_path, compression: str = "none") -> KeyValueStore:
    """``_stored``'s rows in slices cut into blocks of about 16 KiB (a dataset's hint)."""
    store = KeyValueStore(tmp_path, kv_bytes_max=64 << 10)
    table = _ones()
    meta = _meta(table.schema, compression)
    meta.hints[codec.BLOCK_BYTES_HINT] = 16 << 10
    writer = partitions.PartitionWriter(store, meta)
    for batch in table.to_batches(max_chunksize=3000):
        writer.write(batch)
    writer.finish()
    partitions.commit(store, "t1", "dev0")
    return store


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_some_rows_of_a_blocked_slice_read_only_their_blocks_checked(tmp_path, compression):
    """A blocked slice reads whole as any other; asked for some rows, it reads the column's
    head and the blocks holding them, each checked against its own checksum, and says so in
    the bytes it counts."""
    store = _blocked(tmp_path, compression)
    meta = partitions.read_meta(store, "d", "n", 0)
    info = meta.slices[1]
    assert info.block_rows and len(info.blocks[1]) > 4  # head, three blocks or more, end
    assert pa.Table.from_batches(list(partitions.read_slices(store, meta))).equals(_ones())
    first = sum(s.rows for s in meta.slices[:1])
    rows = (info.block_rows + 3, info.block_rows + 9)  # within the second block
    fetched = partitions.fetch_slice(store, meta, 1, ["v"], rows=rows)
    assert fetched.span == (1, 2) and fetched.bytes_read == partitions.read_bytes(
        meta, 1, ["v"], rows
    )
    if compression == "none":  # zstd makes a block of ones a few bytes: its head outweighs it
        assert fetched.bytes_read < partitions.read_bytes(meta, 1, ["v"]) / 3
    batch = partitions.decode_read(meta, fetched)
    low, high = info.block_rows_of(fetched.span)
    assert batch.equals(_ones().slice(first + low, high - low).select(["v"]).to_batches()[0])
    # one byte of the second block's values damaged: that read refuses it, naming the block
    key = naming.slice_key("d", "n", 0, 1)
    value = bytearray(store.get(key)[0])
    at = info.columns[0] + info.blocks[1][0] + info.blocks[1][1] + info.blocks[1][2] // 2
    value[at] ^= 0x10
    store.put(key, bytes(value))
    with pytest.raises(CorruptSlice, match="column v block 1: checksum mismatch"):
        partitions.decode_read(meta, partitions.fetch_slice(store, meta, 1, ["v"], rows=rows))
    with pytest.raises(CorruptSlice, match="column v: checksum mismatch"):
        partitions.read_slice(store, meta, 1)  # read whole, as a scrub does
    untouched = partitions.fetch_slice(store, meta, 1, ["v"], rows=(0, 2))  # the first block
    assert partitions.decode_read(meta, untouched).num_rows == info.block_rows
