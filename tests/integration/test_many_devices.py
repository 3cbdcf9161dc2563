"""Many drives on one machine (Kinetic Pipe's scale): 16 emulated Kinetic drives start at once,
stay lean while idle, and answer Kinetic Pipe's two queries as DuckDB does in every pushdown
mode."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import quarry
from quarry.samples import particles
from tests.plan.harness import assert_same_rows, duckdb_answer

DEVICES = 16
# A device's own memory (anonymous pages: RssAnon), ~40 MiB idle once a client has reached it.
# Not VmRSS: that counts the shared libraries' pages each process has mapped, shared by all
# sixteen and larger where the files sit whole in the page cache (a fresh install: ~150 MiB
# where an older one shows ~105, the same 40 of its own). Once ~77: the first heartbeat built
# its empty batch from a Python list, and pyarrow imports pandas (~37 MiB) to convert one.
IDLE_ANON_MIB_MAX = 64
START_S_MAX = 30.0


def _own_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("RssAnon:")[1].split()[0]) // 1024


@pytest.fixture(scope="module")
def kinetic_cluster():
    started = time.monotonic()
    with quarry.local(devices=DEVICES, profile="kinetic") as cluster:
        start_s = time.monotonic() - started
        idle = {name: _own_mib(p.pid) for name, p in cluster.processes.items()}
        cluster.ingest(particles.reader(200_000, seed=9), "physics/particles", partitions=DEVICES)
        yield cluster, start_s, idle


def test_sixteen_kinetic_drives_start_at_once_and_stay_lean(kinetic_cluster):
    cluster, start_s, idle = kinetic_cluster
    assert len(idle) == DEVICES
    assert start_s < START_S_MAX, start_s  # started in parallel
    assert max(idle.values()) < IDLE_ANON_MIB_MAX, idle  # no coordinator, no engine until used


@pytest.mark.slow
@pytest.mark.parametrize("select", ["*", "sum(ke) AS ke_sum"])
def test_kinetic_pipes_queries_match_duckdb_in_every_mode(kinetic_cluster, select):
    cluster, _, _ = kinetic_cluster
    x = particles.ke_threshold(0.01)
    sql = f"SELECT {select} FROM particles WHERE ke > {x}"
    expected = duckdb_answer(cluster.scan("physics/particles").read_all(), "particles", sql)
    for mode in ("never", "always", "auto"):
        result = cluster.sql(sql, pushdown=mode).read_all()
        assert_same_rows(result, expected, ordered=False, context=mode)
