"""Repair: a device gone for good, its partitions copied back to their replica count from the
survivors, the data intact; from Python and from the command line."""

from __future__ import annotations

import json
import os
import signal

import pyarrow.parquet as pq
import pytest

import quarry
from quarry.samples import particles
from tests.integration.test_cli import _quarry


@pytest.mark.slow
def test_repair_restores_every_partition_from_the_survivors():
    table = particles.table(300_000, seed=8)
    with quarry.local(devices=4) as cluster:
        cluster.ingest(table, "physics/particles", replicas=2)
        cluster.ingest(table.slice(0, 1000), "physics/small", replicas=3)
        assert cluster.deficits() == []
        cluster.kill_device("dev3")
        short = cluster.deficits()
        assert short and all("dev3" not in d.holders for d in short)
        report = cluster.repair(bandwidth_bytes_per_s=100e6)
        assert len(report.copied) == len(short) and report.failed == []
        assert report.bytes_copied > 0
        assert cluster.deficits() == []
        for name in ("physics/particles", "physics/small"):
            entry = cluster.entry(name)
            wanted = entry.ingests[0].replicas
            assert all(
                len(p.devices) == wanted and "dev3" not in p.devices for p in entry.partitions
            )
        back = cluster.scan("physics/particles").read_all().sort_by("id")
        assert back.equals(table.sort_by("id"))
        # the copies keep the slice boundaries: a query resumed on them counts each row once
        sql = "SELECT count(*) AS n, sum(ke) AS s FROM physics.particles"
        assert cluster.sql(sql).read_all().column("n")[0].as_py() == 300_000
        cluster.restart_device("dev3")  # back: three replicas of some partitions, read once
        assert cluster.scan("physics/particles").read_all().num_rows == 300_000


@pytest.mark.slow
def test_status_remove_repair_and_restart_from_the_command_line(tmp_path):
    path = tmp_path / "particles.parquet"
    pq.write_table(particles.table(200_000, seed=9), path)
    _quarry("up", "--devices", "3", "--detach", cwd=tmp_path)
    try:
        _quarry("ingest", str(path), "--dataset", "physics/p", "--replicas", "2", cwd=tmp_path)
        assert "every partition is at its replica count" in _quarry("status", cwd=tmp_path).stdout
        rows = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
        dev1 = next(r for r in rows if r["device"] == "dev1")
        os.kill(dev1["pid"], signal.SIGKILL)
        shown = _quarry("status", cwd=tmp_path).stdout
        assert "under-replicated" in shown and "1 of 2 replicas" in shown
        _quarry("device", "restart", "dev1", cwd=tmp_path)
        assert "every partition is at its replica count" in _quarry("status", cwd=tmp_path).stdout
        dev2 = next(r for r in rows if r["device"] == "dev2")
        os.kill(dev2["pid"], signal.SIGKILL)
        _quarry("device", "remove", "dev2", cwd=tmp_path)
        repaired = _quarry("repair", "--json", cwd=tmp_path).stdout
        assert json.loads(repaired)["copied"]
        assert "every partition is at its replica count" in _quarry("status", cwd=tmp_path).stdout
        with quarry.connect(tmp_path / ".quarry" / "cluster.json") as cluster:
            assert sorted(cluster.devices) == ["dev0", "dev1"]
            back = cluster.scan("physics/p").read_all().sort_by("id")
        assert back.equals(pq.read_table(path).sort_by("id"))
    finally:
        _quarry("down", cwd=tmp_path)
