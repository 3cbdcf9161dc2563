import gc
import threading

import pytest

from quarry.errors import KeyNotFound, ValueTooLarge, VersionConflict
from quarry.store.kv import READERS_MAX, SNAPSHOTS_MAX, KeyValueStore


@pytest.fixture
def store(tmp_path):
    s = KeyValueStore(tmp_path / "kv", kv_bytes_max=1024)
    yield s
    s.close()


def test_put_get_delete_versions(store):
    assert store.put("a/1", b"x") == 1
    assert store.put("a/1", b"y") == 2
    assert store.get("a/1") == (b"y", 2)
    assert store.delete("a/1")
    with pytest.raises(KeyNotFound):
        store.get("a/1")
    assert store.version("a/1") == 0


def test_list_by_prefix_in_key_order(store):
    for key in ["b/2", "a/2", "a/1", "ab/1"]:
        store.put(key, b"v")
    assert store.list("a/") == ["a/1", "a/2"]
    assert store.list("a") == ["a/1", "a/2", "ab/1"]
    assert store.list("a/", limit=1) == ["a/1"]


def test_compare_and_swap(store):
    store.put("k", b"1", expected_version=0)
    with pytest.raises(VersionConflict):
        store.put("k", b"2", expected_version=0)  # must-not-exist fails: it exists
    with pytest.raises(VersionConflict):
        store.put("k", b"2", expected_version=5)
    assert store.put("k", b"2", expected_version=1) == 2
    assert store.get("k") == (b"2", 2)


def test_transaction_is_all_or_nothing(store):
    store.put("x", b"old")
    with pytest.raises(VersionConflict), store.transaction() as txn:
        txn.put("y", b"new")
        txn.put("x", b"new", expected_version=99)
    assert store.get("x") == (b"old", 1)
    assert store.list("y") == []


def test_value_over_limit_is_refused(store):
    with pytest.raises(ValueTooLarge, match="1025 bytes.*limit of 1024"):
        store.put("big", b"\0" * 1025)
    assert store.list("big") == []


def test_racing_writers_exactly_one_wins(store):
    store.put("slice", b"v1")
    results: list[str] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            store.put("slice", f"w{i}".encode(), expected_version=1)
            results.append(f"w{i}")
        except VersionConflict:
            results.append("lost")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r != "lost"]
    assert len(winners) == 1
    assert store.get("slice") == (winners[0].encode(), 2)


@pytest.fixture
def large(tmp_path):
    s = KeyValueStore(tmp_path / "large", kv_bytes_max=1 << 20)
    yield s
    s.close()


def test_a_buffer_read_in_place_keeps_its_snapshot_and_its_bytes(large):
    """Values read through a snapshot are LMDB's pages themselves: a writer that deletes and
    rewrites the key while a buffer is still referenced must not change what it holds."""
    store = large
    store.put("a", b"x" * 300_000)
    snapshot = store.snapshot()
    (buffer,) = snapshot.ranges([("a", 10, 200_010)])
    view = memoryview(buffer)
    del snapshot, buffer
    gc.collect()
    for i in range(20):  # pages freed by these writes would be reused without the snapshot
        store.delete("a")
        store.put("a", bytes([i]) * 300_000)
    assert bytes(view) == b"x" * 200_000
    assert store.get("a")[0] == bytes([19]) * 300_000


def test_snapshots_end_with_their_buffers_and_leave_slots_for_plain_reads(store):
    store.put("a", b"y" * 1000)
    for _ in range(2 * READERS_MAX):  # each ends when its buffer goes: slots never run out
        (buffer,) = store.snapshot().ranges([("a", 0, 1000)])
        assert buffer.to_pybytes() == b"y" * 1000
    assert store.open_snapshots() == 1  # the last buffer's
    del buffer
    assert store.open_snapshots() == 0
    held = [store.snapshot() for _ in range(SNAPSHOTS_MAX + 10)]
    assert held[SNAPSHOTS_MAX - 1] is not None and held[SNAPSHOTS_MAX] is None
    assert store.get_ranges([("a", 0, 4)]) == [b"yyyy"]  # read with a copy, in a slot kept
    del held
    gc.collect()
    assert store.open_snapshots() == 0 and store.snapshot() is not None


def test_a_range_past_a_values_end_comes_back_short(store):
    store.put("a", b"z" * 100)
    (buffer,) = store.snapshot().ranges([("a", 90, 200)])
    assert buffer.to_pybytes() == b"z" * 10


def test_the_map_is_read_ahead(store):
    """Slices are megabytes read whole through the map: the kernel must read ahead of the
    faults (LMDB's default MADV_RANDOM made a cold scan read 4 KB at a time)."""
    assert store._env.flags()["readahead"] is True
