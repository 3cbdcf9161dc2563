"""Repair: a device gone for good, its partitions copied back to their replica count from the
survivors, the data intact; from Python and from the command line."""

from __future__ import annotations

import json
import os
import signal
import stat

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
    _quarry("up", "--devices", "3", "--detach", "--host-profile", "host", cwd=tmp_path)
    file = tmp_path / ".quarry" / "cluster.json"
    try:
        before = json.loads(file.read_text())
        _quarry("ingest", str(path), "--dataset", "physics/p", "--replicas", "2", cwd=tmp_path)
        assert "every partition is at its replica count" in _quarry("status", cwd=tmp_path).stdout
        rows = json.loads(_quarry("status", "--json", cwd=tmp_path).stdout)
        dev1 = next(r for r in rows if r["device"] == "dev1")
        os.kill(dev1["pid"], signal.SIGKILL)
        shown = _quarry("status", cwd=tmp_path).stdout
        assert "under-replicated" in shown and "1 of 2 replicas" in shown
        _quarry("device", "restart", "dev1", cwd=tmp_path)
        assert "every partition is at its replica count" in _quarry("status", cwd=tmp_path).stdout
        _restart_edits_only_its_entry(before, json.loads(file.read_text()), "dev1")
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        dev2 = next(r for r in rows if r["device"] == "dev2")
        os.kill(dev2["pid"], signal.SIGKILL)
        restarted = json.loads(file.read_text())
        _quarry("device", "remove", "dev2", cwd=tmp_path)
        removed = json.loads(file.read_text())
        assert removed == {**restarted, "devices": restarted["devices"][:2]}
        unknown = _quarry("device", "remove", "dev9", cwd=tmp_path, check=False)
        assert unknown.returncode == 2 and "no device 'dev9'" in unknown.stderr
        repaired = _quarry("repair", "--json", cwd=tmp_path).stdout
        assert json.loads(repaired)["copied"]
        assert "every partition is at its replica count" in _quarry("status", cwd=tmp_path).stdout
        with quarry.connect(tmp_path / ".quarry" / "cluster.json") as cluster:
            assert sorted(cluster.devices) == ["dev0", "dev1"]
            back = cluster.scan("physics/p").read_all().sort_by("id")
        assert back.equals(pq.read_table(path).sort_by("id"))
    finally:
        _quarry("down", cwd=tmp_path)


def _restart_edits_only_its_entry(before: dict, after: dict, name: str) -> None:
    """`quarry device restart`: the device's entry has its new process, on the same address;
    every other entry and the host's profile are as they were."""
    assert after["host"] == before["host"] == {"profile": "host", "profiles_file": None}
    old = {d["name"]: d for d in before["devices"]}
    new = {d["name"]: d for d in after["devices"]}
    assert list(new) == list(old)
    assert new[name]["pid"] != old[name]["pid"]
    assert {**new[name], "pid": old[name]["pid"]} == old[name]
    assert {n: d for n, d in new.items() if n != name} == {
        n: d for n, d in old.items() if n != name
    }
