"""Devices at their bound of concurrent work answer "busy, retry after N ms"; the coordinator
backs off and every answer is still right."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest

import quarry
from quarry.device.admission import SMALL_BYTES_MAX
from quarry.samples import particles
from quarry.settings import DEVICE_EXCHANGES_MAX

QUERIES = [
    "SELECT count(*) AS n, sum(ke) AS ke FROM physics.particles WHERE ke > {x}",
    "SELECT id % 5 AS g, count(*) AS n FROM physics.particles WHERE ke > {x} GROUP BY 1 ORDER BY 1",
]


@pytest.mark.slow
def test_a_busy_device_slows_callers_down_and_changes_no_answer(monkeypatch):
    table = particles.table(40_000, seed=9)
    # the devices started below take one at a time
    monkeypatch.setenv(DEVICE_EXCHANGES_MAX.name, "1")
    with quarry.local(devices=2, profile="kinetic") as cluster:  # slow drives: long exchanges
        cluster.ingest(table, "physics/particles", partitions=4)

        def run(i: int) -> tuple[str, list]:
            sql = QUERIES[i % 2].format(x=i % 4)
            pushdown = ("always", "auto")[i % 2]
            return sql, cluster.sql(sql, pushdown=pushdown).read_all().to_pylist()

        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(run, range(24)))
        scans = [cluster.scan("physics/particles").read_all().num_rows for _ in range(2)]
        retries = sum(device.busy.retries for device in cluster.devices.values())
        status = cluster.status()  # what `quarry status` shows: the devices' own count
        assert [row.stats.exchanges_max for row in status if row.stats] == [1, 1]
        assert sum(row.stats.refused for row in status if row.stats) >= retries > 0
        planned = cluster.query(QUERIES[0].format(x=1))
        planned.execute().read_all()
        turn = planned.explain(analyze=True).analyze.host_turn  # the host's side
        assert isinstance(turn.long, bool) and turn.waited_s >= 0
        assert cluster.workload.status()["long"] >= 2  # each shape ran long once at least

    con = duckdb.connect()
    con.register("particles", table)
    for sql, answer in answers:
        expected = con.sql(sql.replace("physics.particles", "particles")).fetch_arrow_table()
        assert [row.keys() for row in answer] == [row.keys() for row in expected.to_pylist()]
        for row, want in zip(answer, expected.to_pylist()):
            assert row == pytest.approx(want, rel=1e-9)
    assert scans == [table.num_rows] * 2
    assert retries > 0  # the bound was met, and waited out


def test_a_small_tables_scan_does_not_wait_behind_a_large_one(monkeypatch):
    """A query reads nation beside lineitem: the small read takes the small lane, so a device
    whose slots hold long scans still answers it at once."""
    monkeypatch.setenv(DEVICE_EXCHANGES_MAX.name, "1")
    with quarry.local(devices=1) as cluster:
        cluster.ingest(particles.table(400_000, seed=3), "physics/large", partitions=1)
        cluster.ingest(particles.table(50, seed=4), "physics/small", partitions=1)
        (large,) = cluster.entry("physics/large").partitions
        assert large.bytes_stored > SMALL_BYTES_MAX
        (device,) = cluster.devices.values()
        held = device.scan("physics", "large", 0)  # its slot is held until the stream ends
        assert cluster.status()[0].stats.running == 1
        small = device.scan("physics", "small", 0)
        assert sum(b.num_rows for b in device.batches(small)) == 50
        assert sum(b.num_rows for b in device.batches(held)) == 400_000
        assert cluster.status()[0].stats.refused == 0  # neither waited for the other
