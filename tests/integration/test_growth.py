"""Growing and draining a cluster online: a fifth device takes about a fifth of the replicas while
queries run and every partition stays on at least its replica count, checked continuously by
another coordinator reading the devices; a device drained then removed leaves nothing to repair;
replicas of a partition never share a host while enough hosts exist."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import quarry
from quarry.auth.credentials import Credentials
from quarry.auth.credentials import create as create_credentials
from quarry.auth.enrollment import enroll
from quarry.coordinator.membership.membership import Membership
from quarry.errors import QuarryError
from quarry.samples import particles
from tests.commands import run_quarry

DATASETS = 4
PARTITIONS = 10  # each: 40 partitions, 80 replicas
ROWS = 160_000  # per dataset: 6.4 MB, 0.64 MB a partition
QUERIES = 50
BANDWIDTH_BYTES_PER_S = 4e5  # slow enough (25 s) that the queries all run while partitions move
QUERY_SHAPES = (
    "SELECT count(*) AS n, sum(ke) AS s FROM {t} WHERE ke > 5",
    "SELECT (id % 7) AS g, count(*) AS n, sum(y) AS s FROM {t} GROUP BY g ORDER BY g",
    "SELECT min(x) AS lo, max(x) AS hi, avg(ke) AS m FROM {t}",
)


class ReplicaChecker(threading.Thread):
    """Another coordinator reading the catalog from the devices, again and again: every sample
    read whole (each device's generation the same after the read as during it) must list every
    dataset with every partition on at least its replica count."""

    def __init__(self, specs, expected: dict[str, int]):
        super().__init__(name="replica-checker", daemon=True)
        self.membership = Membership(specs)
        self.expected = expected  # dataset -> partitions
        self.samples = 0
        self.violations: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.membership.refresh()
            state = self.membership.state
            try:
                pulses = {n: c.pulse().generation for n, c in self.membership.devices.items()}
            except QuarryError as error:
                self.violations.append(f"a device stopped answering: {error}")
                return
            if state.down or any(not state.generations.get(n) for n in pulses):
                continue
            if any(state.generations[n] != g for n, g in pulses.items()):
                continue  # something committed while it read: not one moment of the cluster
            self.samples += 1
            self.violations.extend(_short(state.catalog, self.expected))

    def stop(self) -> None:
        if not self.stopping.is_set():
            self.stopping.set()
            self.join(timeout=60)
            self.membership.close()


def _short(catalog, expected: dict[str, int]) -> list[str]:
    found = []
    for name, partitions in expected.items():
        entry = catalog.get(name)
        if entry is None or entry.unavailable:
            found.append(f"{name} not listed whole")
            continue
        replicas = entry.ingests[0].replicas
        held = {p.partition: len(p.devices) for p in entry.partitions}
        if sorted(held) != list(range(partitions)) or min(held.values()) < replicas:
            found.append(f"{name}: {held}")
    return found


class Queries(threading.Thread):
    """``QUERIES`` queries, one after another, each checked against DuckDB on the same rows."""

    def __init__(self, cluster, tables: dict[str, pa.Table]):
        super().__init__(name="queries", daemon=True)
        self.cluster = cluster
        self.tables = tables
        self.wrong: list[str] = []
        self.times: list[tuple[float, float]] = []

    def run(self) -> None:
        rng = random.Random(3)
        for _ in range(QUERIES):
            name = rng.choice(sorted(self.tables))
            shape = rng.choice(QUERY_SHAPES)
            started = time.monotonic()
            try:
                got = self.cluster.sql(shape.format(t=name.replace("/", "."))).read_all()
            except QuarryError as error:
                self.wrong.append(f"{name}: {error}")
                continue
            finally:
                self.times.append((started, time.monotonic()))
            rows = self.tables[name]  # noqa: F841 - DuckDB reads it by name
            expected = duckdb.sql(shape.format(t="rows")).fetch_arrow_table()
            if not _close(got, expected):
                self.wrong.append(f"{name}: {got.to_pylist()} != {expected.to_pylist()}")


def _close(got: pa.Table, expected: pa.Table) -> bool:
    if got.num_rows != expected.num_rows:
        return False
    for a, b in zip(got.to_pylist(), expected.to_pylist(), strict=True):
        for x, y in zip(a.values(), b.values(), strict=True):
            if x != pytest.approx(y, rel=1e-9):
                return False
    return True


@pytest.mark.slow
def test_a_fifth_device_takes_a_fifth_online_and_a_drained_one_leaves_no_repair():
    tables = {f"physics/p{k}": particles.table(ROWS, seed=20 + k) for k in range(DATASETS)}
    with quarry.local(devices=4) as cluster:
        for name, table in tables.items():
            cluster.ingest(table, name, replicas=2, partitions=PARTITIONS)
        cluster.start_device("dev4")
        checker = ReplicaChecker(cluster.specs, dict.fromkeys(tables, PARTITIONS))
        checker.start()
        try:
            _grow_and_drain(cluster, tables, checker)
        finally:
            checker.stop()


def _grow_and_drain(cluster, tables: dict[str, pa.Table], checker: ReplicaChecker) -> None:
    queries = Queries(cluster, tables)
    started = time.monotonic()
    queries.start()
    report = cluster.rebalance(BANDWIDTH_BYTES_PER_S)
    ended = time.monotonic()
    queries.join(timeout=300)
    during = sum(1 for s, e in queries.times if s >= started and e <= ended)
    print(
        f"a fifth device: {report.moved_fraction:.3f} of {report.replicas} replicas moved "
        f"(ideal 0.200), {report.bytes_copied / 1e6:.1f} MB in {report.seconds:.1f} s; "
        f"{during} queries during the move; {checker.samples} whole catalog samples"
    )
    assert report.failed == []
    assert {m.target for m in report.moved} == {"dev4"}  # nothing else moved
    assert abs(report.moved_fraction - 0.2) <= 0.03
    assert queries.wrong == [] and len(queries.times) == QUERIES
    assert during == QUERIES, f"only {during} queries ran while partitions moved"
    assert cluster.rebalance(dry_run=True).planned == []  # a fixed point

    held = sum(
        1 for entry in cluster.catalog.values() for p in entry.partitions if "dev2" in p.devices
    )
    drained = cluster.drain("dev2", BANDWIDTH_BYTES_PER_S * 10)
    checker.stop()
    print(f"draining dev2: {len(drained.moved)} replica(s) moved for its {held}")
    assert checker.violations == [] and checker.samples >= 20
    assert drained.failed == []
    assert sum(1 for m in drained.moved if m.source == "dev2") == held
    assert len(drained.moved) <= held * 1.25
    assert cluster.deficits() == []
    cluster.remove_device("dev2")
    assert cluster.deficits() == []  # no repair needed
    for name, table in tables.items():
        entry = cluster.entry(name)
        assert all(len(p.devices) == 2 and "dev2" not in p.devices for p in entry.partitions)
        back = cluster.scan(name).read_all().sort_by("id")
        assert back.equals(table.sort_by("id"))


@pytest.mark.slow
def test_replicas_never_share_a_host_while_enough_exist_and_one_host_is_said():
    table = particles.table(20_000, seed=4)
    with quarry.local(devices=6, hosts=3) as cluster:
        entry = cluster.ingest(table, "physics/p", replicas=2, partitions=12)
        assert entry.warnings == ()
        hosts = {row.device: row.host for row in cluster.status()}
        assert sorted(set(hosts.values())) == ["host0", "host1", "host2"]
        for p in entry.partitions:
            assert len({hosts[d] for d in p.devices}) == 2, p
        assert cluster.placement_warnings() == []
        cluster.kill_device("dev0")  # host0 keeps dev3: repair copies apart from survivors
        assert cluster.repair().failed == [] and cluster.deficits() == []
        for p in cluster.entry("physics/p").partitions:
            assert len(p.devices) == 2 and len({hosts[d] for d in p.devices}) == 2, p
    with quarry.local(devices=2) as cluster:
        entry = cluster.ingest(table, "physics/p", replicas=2)
        assert entry.warnings == ("replicas 2 but only 1 host: partitions share a host",)
        (shared,) = cluster.placement_warnings()
        assert shared.message() == "replicas 2 but only 1 host: partitions share a host"


def _serve(
    folder: Path, name: str, credentials: Path, host_label: str, tls: bool = False
) -> tuple[str, int]:
    """A device started by hand, outside the cluster (as on another machine), with a folder
    the authority in ``credentials`` enrolled it with: its address and pid."""
    ready = folder / "ready.json"
    folder.mkdir(parents=True)
    enrolled = enroll(Credentials(credentials), name, ("127.0.0.1",), folder / "enrolled")
    command = [sys.executable, "-m", "quarry", "device", "serve", "--data", str(folder)]
    command += ["--name", name, "--credentials", str(enrolled.folder), "--ready-file", str(ready)]
    command += ["--host-label", host_label, *(["--tls"] if tls else [])]
    with open(folder / "device.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the device did not start"
        time.sleep(0.05)
    return json.loads(ready.read_text())["address"], process.pid


@pytest.mark.slow
def test_add_drain_and_remove_from_the_command_line(tmp_path):
    path = tmp_path / "particles.parquet"
    pq.write_table(particles.table(100_000, seed=6), path)
    run_quarry("up", "--devices", "4", "--hosts", "2", "--detach", cwd=tmp_path)
    started: list[int] = []
    try:
        ingested = run_quarry(
            "ingest",
            str(path),
            "--dataset",
            "physics/p",
            "--replicas",
            "2",
            "--partitions",
            "12",
            cwd=tmp_path,
        ).stdout
        assert "warning" not in ingested
        shown = run_quarry("status", cwd=tmp_path).stdout
        assert "host0" in shown and "host1" in shown and "warning" not in shown

        stranger = tmp_path / "elsewhere"
        create_credentials(stranger)
        address, pid = _serve(tmp_path / "dev8", "dev8", stranger / "credentials", "host2")
        started.append(pid)
        refused = run_quarry("device", "add", address, cwd=tmp_path, check=False)
        assert refused.returncode != 0 and "refused this cluster's token" in refused.stderr

        credentials = tmp_path / ".quarry" / "credentials"
        address, pid = _serve(tmp_path / "dev4", "dev4", credentials, "host2")
        started.append(pid)
        wrong = run_quarry("device", "add", address, "--name", "devX", cwd=tmp_path, check=False)
        assert wrong.returncode != 0 and "calls itself 'dev4'" in wrong.stderr
        added = json.loads(run_quarry("device", "add", address, "--json", cwd=tmp_path).stdout)
        assert added["device"] == {
            "name": "dev4",
            "address": address,
            "host": "host2",
            "rack": None,
        }
        assert added["failed"] == [] and {m["to"] for m in added["moved"]} == {"dev4"}
        rows = {
            r["device"]: r for r in json.loads(run_quarry("status", "--json", cwd=tmp_path).stdout)
        }
        assert rows["dev4"]["host"] == "host2" and rows["dev4"]["partitions"] > 0
        _apart(tmp_path, rows)

        drained = run_quarry("device", "drain", "dev1", cwd=tmp_path).stdout
        assert "needs no repair" in drained
        assert "(drained)" in run_quarry("status", cwd=tmp_path).stdout
        removed = run_quarry("device", "remove", "dev1", cwd=tmp_path).stdout
        assert "nothing to repair" in removed
        shown = run_quarry("status", cwd=tmp_path).stdout
        assert "every partition is at its replica count" in shown
        assert json.loads(run_quarry("repair", "--dry-run", "--json", cwd=tmp_path).stdout) == []
        rows = {
            r["device"]: r for r in json.loads(run_quarry("status", "--json", cwd=tmp_path).stdout)
        }
        _apart(tmp_path, rows)
        with quarry.connect(tmp_path / ".quarry" / "cluster.json") as cluster:
            back = cluster.scan("physics/p").read_all().sort_by("id")
        assert back.equals(pq.read_table(path).sort_by("id"))
    finally:
        run_quarry("down", cwd=tmp_path, check=False)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _apart(tmp_path: Path, rows: dict) -> None:
    """Every partition of physics/p on two devices of two hosts."""
    described = json.loads(run_quarry("describe", "physics/p", "--json", cwd=tmp_path).stdout)
    for p in described["partitions_detail"]:
        assert len({rows[d]["host"] for d in p["devices"]}) == 2, p


# slices of 64 KiB: a partition's copy streams in several, so it is seen part way
SMALL_SLICES = '[profiles.small]\nfrom = "host"\nkv_bytes_max = 65536\n'
REBALANCE_IN_ITS_OWN_PROCESS = """
import sys
import quarry
with quarry.connect(sys.argv[1]) as cluster:
    cluster.rebalance(float(sys.argv[2]))
"""


@pytest.mark.slow
def test_a_rebalance_killed_mid_move_leaves_every_replica_and_runs_again(tmp_path):
    """The coordinator running a rebalance is killed while a copy streams: every partition is
    still on at least its replica count, `status` showed the move in flight, the copy cut short
    is gone once its lease ran out, an ingest meanwhile is whole, and the rebalance run again
    finishes where placement says."""
    tables = {f"physics/p{k}": particles.table(80_000, seed=30 + k) for k in range(2)}
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(SMALL_SLICES)
    with quarry.local(
        devices=3, profile="small", profiles_file=str(profiles), data=tmp_path / "cluster"
    ) as cluster:
        for name, table in tables.items():
            cluster.ingest(table, name, replicas=2, partitions=6)
        cluster.start_device("dev3", profile="small")
        mover = subprocess.Popen(
            [sys.executable, "-c", REBALANCE_IN_ITS_OWN_PROCESS, str(cluster.cluster_file), "3e5"],
            env={**os.environ, "QUARRY_INGEST_LEASE_S": "2"},
        )
        try:
            in_flight = _copies_seen(cluster, "dev3", deadline_s=60)
            extra = particles.table(10_000, seed=39)
            cluster.ingest(extra, "physics/extra", replicas=2)  # while partitions move
            _copies_seen(cluster, "dev3", deadline_s=60)
        finally:
            mover.kill()  # mid-copy: a copy takes about 1.8 s at 0.3 MB/s
            mover.wait()
        assert in_flight[0].source in {"dev0", "dev1", "dev2"} and in_flight[0].bytes_total
        assert cluster.device("dev3").stats().pending_partitions == 1  # the copy cut short
        assert cluster.deficits() == []
        for entry in cluster.catalog.values():
            assert all(len(p.devices) >= 2 for p in entry.partitions), entry.qualified
        deadline = time.monotonic() + 30
        while cluster.device("dev3").stats().pending_partitions:
            assert time.monotonic() < deadline, "the copy cut short is still pending"
            time.sleep(0.2)
        report = cluster.rebalance(1e7)
        assert report.failed == [] and cluster.rebalance(dry_run=True).planned == []
        assert all(
            len(p.devices) == 2 for entry in cluster.catalog.values() for p in entry.partitions
        )
        for name, table in {**tables, "physics/extra": extra}.items():
            back = cluster.scan(name).read_all().sort_by("id")
            assert back.equals(table.sort_by("id"))


def _copies_seen(cluster, device: str, deadline_s: float) -> list:
    """The copies coming into ``device`` as `quarry status` shows them, once one has rows in."""
    deadline = time.monotonic() + deadline_s
    while True:
        row = next(r for r in cluster.status() if r.device == device)
        if row.stats is not None and any(c.bytes_received for c in row.stats.copies):
            return list(row.stats.copies)
        assert time.monotonic() < deadline, "no move in flight"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_coordinator_that_read_the_catalog_before_a_move_still_reads_every_row(monkeypatch):
    """Another coordinator opened the cluster before a device was added and read the catalog
    before partitions moved, and the devices they left have already let their rows go: its scan
    finds where they went (its cluster file read again), its query is planned again, and
    neither answers short."""
    monkeypatch.setenv("QUARRY_MOVED_KEEP_S", "0")  # the devices let moved rows go at once
    table = particles.table(40_000, seed=41)
    sql = "SELECT count(*) AS n, sum(ke) AS s FROM physics.p"
    with quarry.local(devices=2) as cluster:
        cluster.ingest(table, "physics/p", replicas=1, partitions=8)
        expected = cluster.sql(sql).read_all()
        with quarry.connect(cluster.cluster_file) as stale:
            assert stale.entry("physics/p").partitions  # its catalog, read before the move
            cluster.start_device("dev2")
            assert cluster.rebalance().moved
            time.sleep(2.5)  # the janitors' passes: the moved rows are gone from dev0, dev1
            assert stale.scan("physics/p").read_all().sort_by("id").equals(table.sort_by("id"))
        with quarry.connect(cluster.cluster_file) as stale:
            stale.entry("physics/p")
            cluster.drain("dev2")
            time.sleep(2.5)
            assert stale.sql(sql).read_all().equals(expected)


@pytest.mark.slow
def test_a_dataset_dropped_while_it_moves_can_be_ingested_again(tmp_path):
    """Dropped while its partitions move: the moves of it fail (said in the report), the
    copies that made it leave nothing behind, and the name is free again."""
    table = particles.table(80_000, seed=50)
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(SMALL_SLICES)
    with quarry.local(devices=3, profile="small", profiles_file=str(profiles)) as cluster:
        cluster.ingest(table, "physics/p", replicas=2, partitions=6)
        cluster.start_device("dev3", profile="small")
        reports: list = []
        mover = threading.Thread(target=lambda: reports.append(cluster.rebalance(3e5)))
        mover.start()
        _copies_seen(cluster, "dev3", deadline_s=60)
        cluster.drop("physics/p")
        mover.join(timeout=120)
        (report,) = reports
        assert report.failed and {f.move.dataset for f in report.failed} == {"physics/p"}
        cluster.ingest(table, "physics/p", replicas=2, partitions=6)
        assert cluster.scan("physics/p").read_all().sort_by("id").equals(table.sort_by("id"))
        assert cluster.deficits() == []


@pytest.mark.slow
def test_a_device_joins_over_tls_only_with_a_certificate_of_the_cluster(tmp_path):
    with quarry.local(devices=2, tls=True, data=tmp_path / "cluster") as cluster:
        stranger = tmp_path / "elsewhere"
        create_credentials(stranger)
        pids = []
        try:
            address, pid = _serve(tmp_path / "dev8", "dev8", stranger / "credentials", "h", True)
            pids.append(pid)
            with pytest.raises(QuarryError, match="certificate this cluster's CA signed"):
                cluster.add_device(address)
            credentials = tmp_path / "cluster" / "credentials"
            address, pid = _serve(tmp_path / "dev2", "dev2", credentials, "h2", tls=True)
            pids.append(pid)
            assert address.startswith("grpc+tls://")
            spec = cluster.add_device(address)
            assert (spec.name, spec.host, spec.ca_file is not None) == ("dev2", "h2", True)
            listed = json.loads(cluster.cluster_file.read_text())["devices"]
            assert [d["name"] for d in listed] == ["dev0", "dev1", "dev2"]
            assert cluster.status()[-1].up
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
