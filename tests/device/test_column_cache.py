"""The device's cache of decoded columns: a column read again comes from memory, never for other
bytes than it holds, within its bound."""

from __future__ import annotations

import pyarrow as pa
import pytest

import quarry
from quarry import machine
from quarry.device.column_cache import ColumnCache, ColumnKey
from quarry.device.profile import BUILTIN


def _key(number: int, checksum: int = 1) -> ColumnKey:
    return ColumnKey("d/t", 0, number, 0, checksum)


def test_entries_come_back_as_copies_and_the_least_recently_used_go_first() -> None:
    column = pa.array(range(1000), pa.int64())  # 8,000 bytes
    cache = ColumnCache(capacity_bytes=8 * 8_000)  # eight of them: one takes at most an eighth
    for number in range(8):
        cache.put([_key(number)], [column])
    (kept,) = cache.get([_key(0)])  # 0 is now the most recent
    assert kept.equals(column) and kept.buffers()[1].address != column.buffers()[1].address
    cache.put([_key(8)], [column])
    assert cache.bytes_held <= cache.capacity_bytes
    assert cache.get([_key(1)]) is None  # the least recently used went
    assert cache.get([_key(0)]) is not None and cache.get([_key(8)]) is not None
    assert cache.get([_key(0), _key(9)]) is None  # all of them or none
    assert cache.get([_key(0, checksum=2)]) is None  # other bytes: another entry


def test_no_room_keeps_nothing() -> None:
    column = pa.array(range(1000), pa.int64())
    ColumnCache(0).put([_key(0)], [column])
    small = ColumnCache(capacity_bytes=8_000)  # a column over an eighth of it is not kept
    small.put([_key(0)], [column])
    assert small.get([_key(0)]) is None and small.bytes_held == 0


def test_a_run_of_slices_comes_back_joined_without_a_copy_and_runs_apart_as_pieces() -> None:
    """A chunk's slices enter as a run: read again, each column of the run is one array, a
    view of the run's buffer; slices kept in two runs come back as two pieces; a slice
    missing, and none."""
    pieces = [pa.array(range(n * 100, n * 100 + 100), pa.int64()) for n in range(6)]
    keys = [[ColumnKey("d/t", 0, n, 0, 1), ColumnKey("d/t", 0, n, 1, 1)] for n in range(6)]
    cache = ColumnCache(capacity_bytes=1 << 20)
    cache.put_run([(k, [p, p]) for k, p in zip(keys[:4], pieces, strict=False)])
    (joined,) = cache.get_runs(keys[:4])  # type: ignore[misc]
    assert len(joined) == 2
    assert joined[0].equals(pa.concat_arrays(pieces[:4])) and joined[1].equals(joined[0])
    (one,) = cache.get([keys[1][0]])
    assert one.equals(pieces[1])  # a slice alone as ever
    assert joined[0].buffers()[1].address == one.buffers()[1].address  # the same buffer
    assert len(cache.get_runs(keys[1:3]) or []) == 1  # any stretch of the run
    cache.put(keys[4], [pieces[4], pieces[4]])  # a run of its own
    apart = cache.get_runs(keys[3:5])  # two runs: two pieces, in order
    assert apart is not None and [len(piece[0]) for piece in apart] == [100, 100]
    assert pa.concat_arrays([piece[0] for piece in apart]).equals(pa.concat_arrays(pieces[3:5]))
    assert cache.get_runs(keys[4:6]) is None  # one missing: none
    assert cache.bytes_held == 5 * 2 * 800


def test_a_run_larger_than_an_eighth_enters_in_runs_that_are_not() -> None:
    pieces = [pa.array(range(100), pa.int64()) for _ in range(10)]  # 800 bytes each
    keys = [[ColumnKey("d/t", 0, n, 0, 1)] for n in range(10)]
    cache = ColumnCache(capacity_bytes=8 * 2_400)  # a run holds at most three
    cache.put_run([(k, [p]) for k, p in zip(keys, pieces, strict=True)])
    assert all(cache.get(k) is not None for k in keys[-2:])
    assert len(cache.get_runs(keys[:3]) or []) == 1
    assert len(cache.get_runs(keys[:4]) or []) == 2


def test_an_emulated_drive_keeps_no_cache_and_the_host_its_setting() -> None:
    assert BUILTIN["kinetic"].cache_bytes(256 << 20) == 0
    assert BUILTIN["scaleflux"].cache_bytes(256 << 20) == 0
    assert BUILTIN["host"].cache_bytes(256 << 20) == 256 << 20
    assert BUILTIN["host"].cache_bytes(None) == machine.memory_bytes() // 8  # unset: the machine's


def test_a_machine_short_of_memory_stops_the_cache_growing() -> None:
    """Every device on a machine sizes its cache from the machine's memory, so none may take
    what the machine no longer has: while too little is to spare, a run enters only in place
    of older entries, and once memory is back the cache grows again."""
    spare = {"bytes": 1 << 30}
    cache = ColumnCache(
        capacity_bytes=1 << 20, spare_bytes=lambda: spare["bytes"], spare_bytes_min=1 << 28
    )
    column = pa.array(range(1000), pa.int64())  # 8,000 bytes
    cache.put([_key(0)], [column])
    spare["bytes"] = 1 << 20  # short now
    cache.put([_key(1)], [column])
    assert cache.bytes_held == 8_000  # did not grow: the newer replaced the older
    assert cache.get([_key(0)]) is None and cache.get([_key(1)]) is not None
    spare["bytes"] = 1 << 30
    cache.put([_key(2)], [column])
    assert cache.bytes_held == 16_000 and cache.get([_key(1)]) is not None
    unknown = ColumnCache(1 << 20, spare_bytes=lambda: None, spare_bytes_min=1 << 28)
    unknown.put([_key(0)], [column])  # a system that does not say: the bound alone
    assert unknown.bytes_held == 8_000


@pytest.fixture(scope="module")
def one_device():
    with quarry.local(devices=1) as cluster:
        yield cluster


def _read(cluster, sql: str) -> tuple[list, int, int]:
    planned = cluster.query(sql, pushdown="always")
    rows = planned.execute().read_all().to_pylist()
    devices = planned.explain(analyze=True).analyze.devices
    read = sum(d.counters.bytes_read for d in devices)
    return rows, read, sum(d.counters.bytes_cached for d in devices)


def test_a_column_read_again_comes_from_memory_and_a_rewrite_is_never_answered_from_it(
    one_device,
) -> None:
    cluster = one_device
    table = pa.table({"k": pa.array(range(200_000), pa.int64()), "v": [1.0] * 200_000})
    cluster.ingest(table, "cache/t")
    sql = "SELECT count(*) AS n, sum(v) AS s FROM cache.t WHERE k % 7 = 0"
    first, read, cached = _read(cluster, sql)
    again, read_again, cached_again = _read(cluster, sql)
    assert first == again == [{"n": 28_572, "s": 28_572.0}]
    assert cached == 0 and read_again == read and cached_again == read  # all of it from memory
    # the same dataset written again with other values: never the old columns
    cluster.drop("cache/t")
    cluster.ingest(table.set_column(1, "v", pa.array([2.0] * 200_000)), "cache/t")
    rewritten, _, cached_after = _read(cluster, sql)
    assert rewritten == [{"n": 28_572, "s": 57_144.0}] and cached_after == 0
    cluster.ingest(table.slice(0, 7), "cache/t", mode="append")  # one more row with k % 7 == 0
    appended, _, _ = _read(cluster, sql)
    assert appended == [{"n": 28_573, "s": 57_145.0}]


def test_a_scan_larger_than_half_the_cache_does_not_enter_it(monkeypatch) -> None:
    """Such a scan would push out what fits and copy every column on its way in for nothing;
    a small read still enters."""
    monkeypatch.setenv("QUARRY_DEVICE_CACHE_MIB", "1")
    large = pa.table({"k": pa.array(range(200_000), pa.int64()), "v": [1.0] * 200_000})  # 3.2 MB
    small = large.slice(0, 5_000)  # 80 kB: under an eighth of the cache
    with quarry.local(devices=1) as cluster:
        cluster.ingest(large, "cache/large")
        cluster.ingest(small, "cache/small")
        for name, enters in (("large", False), ("small", True)):
            sql = f"SELECT sum(v) AS s FROM cache.{name} WHERE k % 7 = 0"
            first, _, _ = _read(cluster, sql)
            again, read, cached = _read(cluster, sql)
            assert first == again
            assert cached == (read if enters else 0), name
